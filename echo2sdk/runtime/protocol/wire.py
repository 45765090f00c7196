"""Framed messages between learner-side coordinator, rollout workers and relays (no pickle anywhere).

Two frame kinds, both  prefix = magic | u32 header length | u64 payload length :

    plain   b"E2F1" | lengths | msgpack header | payload          before authentication only
    sealed  b"E2S1" | lengths | tag (32) | msgpack header | payload

A sealed frame's tag is HMAC-SHA256(direction key, seq | prefix | header) (`session.FrameKey`); it is
checked before the header is decoded, and the payload is not MACed (a direct-push snapshot's SHA-256
and a chunk's index are in the MACed header; chunk bytes are checked against the signed manifest).
Every length is checked against a limit before anything is read or allocated for it: a few KiB
(`PREAUTH_MAX_HEADER`) unless the caller, past authentication, allows more (256 KiB from a worker, whose records
travel in a push's payload, 16 MiB from the coordinator). Headers decode with msgpack
limits on every string, bytes, array and map, and without extension types.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
import time
from typing import Any, NamedTuple, Protocol

import msgpack

from echo2sdk.core.records import pack
from echo2sdk.errors import AuthError, ProtocolError

__all__ = [
    "MAGIC", "SEALED", "PREFIX_BYTES", "TAG_BYTES", "PREAUTH_MAX_HEADER", "MAX_HEADER", "MAX_WORKER_HEADER", "MAX_ARRAY", "PEER_MAX_ARRAY", "DEFAULT_MAX_PAYLOAD",
    "Frame", "read_frame", "read_frame_raw", "write_frame", "encode_frame", "send_frame", "recv_frame",
    "recv_exactly_into", "check_prefix", "open_frame", "decode_header", "digest", "DeadlineExceeded",
    "check_deadline",
]

MAGIC = b"E2F1"
SEALED = b"E2S1"
_PREFIX = struct.Struct(">4sIQ")
PREFIX_BYTES = _PREFIX.size
TAG_BYTES = 32
PREAUTH_MAX_HEADER = 4 << 10  # every frame before authentication (challenge, hello, fetch, refused) fits
MAX_HEADER = 16 << 20  # after authentication, from the coordinator (a worker's frames: MAX_WORKER_HEADER)
MAX_WORKER_HEADER = 256 << 10  # after authentication, from a worker: its records travel in the payload
DEFAULT_MAX_PAYLOAD = 8 << 30
# msgpack limits per container (strings and bytes: the header's own length). msgpack allocates an array's slots
# when it reads its length, before the items: a header of nested arrays, each declaring the limit and cut short,
# costs (depth <= 1024) x the limit. Only a worker reading its coordinator needs long arrays (a snapshot plan's
# chunks and upstream); every other header is read with PEER_MAX_ARRAY (7 ms for the worst such header).
MAX_ARRAY = 1 << 20
PEER_MAX_ARRAY = 1 << 10
MAX_MAP = 1 << 12


class Key(Protocol):
    """One direction's frame MAC (session.FrameKey)."""

    def tag(self, data: bytes) -> bytes: ...

    def check(self, data: bytes, tag: bytes) -> bool: ...


class Frame(NamedTuple):
    header: dict[str, Any]
    payload: bytes  # b"" when it was left on the stream (read_frame_raw's `read_payload`)
    raw: bytes  # the header's msgpack bytes, as MACed
    sealed: bool
    payload_len: int


def decode_header(raw: bytes, max_array: int = PEER_MAX_ARRAY) -> dict[str, Any]:
    """A frame header: a msgpack map with a string 'type', decoded under limits (arrays of at most `max_array`
    items); ProtocolError if not."""
    try:
        header = msgpack.unpackb(
            raw, raw=False, use_list=False, strict_map_key=True, max_str_len=len(raw), max_bin_len=len(raw),
            max_array_len=max_array, max_map_len=MAX_MAP, max_ext_len=0,
        )
    except Exception as e:  # noqa: BLE001 - msgpack raises several exception types
        raise ProtocolError(f"undecodable frame header: {type(e).__name__}: {str(e)[:80]}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError(f"frame header must be a map with a string 'type', got {type(header).__name__}")
    return header


def check_prefix(
    prefix: bytes, *, keyed: bool, max_header: int, max_payload: int
) -> tuple[bool, int, int]:
    """(sealed, header length, payload length) of a frame prefix, checked against the limits before
    anything more is read. A sealed frame needs a key; without one only plain frames are expected."""
    magic, hlen, plen = _PREFIX.unpack(prefix)
    if magic not in (MAGIC, SEALED):
        raise ProtocolError(f"bad frame magic {bytes(magic)[:4]!r}: not an echo2 peer, or TLS on one side only?")
    if magic == SEALED and not keyed:
        raise ProtocolError("sealed frame before authentication")
    if hlen > max_header:
        raise ProtocolError(f"frame header of {hlen} bytes exceeds the {max_header}-byte limit")
    if plen > max_payload:
        raise ProtocolError(f"frame payload of {plen} bytes exceeds the {max_payload}-byte limit")
    return magic == SEALED, hlen, plen


def open_frame(
    prefix: bytes, body: bytes, key: Key | None, plain: tuple[str, ...] = (), max_array: int = PEER_MAX_ARRAY
) -> tuple[dict[str, Any], bytes]:
    """The header of a frame whose body (tag + header, or header) was read: the tag is checked first, and a
    plain frame after authentication (`key` given) is accepted only for the message types in `plain`."""
    sealed = prefix[:4] == SEALED
    if sealed:
        tag, raw = body[:TAG_BYTES], body[TAG_BYTES:]
        assert key is not None
        if not key.check(bytes(prefix) + raw, tag):
            raise AuthError("frame MAC does not verify (wrong token, or a frame replayed, reordered or tampered with)")
        return decode_header(raw, max_array), raw
    header = decode_header(body, max_array)
    if key is not None and header["type"] not in plain:
        raise ProtocolError(f"unsealed {str(header['type'])[:40]!r} frame after authentication")
    return header, body


def encode_frame(header: dict[str, Any], payload: bytes | memoryview = b"", key: Key | None = None) -> bytes:
    """Prefix (and tag) and header of a frame; the payload goes after it as it is."""
    h = pack(header)
    if key is None:
        return _PREFIX.pack(MAGIC, len(h), len(payload)) + h
    prefix = _PREFIX.pack(SEALED, len(h), len(payload))
    return prefix + key.tag(prefix + h) + h


async def read_frame_raw(
    reader: asyncio.StreamReader,
    max_payload: int = 0,
    *,
    key: Key | None = None,
    max_header: int = PREAUTH_MAX_HEADER,
    plain: tuple[str, ...] = (),
    read_payload: bool = True,
    max_array: int = PEER_MAX_ARRAY,
) -> Frame:
    """Read one frame (with `read_payload` false its payload is left on the stream for the caller, who must read
    `payload_len` bytes before the next frame). Raises asyncio.IncompleteReadError on EOF, AuthError on a bad
    tag and ProtocolError on anything else wrong. The stream reader holds only bytes that arrived; nothing is
    pre-allocated."""
    prefix = await reader.readexactly(PREFIX_BYTES)
    sealed, hlen, plen = check_prefix(prefix, keyed=key is not None, max_header=max_header, max_payload=max_payload)
    body = await reader.readexactly(hlen + (TAG_BYTES if sealed else 0))
    header, raw = open_frame(prefix, body, key, plain, max_array)
    payload = await reader.readexactly(plen) if plen and read_payload else b""
    return Frame(header, payload, raw, sealed, plen)


async def read_frame(
    reader: asyncio.StreamReader,
    max_payload: int = 0,
    *,
    key: Key | None = None,
    max_header: int = PREAUTH_MAX_HEADER,
    plain: tuple[str, ...] = (),
) -> tuple[dict[str, Any], bytes]:
    """`read_frame_raw`'s (header, payload)."""
    f = await read_frame_raw(reader, max_payload, key=key, max_header=max_header, plain=plain)
    return f.header, f.payload


async def write_frame(
    writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes | memoryview = b"", key: Key | None = None
) -> None:
    # Sealing and both writes happen without an await in between, so frames from concurrent tasks never
    # interleave and sequence numbers follow the byte stream.
    writer.write(encode_frame(header, payload, key))
    if payload:
        writer.write(payload)
    await writer.drain()


# -- the same frames over a blocking socket (the broadcast data path runs on threads) ------------------
class DeadlineExceeded(TimeoutError):
    """The peer keeps sending, but too slowly to be done by the deadline: a trickle of bytes, each inside the
    socket's stall timeout, that would otherwise hold the reader for as long as the peer likes."""


def check_deadline(deadline: float | None, missing: int) -> None:
    """DeadlineExceeded when time.monotonic() is past `deadline` (None: no deadline) with `missing` bytes to read."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded(f"{missing} byte(s) still to come at the deadline")


def recv_exactly_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill `view` from `sock`; raises EOFError when the peer closes first, TimeoutError on a stall and
    DeadlineExceeded when time.monotonic() passes `deadline` first (checked between reads: at most one stall
    timeout late)."""
    while view.nbytes:
        check_deadline(deadline, view.nbytes)
        n = sock.recv_into(view)
        if n == 0:
            raise EOFError("peer closed the connection")
        view = view[n:]


def recv_frame(
    sock: socket.socket,
    max_payload: int = 0,
    *,
    key: Key | None = None,
    max_header: int = PREAUTH_MAX_HEADER,
    plain: tuple[str, ...] = (),
    deadline: float | None = None,
) -> tuple[dict[str, Any], int]:
    """Read one frame's header; returns (header, payload length) and leaves the payload on the socket.
    `deadline`: as in recv_exactly_into."""
    prefix = bytearray(PREFIX_BYTES)
    recv_exactly_into(sock, memoryview(prefix), deadline)
    sealed, hlen, plen = check_prefix(bytes(prefix), keyed=key is not None, max_header=max_header,
                                      max_payload=max_payload)
    body = bytearray(hlen + (TAG_BYTES if sealed else 0))  # at most max_header (+ tag): checked above
    recv_exactly_into(sock, memoryview(body), deadline)
    header, _ = open_frame(bytes(prefix), bytes(body), key, plain)
    return header, plen


def send_frame(
    sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"", key: Key | None = None
) -> None:
    sock.sendall(encode_frame(header, payload, key))
    if payload:
        sock.sendall(payload)


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()
