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
and the relays' handshakes apart. A valid hello proves the client knows the token; the server's first
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
from functools import lru_cache
from typing import Any

from echo2sdk.core.records import pack
from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.messages import Challenge, parse, shown, to_header
from echo2sdk.runtime.tls import check_pin, peer_fingerprint
from echo2sdk.runtime.wire import Frame, encode_frame, read_frame, read_frame_raw, write_frame

__all__ = [
    "FrameKey", "Session", "token_key", "hello_key", "derive", "new_nonce", "client_handshake", "server_hello",
    "CONTROL", "RELAY",
]

CONTROL = b"control"  # coordinator <-> worker
RELAY = b"relay"  # relay <-> child
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


def hello_key(token: str, purpose: bytes, server_nonce: bytes, fingerprint: bytes) -> FrameKey:
    """The key of the client's one hello frame (Hello, Fetch)."""
    return FrameKey(_kdf(token_key(token), b"hello", purpose, server_nonce, fingerprint))


def derive(
    token: str,
    purpose: bytes,
    server_nonce: bytes,
    client_nonce: bytes,
    fingerprint: bytes,
    hello_header: bytes,
    *,
    server: bool,
) -> Session:
    """The session keys after a hello whose header bytes were `hello_header`; `server` picks our side."""
    k = _kdf(token_key(token), b"session", purpose, server_nonce, client_nonce, fingerprint,
             hashlib.sha256(hello_header).digest())
    s2c, c2s = FrameKey(_kdf(k, b"s2c")), FrameKey(_kdf(k, b"c2s"))
    return Session(send=s2c, recv=c2s) if server else Session(send=c2s, recv=s2c)


async def client_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: str,
    hello: dict[str, Any],
    *,
    purpose: bytes = CONTROL,
    pin: bytes | None = None,
) -> tuple[Session, dict[str, Any]]:
    """The client's side over asyncio streams: read the challenge, send the `hello` header (it must carry
    the client's `nonce`) sealed, and return the session keys and the server's answer - its first sealed
    frame's header (a welcome), or a plain `refused`. AuthError when the server's frame does not verify
    (it does not know the token, or the connection was tampered with) or its certificate is not `pin`."""
    fingerprint = peer_fingerprint(writer.get_extra_info("ssl_object"))
    check_pin(fingerprint, pin, "the server")
    challenge = parse((await read_frame(reader))[0], (Challenge,))
    writer.write(encode_frame(hello, key=hello_key(token, purpose, challenge.nonce, fingerprint)))
    await writer.drain()
    keys = derive(token, purpose, challenge.nonce, hello["nonce"], fingerprint, pack(hello), server=False)
    answer, _ = await read_frame(reader, 0, key=keys.recv, max_header=MAX_ANSWER, plain=("refused",))
    return keys, answer


async def server_hello(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: str,
    *,
    fingerprint: bytes,
    purpose: bytes = CONTROL,
) -> tuple[bytes, Frame]:
    """The server's side up to the client's hello: send a challenge and read the hello, sealed with the hello
    key bound to our certificate `fingerprint` (b"" without TLS); its MAC is checked before it is decoded.
    Returns (our nonce, the hello frame): parse it, then `derive(..., frame.raw, server=True)`. AuthError on
    a wrong MAC, ProtocolError on anything else (an unsealed or oversized hello)."""
    nonce = new_nonce()
    await write_frame(writer, to_header(Challenge(nonce=nonce)))
    frame = await read_frame_raw(reader, 0, key=hello_key(token, purpose, nonce, fingerprint))
    if not frame.sealed:
        raise ProtocolError(f"unsealed {shown(frame.header['type'], 40)} frame in place of a hello")
    return nonce, frame
