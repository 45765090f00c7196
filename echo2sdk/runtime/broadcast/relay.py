"""The broadcast data path every node runs: a chunk server and a fetcher (paper §4.2, Algorithm 1 line 22).

A node holds snapshots being assembled in pre-allocated buffers. Its **fetcher** pulls a version's chunks
in order from the first node of its upstream list (parent, grandparent, ..., the learner), verifies each
chunk against the signed manifest and only then makes it visible; its **chunk server** streams every
verified chunk to a child the moment it is there (store-and-forward per chunk, so a chain pipelines).
The node's own copy is complete - and handed to the install - without waiting for any child.

Repair: when the parent dies (EOF, reset), stalls (no byte and no keep-alive for ``stall_timeout_s``),
is too slow (a chunk frame not complete within ``stall_timeout_s`` + chunk_bytes / ``min_relay_bps``: a
trickle of bytes each inside the stall timeout would otherwise hold the chain below it; the last node of
the list, the learner, is held to the stall timeout only: there is nothing left to fall back to), sends a
chunk that fails its digest or speaks garbage, the fetcher drops it, records why, and resumes
from its first missing chunk at the next upstream node - the nearest healthy ancestor, finally the
learner. Nothing unverified is ever stored, forwarded or installed.

Threads and blocking sockets rather than asyncio: ``recv_into`` straight into the snapshot buffer (hashing
each piece while it is in cache) and ``sendall`` of buffer slices keep the per-byte work at one copy in,
one hash and one copy out. The buffer of an evicted version is recycled for the next one, so steady-state
publications land in memory that is already paged in.

Bandwidth: optional sender-side token buckets - ``uplink_bps`` shared by all of a node's children and
``per_peer_bps`` per child (the receiver's link) - emulate capped links where namespaces and ``tc`` are
not available; real deployments leave both off.

Trust (docs/security.md): a relay port speaks TLS (its own self-signed certificate; plaintext only when
asked), and a child proves the run token - or the snapshot version's relay key K_relay(v), which the
coordinator hands every worker in its (sealed) welcome and plans, so a node holding a worker credential and
no token relays too - with a hello bound to that certificate (`session`); every later
frame header is MACed, chunk bytes are checked against the signed manifest. The child pins the parent's
certificate fingerprint the coordinator gave it in the (sealed) snapshot plan. Before authentication a
connection gets no thread: `gate.Gate` runs every handshake on one selector thread under one deadline;
at most `max_streams` authenticated children are served at a time.
"""

from __future__ import annotations

import collections
import logging
import mmap
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from echo2sdk.core.broadcast.manifest import Manifest, chunk_hasher
from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.core.records import pack
from echo2sdk.errors import AuthError, ProtocolError
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.admission import Admission, Ticket
from echo2sdk.runtime.trust.gate import Gate
from echo2sdk.runtime.protocol.messages import (
    Challenge,
    Chunk,
    MAX_REPORT,
    Fetch,
    Refused,
    Unavailable,
    Wait,
    clip,
    parse,
    shown,
    to_header,
)
from echo2sdk.runtime.trust.tls import Identity, check_pin, client_context, peer_fingerprint, server_context
from echo2sdk.runtime.protocol.wire import DeadlineExceeded, check_deadline, encode_frame, recv_frame, send_frame

__all__ = ["TokenBucket", "Assembly", "RelayNode", "FetchReport", "Upstream"]

log = logging.getLogger("echo2sdk.broadcast")

SEND_SLICE = 256 << 10
RECV_PIECE = 256 << 10
HASH_BLOCK = 64 << 10  # bytes handed to the hasher at a time, at aligned offsets
MAX_SPARES = 1  # evicted snapshot buffers kept for reuse by the next version
WRITE_SLICE = 4 << 20  # unpaced sends go out in slices of this size, each under the write deadline
MAX_STREAMS = 512  # children served at a time (threads); more get `unavailable` and repair elsewhere
MAX_STREAMS_PER_IP = 64  # of them from one address: one holder of a relay key cannot take them all
KEEP_RELAY_KEYS = 8  # relay keys (newest versions) a node keeps
MIN_RELAY_BPS = 1e6 / 8  # 1 Mbit/s: a parent slower than this on a chunk is repaired around (broadcast.min_relay_mbps)
MAX_WAIT_STALLS = 6  # stall timeouts a parent may send keep-alives without a chunk (its own repair) before it is dropped


class TokenBucket:
    """Thread-safe pacing at `rate` bytes/s with a small burst (virtual scheduling: each send reserves
    its airtime, so concurrent senders share the rate exactly)."""

    def __init__(self, rate: float, burst: int = 64 << 10):
        if not rate > 0:
            raise ValueError(f"token bucket rate must be > 0 bytes/s, got {rate!r}")
        self.rate, self.burst = float(rate), burst
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now - self.burst / self.rate, self._next)
            self._next = start + n / self.rate
            wait = self._next - now - self.burst / self.rate
        if wait > 0:
            time.sleep(wait)


def _snapshot_buffer(n: int) -> mmap.mmap:
    """A private anonymous mapping asking for transparent huge pages. Python's default ``mmap(-1, n)`` is
    shared (shmem), which most kernels never back with huge pages (``shmem_enabled = never``); private
    memory gets them under the usual ``enabled = madvise``, and a first publication into fresh memory
    runs up to 4x faster here (8 hops on loopback: 0.23-0.32 vs 0.07-0.08 GB/s; less when the kernel has
    no free huge pages) because each fault maps 2 MiB, not 4 KiB."""
    buf = mmap.mmap(-1, max(1, n), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):  # no THP on this platform or kernel (EINVAL): 4 KiB pages it is
        pass
    return buf


class Assembly:
    """One snapshot version on one node: a buffer, how many leading chunks are verified, and a condition
    that wakes the chunk-server threads waiting for the next chunk. `users` counts the threads reading or
    writing the buffer; an evicted assembly's buffer is recycled only once that count is back to zero."""

    def __init__(self, manifest: Manifest, data: bytes | memoryview | None = None, spare: mmap.mmap | None = None):
        self.manifest = manifest
        self.own: mmap.mmap | None = None
        if data is None:
            # anonymous mmap, not bytearray: its zero pages are faulted in as chunks land (overlapping the
            # network), where bytearray(n) would touch every page before the first byte is fetched; a spare
            # buffer of an evicted version is already faulted in and skips even that
            self.own = spare if spare is not None else _snapshot_buffer(manifest.total_bytes)
            self.buf: mmap.mmap | memoryview = self.own
            self.ready = 0
        else:
            self.buf, self.ready = memoryview(data), manifest.n_chunks
        self.view = memoryview(self.buf)[: manifest.total_bytes]
        self.failed = False
        self.evicted = False
        self.users = 0
        self.cond = threading.Condition()

    @property
    def complete(self) -> bool:
        return self.ready == self.manifest.n_chunks

    def advance(self) -> None:
        with self.cond:
            self.ready += 1
            self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def wait_for(self, i: int, timeout: float) -> bool:
        """True once chunk i is verified; False on timeout or when this node gave up on the version."""
        with self.cond:
            self.cond.wait_for(lambda: self.ready > i or self.failed, timeout)
            return self.ready > i

    def chunk(self, i: int) -> memoryview:
        a, b = self.manifest.span(i)
        return self.view[a:b]


@dataclass(frozen=True)
class Upstream:
    node_id: str
    host: str
    port: int
    fingerprint: bytes = b""  # its TLS certificate's SHA-256, pinned; b"": plaintext


@dataclass
class FetchReport:
    version: int
    ok: bool = False
    seconds: float = 0.0
    parent: str = ""  # who delivered the last chunk
    served_bps: dict[str, float] = field(default_factory=dict)  # per parent: bytes / link-busy time
    repairs: list[dict[str, Any]] = field(default_factory=list)  # {parent, reason, chunk, repair_s}
    bad_chunks: int = 0

    def to_wire(self) -> dict[str, Any]:
        """As the worker reports it (messages.Received): the first MAX_REPORT repairs and parents' rates."""
        wire = asdict(self)
        wire["repairs"] = wire["repairs"][:MAX_REPORT]
        wire["served_bps"] = dict(list(wire["served_bps"].items())[:MAX_REPORT])
        return wire


def _recv_hashed(sock: socket.socket, view: memoryview, deadline: float | None = None) -> bytes:
    """Fill `view` from `sock` and return its chunk digest, hashing while the bytes are still in the CPU
    cache (hashing the whole chunk afterwards reads it back from memory). The hasher is fed whole
    HASH_BLOCKs only: TCP hands over MSS-sized pieces (~64 KiB - 53 B on loopback), and BLAKE3 updated at
    such odd offsets loses its widest SIMD path (5.8 vs 7.6 GB/s here). DeadlineExceeded past `deadline`."""
    hasher, filled, hashed = chunk_hasher(), 0, 0
    while filled < view.nbytes:
        check_deadline(deadline, view.nbytes - filled)
        n = sock.recv_into(view[filled : filled + RECV_PIECE])
        if n == 0:
            raise EOFError("peer closed the connection")
        filled += n
        upto = filled - filled % HASH_BLOCK
        if upto > hashed:
            hasher.update(view[hashed:upto])
            hashed = upto
    hasher.update(view[hashed:filled])
    return hasher.digest()


class _ParentFailed(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RelayNode:
    """Chunk server + fetcher of one node (the learner's node is the source of every chain)."""

    def __init__(
        self,
        token: str | None,
        *,
        node_id: str = SOURCE,
        host: str = "127.0.0.1",
        port: int = 0,
        uplink_bps: float | None = None,
        per_peer_bps: float | None = None,
        stall_timeout_s: float = 5.0,
        min_relay_bps: float = MIN_RELAY_BPS,
        keep_versions: int = 2,
        tls: bool | Identity = True,
        admission: Admission | None = None,
        handshake_s: float = session.PEER_HANDSHAKE_S,  # a child's TLS, challenge and fetch
        max_streams: int = MAX_STREAMS,
        max_streams_per_ip: int = MAX_STREAMS_PER_IP,
    ):
        """`token`: the run token, or None on a node that knows only the relay keys `add_relay_keys` gives it.
        `tls`: True (a certificate made for this node), an `Identity`, or False (plaintext, opt-in).
        `admission`: caps and the failed-login rate limit of this port (default `Admission()`).
        `min_relay_bps`: the slowest parent the fetcher waits for (see the module's Repair)."""
        self.token, self.node_id = token, node_id
        if token is not None:
            session.token_key(token)  # derive it now, not in the gate thread on the first hello
        self._relay_keys: dict[int, bytes] = {}  # version -> K_relay(version), from the coordinator
        self.uplink = TokenBucket(uplink_bps) if uplink_bps else None
        self.per_peer_bps = per_peer_bps
        self.stall_timeout_s, self.keep_versions = stall_timeout_s, keep_versions
        self.min_relay_bps = min_relay_bps
        self._versions: dict[int, Assembly] = {}
        self._spare: list[mmap.mmap] = []  # buffers of evicted versions, already faulted in
        self._lock = threading.Condition()
        self._closed = False
        self._conns: set[socket.socket] = set()
        identity = (tls if isinstance(tls, Identity) else Identity.generate(f"echo2 relay {node_id}")) if tls else None
        self.fingerprint = identity.fingerprint if identity is not None else b""
        self.max_streams, self.streams = max_streams, 0
        self.max_streams_per_ip, self._ip_streams = max_streams_per_ip, collections.Counter()
        self.served_chunks = 0
        self.refused = 0
        self.fetches = 0  # fetches that authenticated (served, or answered `unavailable`); refused: the others
        self.admission = admission or Admission()
        sock = socket.create_server((host, port), backlog=128)
        self.host, self.port = sock.getsockname()[:2]
        self._gate = Gate(
            sock, tls=server_context(identity) if identity is not None else None, admission=self.admission,
            deadline_s=handshake_s, max_header=4 << 10, challenge=self._challenge, accept=self._accept,
            refuse=self._refuse, name=f"relay-{node_id}",
        )

    # -- the store ---------------------------------------------------------------------------------
    def _add(self, manifest: Manifest, data: bytes | memoryview | None = None) -> Assembly:
        """Store a new version, evicting the oldest beyond `keep_versions`. Evicting first lets the new
        version take over an evicted buffer: snapshots of one run have one size, so in steady state a node
        reuses already-faulted memory instead of paging in a fresh buffer per publication."""
        with self._lock:
            self._versions.pop(manifest.version, None)
            for v in sorted(self._versions)[: max(0, len(self._versions) - self.keep_versions + 1)]:
                old = self._versions.pop(v)
                old.evicted = True
                if not old.complete:
                    old.fail()
                self._recycle(old)
            spare = None
            if data is None:
                fits = [b for b in self._spare if len(b) >= manifest.total_bytes]
                if fits:
                    spare = min(fits, key=len)
                    self._spare.remove(spare)
            asm = self._versions[manifest.version] = Assembly(manifest, data, spare)
            if data is None:
                asm.users = 1  # its fetcher, from the start: see fetch()
            self._lock.notify_all()
        return asm

    def _recycle(self, asm: Assembly) -> None:
        """Under self._lock: keep an evicted buffer nobody reads or writes any more for the next version."""
        if asm.evicted and asm.users == 0 and asm.own is not None and not self._closed:
            self._spare = [*self._spare, asm.own][-MAX_SPARES:]
            asm.own = None

    @contextmanager
    def _using(self, asm: Assembly) -> Iterator[Assembly]:
        """Count a reader or writer of `asm` for as long as the block runs: its buffer is not recycled meanwhile."""
        with self._lock:
            asm.users += 1
        try:
            yield asm
        finally:
            self.release(asm)

    @contextmanager
    def hold(self, version: int) -> Iterator[Assembly | None]:
        """The complete snapshot `version` (or None), kept from being evicted into reuse while held."""
        asm = self.acquire(version)
        try:
            yield asm
        finally:
            if asm is not None:
                self.release(asm)

    def acquire(self, version: int) -> Assembly | None:
        """`hold` for a holder that outlives a block: the complete snapshot `version` (or None), whose buffer
        stays valid - even once a newer version evicts it - until ``release(asm)``."""
        with self._lock:
            asm = self._versions.get(version)
            if asm is None or not asm.complete:
                return None
            asm.users += 1
            return asm

    def release(self, asm: Assembly) -> None:
        """End an `acquire` (or any other counted use of `asm`)."""
        with self._lock:
            asm.users -= 1
            self._recycle(asm)

    def publish(self, manifest: Manifest, data: bytes | memoryview) -> None:
        """Hold a complete snapshot to serve (the learner's side)."""
        self._add(manifest, data)

    def assembly(self, version: int) -> Assembly | None:
        return self._versions.get(version)

    # -- the chunk server --------------------------------------------------------------------------
    def _challenge(self) -> tuple[bytes, bytes]:
        nonce = session.new_nonce()
        return encode_frame(to_header(Challenge(nonce=nonce))), nonce

    def _accept(self, nonce: bytes, prefix: bytes, body: bytes, conn: socket.socket, ticket: Ticket) -> None:
        """Gate thread: verify a child's fetch (sealed with the hello key bound to our certificate), then serve
        it on a thread of its own; raises ProtocolError (AuthError: wrong token) to have it refused."""
        header, raw, root = session.open_hello(prefix, body, self._fetch_roots, session.RELAY, nonce,
                                               self.fingerprint)
        req = parse(header, (Fetch,))
        keys = session.derive(root, session.RELAY, nonce, req.nonce, self.fingerprint, raw, server=True)
        self.admission.authenticated(ticket)
        self.fetches += 1
        with self._lock:
            busy = (self.streams >= self.max_streams or self._ip_streams[ticket.ip] >= self.max_streams_per_ip
                    or self._closed)
            if not busy:
                self.streams += 1
                self._ip_streams[ticket.ip] += 1
        if busy:  # the child repairs at its next upstream node
            conn.settimeout(1.0)
            send_frame(conn, to_header(Unavailable(version=req.version)), key=keys.send)
            raise OSError("relay busy")
        self._conns.add(conn)
        try:
            threading.Thread(target=self._serve, args=(conn, req, keys, ticket), daemon=True,
                             name=f"echo2-relay-{self.node_id}-stream").start()
        except RuntimeError as e:  # out of threads: this child is closed (it repairs elsewhere), the relay goes on
            self._end_stream(ticket.ip)
            self._conns.discard(conn)
            raise OSError(f"cannot start a stream thread: {e}") from None

    # -- relay keys ---------------------------------------------------------------------------------------
    def add_relay_keys(self, keys: Sequence[tuple[int, bytes]]) -> None:
        """Take (version, K_relay(version)) pairs from the coordinator; the newest KEEP_RELAY_KEYS are kept."""
        self._relay_keys.update(keys)
        for v in sorted(self._relay_keys)[:-KEEP_RELAY_KEYS]:
            self._relay_keys.pop(v, None)

    def _fetch_roots(self, header: dict[str, Any]) -> list[bytes]:
        """The root keys a child's fetch may be sealed with: the token's (on a node that has it), then the relay
        key of the version the fetch names (given, or derived from the token). None left: it is refused."""
        roots, version = [], header.get("version")
        if self.token is not None:
            roots.append(session.token_key(self.token))
        if type(version) is int and version >= 0:
            key = self._relay_keys.get(version)
            if key is None and self.token is not None:
                key = session.relay_key(roots[0], version)
            roots += [key] if key is not None else []
        return roots

    def _refuse(self, e: Exception, ip: str) -> bytes:
        self.refused += 1
        self.admission.failed(ip)
        log.warning("relay %s refused a fetch from %s: %s", self.node_id, ip, shown(str(e), 200))
        return encode_frame(to_header(Refused(reason="authentication failed")))

    def _serve(self, conn: socket.socket, req: Fetch, keys: session.Session, ticket: Ticket) -> None:
        try:
            conn.settimeout(max(30.0, 4 * self.stall_timeout_s))  # the write deadline: a child that stops reading
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:  # a child may ask before this node has heard of the version itself
                self._lock.wait_for(lambda: req.version in self._versions or self._closed, self.stall_timeout_s)
                asm = self._versions.get(req.version)
            if asm is None:
                send_frame(conn, to_header(Unavailable(version=req.version)), key=keys.send)
                return
            with self._using(asm):
                self._stream(conn, asm, req.start, keys.send)
        except (OSError, EOFError, ProtocolError) as e:
            log.debug("relay %s: connection ended: %s", self.node_id, e)
        finally:
            self._end_stream(ticket.ip)
            self._conns.discard(conn)
            self.admission.close(ticket)
            conn.close()

    def _end_stream(self, ip: str) -> None:
        with self._lock:
            self.streams -= 1
            self._ip_streams[ip] -= 1
            if self._ip_streams[ip] <= 0:
                del self._ip_streams[ip]

    def _stream(self, conn: socket.socket, asm: Assembly, start: int, key: session.FrameKey) -> None:
        """Send chunks start.. of `asm` to a child, each the moment it is verified here. Headers are sealed;
        the chunk bytes are not MACed again (the child checks them against the signed manifest)."""
        peer = TokenBucket(self.per_peer_bps) if self.per_peer_bps else None
        for i in range(start, asm.manifest.n_chunks):
            while not asm.wait_for(i, self.stall_timeout_s / 3):
                if asm.failed or self._closed:
                    return  # gave up on this version: the child repairs upstream
                send_frame(conn, to_header(Wait()), key=key)  # keep-alive while this node repairs its own feed
            data = asm.chunk(i)
            conn.sendall(encode_frame(to_header(Chunk(i=i)), data, key))  # prefix + tag + header; body below
            self._send_paced(conn, data, peer)
            self.served_chunks += 1

    def _send_paced(self, conn: socket.socket, data: memoryview, peer: TokenBucket | None) -> None:
        """Send a chunk body: in write-deadline-sized slices, paced by the token buckets when set."""
        if self.uplink is None and peer is None:
            for a in range(0, data.nbytes, WRITE_SLICE):
                conn.sendall(data[a : a + WRITE_SLICE])
            return
        for a in range(0, data.nbytes, SEND_SLICE):
            piece = data[a : a + SEND_SLICE]
            if self.uplink is not None:
                self.uplink.take(piece.nbytes)
            if peer is not None:
                peer.take(piece.nbytes)
            conn.sendall(piece)

    # -- the fetcher -------------------------------------------------------------------------------
    def fetch(
        self,
        manifest: Manifest,
        upstream: Sequence[Upstream],
        on_chunk: Callable[[int], None] | None = None,
    ) -> FetchReport:
        """Assemble `manifest`'s snapshot from `upstream` (nearest first). Blocking; run it on a thread.
        The manifest must already be verified. Returns the report; on success ``assembly(v)`` is complete."""
        for old in list(self._versions.values()):  # a newer snapshot supersedes any older one still arriving
            if old.manifest.version < manifest.version and not old.complete:
                old.fail()
        asm = self._add(manifest)  # counts this fetcher as a user already
        try:
            report = self._fetch(asm, upstream, on_chunk)
        finally:
            self.release(asm)
        if not report.ok:
            asm.fail()
        return report

    def _fetch(self, asm: Assembly, upstream: Sequence[Upstream], on_chunk: Callable[[int], None] | None) -> FetchReport:
        manifest = asm.manifest
        report = FetchReport(version=manifest.version)
        t0 = time.monotonic()
        pending_repair: dict[str, Any] | None = None
        last_good = t0
        for k, up in enumerate(upstream):
            busy: list[float] = [0.0, 0.0]  # bytes, seconds spent receiving chunk bodies from this parent
            try:
                for i in self._pull(asm, up, busy, floor=k < len(upstream) - 1):
                    last_good = time.monotonic()
                    if pending_repair is not None:
                        pending_repair["repair_s"] = round(last_good - pending_repair.pop("_t"), 4)
                        pending_repair = None
                    if on_chunk is not None:
                        on_chunk(i)
            except _ParentFailed as e:
                if e.reason == "superseded":
                    break
                if e.reason == "bad_chunk":
                    report.bad_chunks += 1
                log.warning("relay %s: parent %s failed at chunk %d/%d (%s); repairing", self.node_id,
                            up.node_id, asm.ready, manifest.n_chunks, e.reason)
                if pending_repair is not None:  # the previous repair never delivered a chunk
                    pending_repair.pop("_t", None)
                # it travels to the coordinator: its kind only (stalled, unreachable, protocol, ...), never what the
                # parent said or which error the dial met, so that a plan naming any host:port learns no banner
                reason = clip(e.reason.split(":", 1)[0].split(" (", 1)[0])
                pending_repair = {"parent": up.node_id, "reason": reason, "chunk": asm.ready, "_t": last_good}
                report.repairs.append(pending_repair)
                continue
            finally:
                if busy[1] > 0:
                    report.served_bps[up.node_id] = busy[0] / busy[1]
            report.ok, report.parent = True, up.node_id
            break
        if pending_repair is not None:
            pending_repair.pop("_t", None)
        report.seconds = time.monotonic() - t0
        return report

    def _pull(self, asm: Assembly, up: Upstream, busy: list[float], floor: bool = True):
        """Yield the index of each chunk verified from `up`; raise _ParentFailed on any fault. `floor`: hold `up`
        to min_relay_bps (every parent but the last resort)."""
        m = asm.manifest
        allowance = self.stall_timeout_s + m.chunk_bytes / self.min_relay_bps  # per frame, chunk bytes included
        waits_for = max(MAX_WAIT_STALLS * self.stall_timeout_s, allowance)  # a parent at the floor rate gets its chunk
        sock = self._dial(up)
        try:
            keys = self._hello(sock, up, m.version, asm.ready, time.monotonic() + allowance if floor else None)
            last_chunk = time.monotonic()
            while asm.ready < m.n_chunks:
                if asm.failed:
                    raise _ParentFailed("superseded")
                deadline = time.monotonic() + allowance if floor else None
                header, plen = recv_frame(sock, m.chunk_bytes, key=keys.recv, plain=("refused",), deadline=deadline)
                msg = parse(header, (Chunk, Wait, Unavailable, Refused))
                if isinstance(msg, Wait):  # its own repair takes a few stall timeouts; keep-alives alone are a stall
                    if time.monotonic() - last_chunk > waits_for:
                        raise _ParentFailed(f"stalled (keep-alives only for {waits_for:.0f} s)")
                    continue
                if not isinstance(msg, Chunk):
                    raise _ParentFailed(msg.type)  # unavailable, refused
                i, (a, b) = msg.i, m.span(asm.ready)
                if i != asm.ready or plen != b - a:
                    raise ProtocolError(f"chunk {i!r} of {plen} bytes, expected chunk {asm.ready} of {b - a}")
                t = time.monotonic()
                digest = _recv_hashed(sock, asm.view[a:b], deadline)
                busy[0] += b - a
                busy[1] += time.monotonic() - t
                if digest != m.chunks[i]:
                    raise _ParentFailed("bad_chunk")
                asm.advance()
                last_chunk = time.monotonic()
                yield i
        except DeadlineExceeded:
            raise _ParentFailed(f"too slow (a chunk under {self.min_relay_bps * 8 / 1e6:g} Mbit/s)") from None
        except TimeoutError:
            raise _ParentFailed("stalled") from None
        except AuthError as e:
            raise _ParentFailed(f"authentication: {e}") from None
        except (EOFError, ConnectionError) as e:
            raise _ParentFailed(f"connection lost ({e.__class__.__name__})") from None
        except (OSError, ProtocolError) as e:
            raise _ParentFailed(f"protocol: {e}") from None
        finally:
            sock.close()

    def _dial(self, up: Upstream) -> socket.socket:
        """Connect to `up` (TLS when the plan gave its fingerprint, which must then match)."""
        try:
            sock = socket.create_connection((up.host, up.port), timeout=self.stall_timeout_s)
        except OSError as e:
            raise _ParentFailed(f"unreachable ({e.__class__.__name__})") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            if up.fingerprint:
                sock = client_context().wrap_socket(sock)
                check_pin(peer_fingerprint(sock), up.fingerprint, f"relay {up.node_id!r}")
        except TimeoutError:
            sock.close()
            raise _ParentFailed("stalled") from None
        except (OSError, AuthError) as e:  # ssl.SSLError is an OSError
            sock.close()
            why = str(e) if isinstance(e, AuthError) else f"TLS ({type(e).__name__}: {getattr(e, 'reason', None) or e})"
            raise _ParentFailed(f"authentication: {why}") from None
        return sock

    def _hello(
        self, sock: socket.socket, up: Upstream, version: int, start: int, deadline: float | None
    ) -> session.Session:
        """Answer the parent's challenge with a sealed fetch; the session keys (the parent proves the token with
        its first sealed frame)."""
        root: str | bytes | None = self._relay_keys.get(version, self.token)  # the version's relay key first
        if root is None:
            raise AuthError(f"no relay key for version {version}")
        challenge = parse(recv_frame(sock, 0, deadline=deadline)[0], (Challenge,))
        fetch = Fetch(node_id=self.node_id, nonce=session.new_nonce(), version=version, start=start)
        header = to_header(fetch)
        sock.sendall(encode_frame(header, key=session.hello_key(root, session.RELAY, challenge.nonce, up.fingerprint)))
        return session.derive(root, session.RELAY, challenge.nonce, fetch.nonce, up.fingerprint, pack(header),
                              server=False)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._lock.notify_all()
        for asm in list(self._versions.values()):
            asm.fail()
        self._spare.clear()
        self._gate.close()
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
