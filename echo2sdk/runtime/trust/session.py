"""Mutual, connection-bound authentication with the run token, and the per-frame MACs that follow it.

Both ends of a connection (coordinator and worker, or a relay and the child fetching from it) know the
run token; neither ever sends it. The handshake, for a server S and a client C (docs/security.md):

    S -> C  Challenge{nonce_s}                                  plain frame
    C -> S  Hello / Fetch{..., nonce: nonce_c}                  sealed with K_hello
    S -> C  Welcome / the first relay frame                     sealed with the session key S -> C

    K_token   = scrypt(token)                                   once per process: slows offline guessing
    K_hello   = HMAC(K_token, "hello" | purpose | nonce_s | fp)
    K_session = HMAC(K_token, "session" | purpose | nonce_s | nonce_c | fp | SHA-256(hello header))
    K_s2c, K_c2s = HMAC(K_session, "s2c"), HMAC(K_session, "c2s")

`fp` is the SHA-256 of the server's TLS certificate as the client saw it (empty without TLS), so a man in
the middle who terminates TLS with a certificate of its own computes other keys than the server and is
refused: the MAC is bound to this connection. `purpose` ("control" or "relay") keeps the coordinator's
and the relays' handshakes apart. Where the token is written above, any *root key* may stand instead (a
`bytes` secret): a worker credential's key K_worker(NAME) = HMAC(K_token, "echo2-worker" | NAME), or a
snapshot version's relay key K_relay(v) = HMAC(K_token, "echo2-relay" | v) (runtime/trust/worker_keys.py). A
server that takes several roots tries K_token, then the one the hello names (`open_hello`: a bounded
decode before the MAC is checked). A valid hello proves the client knows the token; the server's first
sealed frame proves the server does (it needs K_token and the client's fresh nonce). After that every
frame in each direction carries HMAC-SHA256(K_dir, seq | frame prefix | header), seq counting frames
from 0 per direction: a replayed, reordered, reflected, dropped or spliced frame fails its MAC. Bulk
payloads are not MACed twice: a direct-push snapshot's SHA-256 and a chunk's index are in the MACed
header, and chunk bytes are checked against the signed manifest's BLAKE3 digests.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from echo2sdk.core.records import pack
from echo2sdk.errors import AuthError, ProtocolError
from echo2sdk.runtime.protocol.messages import Challenge, parse, to_header
from echo2sdk.runtime.trust.tls import check_pin, peer_fingerprint
from echo2sdk.runtime.protocol.wire import (
    PREAUTH_MAX_HEADER,
    PREFIX_BYTES,
    SEALED,
    TAG_BYTES,
    check_prefix,
    decode_header,
    encode_frame,
    read_frame,
    read_frame_raw,
    write_frame,
)

__all__ = [
    "FrameKey", "Session", "token_key", "root_key", "worker_key", "relay_key", "hello_key", "derive", "new_nonce",
    "client_handshake", "server_hello_roots", "open_hello", "CONTROL", "RELAY",
]

CONTROL = b"control"  # coordinator <-> worker
RELAY = b"relay"  # relay <-> child
PEER_HANDSHAKE_S = 10.0  # a server of ours (coordinator, relay) gives a connecting peer: TLS, challenge, hello
MAX_ANSWER = 1 << 20  # the server's first frame (a welcome), buffered before its MAC is checked
_SCRYPT = dict(n=1 << 14, r=8, p=1, dklen=32, maxmem=64 << 20)  # ~16 MiB and ~50 ms, once per process


def new_nonce() -> bytes:
    return os.urandom(32)


@lru_cache(maxsize=16)
def token_key(token: str) -> bytes:
    """K_token: the key every handshake MAC derives from (scrypt, so a captured plaintext handshake does not
    make guessing a weak token cheap)."""
    return hashlib.scrypt(token.encode(), salt=b"echo2 token key v1", **_SCRYPT)


def _kdf(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over length-prefixed parts (no two part lists give the same message)."""
    msg = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    return hmac.digest(key, msg, "sha256")


def root_key(secret: str | bytes) -> bytes:
    """The key a handshake derives from: K_token for the run token (a str), a root key itself (bytes)."""
    return secret if isinstance(secret, bytes) else token_key(secret)


def worker_key(root: bytes, name: str) -> bytes:
    """K_worker(NAME) = HMAC(K_token, "echo2-worker" | NAME): worker NAME's credential key. Fast (HMAC):
    the coordinator derives it for every credential hello; the name is bound in, so A's key is not B's."""
    return _kdf(root, b"echo2-worker", name.encode())


def relay_key(root: bytes, version: int) -> bytes:
    """K_relay(v) = HMAC(K_token, "echo2-relay" | v): the root of relay handshakes for snapshot `version`."""
    return _kdf(root, b"echo2-relay", version.to_bytes(8, "big"))


class FrameKey:
    """One direction's MAC key and frame counter. `tag` MACs the next frame sent; `check` the next frame
    received (and counts it only when it verifies)."""

    __slots__ = ("key", "seq")

    def __init__(self, key: bytes):
        self.key, self.seq = key, 0

    def _mac(self, data: bytes | bytearray | memoryview) -> bytes:
        return hmac.digest(self.key, self.seq.to_bytes(8, "big") + bytes(data), "sha256")

    def tag(self, data: bytes | bytearray | memoryview) -> bytes:
        t = self._mac(data)
        self.seq += 1
        return t

    def check(self, data: bytes | bytearray | memoryview, tag: bytes | bytearray | memoryview) -> bool:
        ok = hmac.compare_digest(self._mac(data), bytes(tag))
        if ok:
            self.seq += 1
        return ok


class Session:
    """Both directions of one authenticated connection: `send` seals what we send, `recv` checks what we read."""

    __slots__ = ("send", "recv")

    def __init__(self, send: FrameKey, recv: FrameKey):
        self.send, self.recv = send, recv


def hello_key(token: str | bytes, purpose: bytes, server_nonce: bytes, fingerprint: bytes) -> FrameKey:
    """The key of the client's one hello frame (Hello, Fetch); `token`: the run token or a root key."""
    return FrameKey(_kdf(root_key(token), b"hello", purpose, server_nonce, fingerprint))


def derive(
    token: str | bytes,
    purpose: bytes,
    server_nonce: bytes,
    client_nonce: bytes,
    fingerprint: bytes,
    hello_header: bytes,
    *,
    server: bool,
) -> Session:
    """The session keys after a hello whose header bytes were `hello_header`; `server` picks our side."""
    k = _kdf(root_key(token), b"session", purpose, server_nonce, client_nonce, fingerprint,
             hashlib.sha256(hello_header).digest())
    s2c, c2s = FrameKey(_kdf(k, b"s2c")), FrameKey(_kdf(k, b"c2s"))
    return Session(send=s2c, recv=c2s) if server else Session(send=c2s, recv=s2c)


async def client_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: str | bytes,
    hello: dict[str, Any],
    *,
    purpose: bytes = CONTROL,
    pin: bytes | None = None,
) -> tuple[Session, dict[str, Any], bool]:
    """The client's side over asyncio streams: read the challenge, send the `hello` header (it must carry
    the client's `nonce`) sealed, and return the session keys, the server's answer - its first frame's header:
    a sealed welcome or `refused`, or a plain `refused` - and whether that answer was sealed (a plain refusal
    proves nothing: anyone on the path can send one). AuthError when the server's sealed frame does not verify
    (it does not know the token, or the connection was tampered with) or its certificate is not `pin`."""
    fingerprint = peer_fingerprint(writer.get_extra_info("ssl_object"))
    check_pin(fingerprint, pin, "the server")
    challenge = parse((await read_frame(reader))[0], (Challenge,))
    writer.write(encode_frame(hello, key=hello_key(token, purpose, challenge.nonce, fingerprint)))
    await writer.drain()
    keys = derive(token, purpose, challenge.nonce, hello["nonce"], fingerprint, pack(hello), server=False)
    answer = await read_frame_raw(reader, 0, key=keys.recv, max_header=MAX_ANSWER, plain=("refused",))
    return keys, answer.header, answer.sealed


async def server_hello_roots(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    roots: Callable[[dict[str, Any]], Sequence[bytes]],
    *,
    fingerprint: bytes,
    purpose: bytes = CONTROL,
) -> tuple[bytes, dict[str, Any], bytes, bytes]:
    """The server's side up to the client's hello: send a challenge, read the hello (at most PREAUTH_MAX_HEADER
    bytes) and check that it is sealed with the hello key of one of the root keys `roots(header)` lists, bound to
    our certificate `fingerprint` (b"" without TLS; `open_hello`). Returns (our nonce, the hello's header, its raw
    bytes, the root key it is sealed with): parse it, then `derive(root, ..., raw, server=True)`. AuthError on a
    wrong MAC, ProtocolError on anything else (an unsealed or oversized hello)."""
    nonce = new_nonce()
    await write_frame(writer, to_header(Challenge(nonce=nonce)))
    prefix = await reader.readexactly(PREFIX_BYTES)
    sealed, hlen, _ = check_prefix(prefix, keyed=True, max_header=PREAUTH_MAX_HEADER, max_payload=0)
    body = await reader.readexactly(hlen + (TAG_BYTES if sealed else 0))
    return (nonce, *open_hello(prefix, body, roots, purpose, nonce, fingerprint))


def open_hello(
    prefix: bytes,
    body: bytes,
    roots: Callable[[dict[str, Any]], Sequence[bytes]],
    purpose: bytes,
    server_nonce: bytes,
    fingerprint: bytes,
) -> tuple[dict[str, Any], bytes, bytes]:
    """(header, its raw bytes, the root key that verified) of a hello frame (`body`: tag + header) sealed with
    the hello key of one of the root keys `roots(header)` lists, tried in order (K_token first, then the key
    the header names: a worker credential's by its worker id, a relay key by the fetch's version). The header
    is decoded *before* its MAC is checked - it is at most PREAUTH_MAX_HEADER bytes, decoded under msgpack
    limits - and `roots` must be cheap (HMACs, no KDF). AuthError when no root verifies; ProtocolError on an
    unsealed hello."""
    if bytes(prefix[:4]) != SEALED:
        raise ProtocolError("unsealed frame in place of a hello")
    tag, raw = bytes(body[:TAG_BYTES]), bytes(body[TAG_BYTES:])
    header = decode_header(raw)
    for root in roots(header):
        if hello_key(root, purpose, server_nonce, fingerprint).check(bytes(prefix) + raw, tag):
            return header, raw, root
    raise AuthError("hello MAC does not verify (wrong key, or an interceptor in between)")
