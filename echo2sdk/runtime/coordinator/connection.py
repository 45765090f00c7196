"""One connected, authenticated worker: its registry record and its sealed channel (delivery.Peer).

Sends take turns on the channel (a payload's slices never interleave with another frame) and each slice must
be taken within the write limit's `timeout_s`, or the worker is dropped: a peer that stops reading holds up
nobody else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from echo2sdk.runtime.protocol.channel import SealedChannel, SendTimeout
from echo2sdk.runtime.protocol.messages import WireMessage

if TYPE_CHECKING:
    from echo2sdk.runtime.coordinator.worker_info import WorkerInfo

__all__ = ["Conn", "WriteLimit", "WRITE_TIMEOUT_S", "abort"]

log = logging.getLogger("echo2sdk.coordinator")

WRITE_TIMEOUT_S = 30.0  # a worker that takes no byte of what we send for this long is dropped


@dataclass
class WriteLimit:
    """How long a worker may take no byte of what is sent to it (`timeout_s`), and how many workers were
    dropped for it (`timeouts`): one for every connection of the coordinator."""

    timeout_s: float = WRITE_TIMEOUT_S
    timeouts: int = 0


class Conn:
    """A connected, authenticated worker (implements delivery.Peer). Every frame is sealed with its session."""

    def __init__(self, info: WorkerInfo, channel: SealedChannel, limit: WriteLimit):
        self.info, self.channel, self.limit = info, channel, limit
        self.base_task: asyncio.Task | None = None  # its get_base being answered: one at a time

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    @property
    def relay_addr(self) -> tuple[str, int] | None:
        return self.info.relay_addr

    @property
    def relay_fingerprint(self) -> bytes:
        return self.info.relay_fingerprint

    @property
    def writer(self) -> asyncio.StreamWriter:
        return self.channel.writer

    async def send(self, msg: WireMessage, payload: bytes | memoryview = b"") -> None:
        try:
            await self.channel.send(msg, payload, slice_timeout_s=self.limit.timeout_s, on_slice=self._took)
        except SendTimeout:
            self.limit.timeouts += 1
            log.warning("worker %s took no data for %.0f s (sending %s): dropped", self.worker_id,
                        self.limit.timeout_s, msg.type)
            abort(self.writer)
            raise ConnectionError(f"worker {self.worker_id} stopped reading") from None

    def _took(self) -> None:
        # taking our bytes is a sign of life: its handler waits for the send and reads nothing meanwhile
        self.info.last_seen = time.monotonic()

    def close(self) -> None:
        self.channel.close()


def abort(writer: asyncio.StreamWriter) -> None:
    """Close a connection at once, whatever state its (TLS) transport is in."""
    transport = writer.transport
    if transport is not None:
        transport.abort()
