"""The coordinator's side of a handshake: TLS, challenge, hello (sealed with the hello key: it proves the token,
or a worker credential, and binds this connection), then the worker registered with its session's channel,
or refused: counted, logged, and told why.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
from typing import Any

from echo2sdk.errors import AuthError, ProtocolError
from echo2sdk.runtime.coordinator.connection import Conn, WriteLimit
from echo2sdk.runtime.coordinator.registry import Registry
from echo2sdk.runtime.coordinator.worker_info import WorkerInfo
from echo2sdk.runtime.coordinator.publications import Publications
from echo2sdk.runtime.protocol.channel import SealedChannel
from echo2sdk.runtime.protocol.messages import MAX_ID, Hello, Refused, parse, shown, to_header
from echo2sdk.runtime.protocol.wire import write_frame
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.admission import Admission, Ticket
from echo2sdk.runtime.trust.tls import Identity, server_context

__all__ = ["Handshake", "MAX_CONNS_PER_CREDENTIAL"]

log = logging.getLogger("echo2sdk.coordinator")

REACH_S = 2.0  # how long a joining worker's relay port gets to accept the coordinator's probe
MAX_CONNS_PER_CREDENTIAL = 4  # live connections one worker credential may hold (a re-join replaces its own)


class Handshake:
    """Authenticates a new connection against the run `token` (or a worker credential derived from it) within
    `timeout_s`; counts the refusals (`refused`, and `refused_revoked`: hellos of revoked names)."""

    def __init__(
        self,
        registry: Registry,
        publications: Publications,
        admission: Admission,
        *,
        token: str,
        identity: Identity | None,
        timeout_s: float,
        write_limit: WriteLimit,
    ):
        self.registry, self.publications, self.admission = registry, publications, admission
        self.token, self.timeout_s, self.write_limit = token, timeout_s, write_limit
        self._tls = server_context(identity) if identity is not None else None
        self.fingerprint = identity.fingerprint if identity is not None else b""
        self.refused = 0
        self.refused_revoked = 0

    async def run(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str, ticket: Ticket
    ) -> Conn | None:
        """The registered connection, or None when the peer was refused or gave no valid hello in time."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._authenticate(reader, writer, address, ticket)
        except TimeoutError:
            self.refused += 1
            self.admission.timed_out()
            log.warning("refused %s: no valid hello within %.0f s", address, self.timeout_s)
            return None

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str, ticket: Ticket
    ) -> Conn | None:
        """TLS, challenge, hello; the registered connection with its session keys, or None when refused."""
        if self._tls is not None:
            await self._start_tls(writer)
        try:
            nonce, header, raw, root = await session.server_hello_roots(reader, writer, self._hello_roots,
                                                                        fingerprint=self.fingerprint)
        except AuthError:
            self.admission.failed(ticket.ip)
            return await self._refuse(writer, f"{address}: wrong token, or an interceptor in between (hello MAC)",
                                      "authentication failed: wrong token, or an interceptor in between")
        except ProtocolError as e:
            self.admission.failed(ticket.ip)
            return await self._refuse(writer, f"{address}: {e}", "authentication failed: malformed hello")
        try:
            hello = parse(header, (Hello,))
        except ProtocolError as e:
            return await self._refuse(writer, f"{address}: {e}", "authentication failed: malformed hello")
        keys = session.derive(root, session.CONTROL, nonce, hello.nonce, self.fingerprint, raw, server=True)
        by_credential = root != session.token_key(self.token)
        if await self._refused(writer, hello, keys, f"{address}: worker {shown(hello.worker_id, 60)}", by_credential):
            return None
        self.admission.authenticated(ticket)
        channel = SealedChannel(reader, writer, keys)
        reachable = hello.relay_port is None or await relay_reachable(address.rpartition(":")[0], hello.relay_port,
                                                                      hello.relay_fingerprint or b"")
        if not reachable:
            log.warning("worker %s: its relay port %s:%d is not reachable from here (behind a NAT or a firewall?): it "
                        "joins as a chain tail, fetching snapshots and serving none", shown(hello.worker_id, 60),
                        address.rpartition(":")[0], hello.relay_port)
        conn = self.registry.register(hello, address, lambda info: self._connect(info, channel),
                                      credential=by_credential, relay_reachable=reachable)
        self.publications.note_installed(conn, hello.version)  # a re-join's: its `installed` report may have been lost
        return conn

    def _connect(self, info: WorkerInfo, channel: SealedChannel) -> Conn:
        return Conn(info, channel, self.write_limit)

    async def _start_tls(self, writer: asyncio.StreamWriter) -> None:
        plain = writer.transport
        try:
            await writer.start_tls(self._tls)
        except AttributeError:  # asyncio 3.11: the peer left during the TLS handshake, and start_tls
            writer._transport = plain  # left the writer without a transport (its __del__ would raise)
            raise ConnectionResetError("closed during the TLS handshake") from None

    async def _refused(
        self, writer: asyncio.StreamWriter, hello: Hello, keys: session.Session, who: str, by_credential: bool
    ) -> bool:
        """Whether a verified hello is refused (told so, sealed: the worker can trust it): a quarantined or
        revoked name, or a credential holding MAX_CONNS_PER_CREDENTIAL connections already."""
        if hello.worker_id in self.registry.quarantined:
            await self._refuse(writer, f"{who} is quarantined",
                               f"worker {hello.worker_id} is quarantined for the rest of the run", keys)
            return True
        self.registry.check_revocations()
        if hello.worker_id in self.registry.revocations:
            self.refused_revoked += 1
            await self._refuse(writer, f"{who} is revoked", f"worker {hello.worker_id} is revoked", keys)
            return True
        if by_credential and self.registry.credential_conns(hello) >= MAX_CONNS_PER_CREDENTIAL:
            await self._refuse(writer, f"{who}: its credential holds {MAX_CONNS_PER_CREDENTIAL} connections",
                               f"credential {hello.worker_id} already holds {MAX_CONNS_PER_CREDENTIAL} "
                               "connections, the most one credential may", keys)
            return True
        return False

    def _hello_roots(self, header: dict[str, Any]) -> list[bytes]:
        """The root keys a hello may be sealed with: K_token, then K_worker(NAME) for the worker id NAME it claims
        (one HMAC), read from the pre-authentication header before its MAC is checked (session.open_hello)."""
        root, name = session.token_key(self.token), header.get("worker_id")
        return [root, session.worker_key(root, name)] if isinstance(name, str) and 0 < len(name) <= MAX_ID else [root]

    async def _refuse(
        self, writer: asyncio.StreamWriter, detail: str, reason: str, keys: session.Session | None = None
    ) -> None:
        """Count and log (`detail`) a refused hello and tell the peer why (`reason`: short); sealed with the
        session `keys` when the hello verified, so that the worker knows the refusal is ours and final."""
        self.refused += 1
        log.warning("refused %s", detail)
        await write_frame(writer, to_header(Refused(reason=reason)), key=keys.send if keys is not None else None)


async def relay_reachable(host: str, port: int, fingerprint: bytes = b"", timeout_s: float = REACH_S) -> bool:
    """Whether a joining worker's relay port answers the coordinator within `timeout_s`: a worker behind a NAT
    that admits no inbound connection cannot serve chunks, so it is planned as a chain's tail (core.broadcast
    planner: a worker without a relay address is a leaf). With the relay's certificate `fingerprint` (a TLS relay)
    the answer counts only when that certificate is presented: another service on the address (a shared IP, a
    proxy in front of the worker) is not taken for the relay, and a worker cannot use the probe to learn which
    other ports are open. A plaintext relay is probed by a TCP connect. The probe sends no application bytes; the
    relay drops it quietly."""
    from echo2sdk.runtime.trust.tls import client_context, peer_fingerprint

    host = host.strip("[]")
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=client_context() if fingerprint else None), timeout_s)
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    seen = peer_fingerprint(writer.get_extra_info("ssl_object")) if fingerprint else b""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (OSError, TimeoutError, ssl.SSLError):
        pass
    return not fingerprint or hmac.compare_digest(seen, fingerprint)
