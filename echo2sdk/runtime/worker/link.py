"""The worker's side of its coordinator connection after the handshake: sealed frames over
runtime/protocol/channel.SealedChannel, requests matched to their answers by request id, and the read loop
that hands every other message to the worker.

One `CoordinatorLink` lives as long as the worker: each session (a join or a re-join) resets it and opens a
new channel, so a report sent by a task of an earlier session goes out on the current connection, and the
request ids count on across re-joins.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.protocol.channel import Keys, SealedChannel
from echo2sdk.runtime.protocol.messages import (
    Ack,
    BaseFiles,
    Shutdown,
    Snapshot,
    SnapshotInStore,
    SnapshotPlan,
    Tasks,
    WireMessage,
)
from echo2sdk.runtime.protocol.wire import DEFAULT_MAX_PAYLOAD, MAX_ARRAY

__all__ = ["CoordinatorLink", "FROM_COORDINATOR", "WITH_PAYLOAD"]

log = logging.getLogger("echo2sdk.worker")

FROM_COORDINATOR = (Tasks, Ack, Snapshot, SnapshotPlan, SnapshotInStore, Shutdown, BaseFiles)
WITH_PAYLOAD = (Snapshot, BaseFiles)  # the only messages from the coordinator that carry a payload
R = TypeVar("R", Tasks, Ack)


class CoordinatorLink:
    """Sealed messages to and from the coordinator (see the module docstring)."""

    def __init__(self) -> None:
        self.channel: SealedChannel | None = None
        self.waiters: dict[int, asyncio.Future] = {}
        self.rids = itertools.count(1)
        self.stop = asyncio.Event()  # set when the read loop has ended: the session is over
        self.shutdown = False  # the coordinator said so (as opposed to a lost connection)

    def reset(self) -> None:
        """A new session begins: nothing stopped, no request waiting, no shutdown heard."""
        self.stop, self.waiters, self.shutdown = asyncio.Event(), {}, False

    def open(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keys: Keys) -> None:
        """The session's sealed channel, once the handshake gave its keys."""
        self.channel = SealedChannel(reader, writer, keys)

    async def send(self, msg: WireMessage, payload: bytes = b"") -> None:
        assert self.channel is not None
        await self.channel.send(msg, payload)

    async def notify(self, msg: WireMessage) -> None:
        """A report the coordinator can live without (it re-sends the latest snapshot when we re-join)."""
        try:
            await self.send(msg)
        except (ConnectionError, OSError) as e:
            log.debug("could not report %s: %s", msg.type, e)

    async def request(self, msg: WireMessage, reply: type[R], timeout: float = 60.0, payload: bytes = b"") -> R:
        """Send `msg` (and its `payload`) under a fresh request id and wait for the coordinator's `reply` to it."""
        if self.stop.is_set():  # the read loop has ended: nobody would ever answer (it fails the waiters it saw)
            raise ConnectionError("coordinator connection closed")
        rid = next(self.rids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiters[rid] = fut
        try:
            await self.send(msg.model_copy(update={"rid": rid}), payload)
            answer = await asyncio.wait_for(fut, timeout)
        finally:
            self.waiters.pop(rid, None)
        if not isinstance(answer, reply):
            raise ProtocolError(f"coordinator answered {msg.type} with {answer.type}, not {reply.__name__}")
        return answer

    async def read_loop(self, on_message: Callable[[WireMessage, bytes], Awaitable[None]]) -> None:
        """Read until the connection ends or the coordinator says shutdown: answers go to their requests,
        everything else (snapshots, plans, base files) to `on_message`. Then the session is stopped and every
        request still in flight fails at once (not at its timeout)."""
        try:
            while True:
                assert self.channel is not None
                msg, payload = await self.channel.recv(FROM_COORDINATOR, max_payload=DEFAULT_MAX_PAYLOAD,
                                                       payload_types=WITH_PAYLOAD, max_array=MAX_ARRAY)
                if isinstance(msg, (Snapshot, SnapshotPlan, SnapshotInStore, BaseFiles)):
                    await on_message(msg, payload)
                elif isinstance(msg, Shutdown):
                    self.shutdown = True
                    break
                elif (fut := self.waiters.get(msg.rid)) is not None and not fut.done():
                    fut.set_result(msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            log.warning("lost the connection to the coordinator")
        except ProtocolError as e:
            log.warning("protocol error from coordinator: %s", e)
        self.stop.set()
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(ConnectionError("coordinator connection closed"))
