"""One authenticated connection's framed, sealed messages: what the coordinator and a worker both speak after
the handshake (runtime/trust/session.py gives the two per-direction keys).

`send` seals a typed message (and its payload, if any) in stream order: sends take turns under one lock, so a
payload's slices never interleave with another frame, and with `slice_timeout_s` each slice must be taken by
the peer within that time or `SendTimeout` is raised (a peer that stops reading holds up nobody else).
`recv` reads one sealed frame and parses it into one of the `allowed` message types; a payload is accepted only
on the types in `payload_types` (anything else with one is a ProtocolError). A type in `streamed` leaves its
payload on the stream (`unread` bytes): the caller takes it in parts with `read_payload` and `skip_payload`, so
it never has to hold bytes it will refuse; what it leaves is skipped before the next frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.protocol.messages import WireMessage, parse, to_header
from echo2sdk.runtime.protocol.wire import MAX_HEADER, PEER_MAX_ARRAY, Key, encode_frame, read_frame_raw

__all__ = ["Keys", "SealedChannel", "SendTimeout", "SEND_SLICE", "SKIP_SLICE"]

SEND_SLICE = 1 << 20  # a payload goes out in slices: at most one slice per peer waits in memory
SKIP_SLICE = 1 << 16  # what skipping a streamed payload holds at a time


class Keys(Protocol):
    """The two directions of a session: `send` seals our frames, `recv` checks the peer's."""

    send: Key
    recv: Key


class SendTimeout(ConnectionError):
    """The peer took no byte of a slice within the send's `slice_timeout_s`."""


class SealedChannel:
    """Typed, sealed frames over one asyncio stream pair (see the module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keys: Keys):
        self.reader, self.writer, self.keys = reader, writer, keys
        self._lock = asyncio.Lock()
        self.last_frame_bytes = 0  # header + payload of the last frame received
        self.unread = 0  # bytes of a streamed payload still on the stream

    async def send(
        self,
        msg: WireMessage,
        payload: bytes | memoryview = b"",
        *,
        slice_timeout_s: float | None = None,
        on_slice: Callable[[], None] | None = None,
    ) -> None:
        """Seal and write `msg` (and `payload`, in SEND_SLICE slices, each drained within `slice_timeout_s`;
        `on_slice` is called after each slice the peer took). Raises SendTimeout, ConnectionError or OSError."""
        view = memoryview(payload)
        async with self._lock:
            self.writer.write(encode_frame(to_header(msg), view, self.keys.send))  # sealed in stream order
            for a in range(0, max(1, view.nbytes), SEND_SLICE):
                if view.nbytes:
                    self.writer.write(view[a : a + SEND_SLICE])
                try:
                    await asyncio.wait_for(self.writer.drain(), slice_timeout_s)
                except TimeoutError:
                    raise SendTimeout(f"the peer took no data for {slice_timeout_s:g} s (sending {msg.type})") from None
                if on_slice is not None:
                    on_slice()

    async def recv(
        self,
        allowed: Sequence[type[WireMessage]],
        *,
        max_payload: int = 0,
        payload_types: tuple[type[WireMessage], ...] = (),
        max_header: int = MAX_HEADER,
        streamed: tuple[type[WireMessage], ...] = (),
        max_array: int = PEER_MAX_ARRAY,
    ) -> tuple[WireMessage, bytes]:
        """The next message (one of `allowed`) and its payload (b"" for a `streamed` type: `unread` bytes are left
        on the stream). Raises asyncio.IncompleteReadError on EOF, AuthError on a bad seal and ProtocolError on
        anything else wrong."""
        await self.skip_payload(self.unread)
        f = await read_frame_raw(self.reader, max_payload, key=self.keys.recv, max_header=max_header,
                                 read_payload=False, max_array=max_array)
        self.last_frame_bytes = len(f.raw) + f.payload_len
        msg = parse(f.header, tuple(allowed))
        if f.payload_len and not isinstance(msg, payload_types):
            raise ProtocolError(f"a {msg.type} frame with a {f.payload_len}-byte payload")
        if isinstance(msg, streamed):
            self.unread = f.payload_len
            return msg, b""
        return msg, await self.reader.readexactly(f.payload_len) if f.payload_len else b""

    async def read_payload(self, n: int) -> bytes:
        """The next `n` bytes of a streamed payload."""
        if n > self.unread:
            raise ProtocolError(f"reading {n} bytes of a payload with {self.unread} left")
        self.unread -= n
        return await self.reader.readexactly(n)

    async def skip_payload(self, n: int, hasher: Any = None) -> None:
        """Read past `n` bytes of a streamed payload, SKIP_SLICE at a time (fed to `hasher` if given), holding none."""
        while n:
            chunk = await self.read_payload(min(n, SKIP_SLICE))
            if hasher is not None:
                hasher.update(chunk)
            n -= len(chunk)

    def close(self) -> None:
        self.writer.close()
