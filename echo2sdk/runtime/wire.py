"""Framed messages between learner-side coordinator and rollout workers (no pickle anywhere).

A frame is  b"E2F1" | u32 header length | u64 payload length | msgpack header | raw payload.
The header is a msgpack map with a "type" key; the payload carries bulk bytes (snapshots) untouched.
Authentication is a challenge-response over a shared token: the coordinator sends a random nonce, the
worker answers HMAC-SHA256(token, nonce); the token itself never crosses the wire.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import struct
from typing import Any

from echo2sdk.core.records import pack, unpack
from echo2sdk.errors import ProtocolError

__all__ = [
    "MAGIC",
    "read_frame",
    "write_frame",
    "encode_frame",
    "send_frame",
    "recv_frame",
    "recv_exactly_into",
    "new_nonce",
    "auth_mac",
    "check_mac",
    "digest",
]

MAGIC = b"E2F1"
_PREFIX = struct.Struct(">4sIQ")
MAX_HEADER = 16 << 20
DEFAULT_MAX_PAYLOAD = 8 << 30


async def read_frame(
    reader: asyncio.StreamReader, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[dict[str, Any], bytes]:
    """Read one frame. Raises asyncio.IncompleteReadError on EOF and ProtocolError on garbage."""
    prefix = await reader.readexactly(_PREFIX.size)
    magic, hlen, plen = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): not an echo2 peer?")
    if hlen > MAX_HEADER:
        raise ProtocolError(f"frame header of {hlen} bytes exceeds the {MAX_HEADER}-byte limit")
    if plen > max_payload:
        raise ProtocolError(f"frame payload of {plen} bytes exceeds the {max_payload}-byte limit")
    try:
        header = unpack(await reader.readexactly(hlen))
    except (ValueError, TypeError, Exception) as e:  # msgpack raises several exception types
        if isinstance(e, asyncio.IncompleteReadError):
            raise
        raise ProtocolError(f"undecodable frame header: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError(f"frame header must be a map with a string 'type', got {type(header).__name__}")
    payload = await reader.readexactly(plen) if plen else b""
    return header, payload


def encode_frame(header: dict[str, Any], payload: bytes | memoryview = b"") -> bytes:
    h = pack(header)
    return _PREFIX.pack(MAGIC, len(h), len(payload)) + h


async def write_frame(
    writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes | memoryview = b""
) -> None:
    # Both writes happen without an await in between, so frames from concurrent tasks never interleave.
    writer.write(encode_frame(header, payload))
    if payload:
        writer.write(payload)
    await writer.drain()


# -- the same frames over a blocking socket (the broadcast data path runs on threads) ------------------
def recv_exactly_into(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`; raises EOFError when the peer closes first, TimeoutError on a stall."""
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            raise EOFError("peer closed the connection")
        view = view[n:]


def recv_frame(sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD) -> tuple[dict[str, Any], int]:
    """Read one frame's header; returns (header, payload length) and leaves the payload on the socket."""
    prefix = bytearray(_PREFIX.size)
    recv_exactly_into(sock, memoryview(prefix))
    magic, hlen, plen = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r} (expected {MAGIC!r}): not an echo2 peer?")
    if hlen > MAX_HEADER or plen > max_payload:
        raise ProtocolError(f"frame of {hlen}+{plen} bytes exceeds the limits ({MAX_HEADER}+{max_payload})")
    raw = bytearray(hlen)
    recv_exactly_into(sock, memoryview(raw))
    try:
        header = unpack(bytes(raw))
    except Exception as e:  # noqa: BLE001 - msgpack raises several exception types
        raise ProtocolError(f"undecodable frame header: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("frame header must be a map with a string 'type'")
    return header, plen


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    sock.sendall(encode_frame(header, payload))
    if payload:
        sock.sendall(payload)


def new_nonce() -> bytes:
    return os.urandom(32)


def auth_mac(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def check_mac(token: str, nonce: bytes, mac: object) -> bool:
    return isinstance(mac, bytes) and hmac.compare_digest(auth_mac(token, nonce), mac)


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()
