"""The coordinator's asyncio server, on a thread of its own so the learner's update loop never blocks on the
network: it accepts connections (admission caps first, then the handshake), welcomes each worker, dispatches
what it sends (FROM_WORKER; only a push of trajectories carries a payload, read by the intake record by record)
and drops a worker gone silent for `worker_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.broadcast.delivery import SnapshotDelivery
from echo2sdk.runtime.coordinator.connection import Conn, abort
from echo2sdk.runtime.coordinator.handout import Handout
from echo2sdk.runtime.coordinator.handshake import Handshake
from echo2sdk.runtime.coordinator.intake import Intake
from echo2sdk.runtime.coordinator.registry import Registry
from echo2sdk.runtime.coordinator.publications import Publications
from echo2sdk.runtime.protocol.groups import MAX_PUSH_BYTES
from echo2sdk.runtime.protocol.messages import (
    GetBase,
    GetTasks,
    Heartbeat,
    Installed,
    Received,
    Shutdown,
    SnapshotRejected,
    Tasks,
    Trajectories,
    Welcome,
    WireMessage,
    WireTask,
    WorkerConfig,
    shown,
)
from echo2sdk.runtime.protocol.wire import MAX_WORKER_HEADER

__all__ = ["Server", "FROM_WORKER"]

log = logging.getLogger("echo2sdk.coordinator")

FROM_WORKER = (GetTasks, Trajectories, Heartbeat, Installed, Received, SnapshotRejected, GetBase)


class Server:
    """Serves `host`:`port` (0: a free port, known after `start`) on its thread's event loop."""

    def __init__(
        self,
        *,
        registry: Registry,
        handshake: Handshake,
        intake: Intake,
        publications: Publications,
        handout: Handout,
        worker_config: WorkerConfig,
        host: str,
        port: int,
        worker_timeout_s: float,
    ):
        self.registry, self.handshake, self.intake, self.publications = registry, handshake, intake, publications
        self.delivery: SnapshotDelivery = publications.delivery
        self.admission = handshake.admission
        self.worker_config, self.host, self.port, self.worker_timeout_s = worker_config, host, port, worker_timeout_s
        self.protocol_errors = 0
        self.handout = handout
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self.heap = HeapTrim()

    # -- lifecycle (called from the learner thread) -----------------------------------------------------
    def start(self) -> tuple[str, int]:
        self.thread = threading.Thread(target=self._run_loop, name="echo2-coordinator", daemon=True)
        self.thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("coordinator did not start within 30 s")
        return self.host, self.port

    def _run_loop(self) -> None:
        self.loop = self.registry.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._handle, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        monitor = self.loop.create_task(self._monitor())
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            monitor.cancel()
            left = asyncio.all_tasks(self.loop)  # handshakes in flight, handlers: cancelled, and cleaned up
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self.loop.close()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on the loop (from any thread)."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(callback, *args)

    def stop(self) -> None:
        if self.loop is None or self.thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            fut.result(10)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self.registry.stopping = True  # workers leaving now are the run's end, not a loss
        self._server.close()
        conns = list(self.registry.conns.values())
        await asyncio.gather(*(asyncio.wait_for(c.send(Shutdown()), 2) for c in conns), return_exceptions=True)
        for conn in conns:
            conn.close()
        self.delivery.close()
        self.publications.close()

    # -- the connection handler -------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        ip, address = (peer[0], f"{peer[0]}:{peer[1]}") if peer else ("?", "?")
        ticket = self.admission.open(ip, lambda: abort(writer))
        if ticket is None:  # rate-limited or over capacity: nothing read, nothing sent
            abort(writer)
            return
        conn: Conn | None = None
        try:
            conn = await self.handshake.run(reader, writer, address, ticket)
            if conn is None:
                return
            await self._welcome(conn)
            while True:
                msg, _ = await conn.channel.recv(FROM_WORKER, max_header=MAX_WORKER_HEADER, max_payload=MAX_PUSH_BYTES,
                                                 payload_types=(Trajectories,), streamed=(Trajectories,))
                conn.info.last_seen = time.monotonic()
                await self._dispatch(conn, msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # peer went away
        except asyncio.CancelledError:
            pass  # the coordinator is shutting down (asyncio would log a re-raised cancellation as an error)
        except ProtocolError as e:  # AuthError included: a frame whose MAC fails after the handshake
            self.protocol_errors += 1
            log.warning("protocol error from %s: %s; closing the connection", address, e)
        finally:
            self.admission.close(ticket)
            self.heap.closed += 1
            if conn is not None:
                self.registry.drop(conn, "disconnected")
            writer.close()

    async def _welcome(self, conn: Conn) -> None:
        """The sealed welcome (it proves the coordinator knows the token), then the latest snapshot."""
        latest_version = self.publications.latest[0] if self.publications.latest else 0
        bcast = self.delivery.welcome_info()
        if bcast is not None and (store := self.publications.store_info()) is not None:
            bcast = bcast.model_copy(update={"store": store})
        await conn.send(Welcome(worker_id=conn.worker_id, config=self.worker_config, version=latest_version,
                                broadcast=bcast))
        await self.publications.send_latest(conn)

    async def _dispatch(self, conn: Conn, msg: WireMessage) -> None:
        if isinstance(msg, GetTasks):
            tasks = self._next_tasks(msg.n, conn.worker_id) if conn.info.active else []  # an inactive worker idles
            await conn.send(Tasks(rid=msg.rid, tasks=tasks))
        elif isinstance(msg, Trajectories):
            self.heap.received += conn.channel.last_frame_bytes
            self.heap.received_at = time.monotonic()
            ack = await self.intake.admit(conn, msg)  # reads the push's payload from the connection
            if ack is not None:  # None: quarantined, no ack (the connection is closing)
                await conn.send(ack)
        elif isinstance(msg, Heartbeat):
            conn.info.version, conn.info.rollouts_per_s = msg.version, msg.rollouts_per_s
            conn.info.adapter_failures, conn.info.groups_dropped = dict(msg.failures), msg.groups_dropped
        elif isinstance(msg, Installed):
            self.publications.on_installed(conn, msg.version)
        elif isinstance(msg, Received):
            self.publications.on_received(conn, msg)
        elif isinstance(msg, GetBase):  # on its own task: reading the base may take longer than a heartbeat
            if conn.base_task is None or conn.base_task.done():  # asked again meanwhile: the answer is on its way
                conn.base_task = asyncio.get_running_loop().create_task(self.publications.send_base(conn))
        elif isinstance(msg, SnapshotRejected):
            log.warning("worker %s refused snapshot v%s: %s", conn.worker_id, msg.version, shown(msg.reason, 200))
            await self.publications.on_rejected(conn, msg)

    def _next_tasks(self, n: int, worker_id: str) -> list[WireTask]:
        batch = self.handout.take(n, worker_id)
        return [WireTask(id=t.id, messages=t.messages, answer=t.answer, info=t.info) for t in batch]

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.heap.due():  # off the loop: malloc_trim walks the whole heap
                await asyncio.to_thread(self.heap.trim)
            self.registry.check_revocations()
            now = time.monotonic()
            for conn in list(self.registry.conns.values()):
                if now - conn.info.last_seen > self.worker_timeout_s:
                    self.registry.drop(conn, f"silent for {now - conn.info.last_seen:.0f} s")
                    conn.close()


class HeapTrim:
    """Give the C heap back to the OS after bursts of connections or of big pushes. A TLS handshake's buffers
    (OpenSSL's, ~40 KiB a connection) are freed when the connection closes, and a push's decoded header when it
    has been validated, but glibc keeps the pages: 1000 idle connections opened and closed left a bare coordinator
    +44 MiB RSS, returned by malloc_trim (issue 34). At most once per `every_s`: after at least `after`
    connections closed, `after_bytes` of pushes received, or `quiet_bytes` of pushes followed by `every_s`
    without one (a burst that ended); a no-op where libc has no malloc_trim. `due()` is read on the event loop;
    `trim()` runs on a thread (it walks the whole heap: ~11 ms on a 600 MB one)."""

    def __init__(self, after: int = 64, every_s: float = 2.0, after_bytes: int = 64 << 20,
                 quiet_bytes: int = 4 << 20):
        self.after, self.every_s, self.after_bytes, self.quiet_bytes = after, every_s, after_bytes, quiet_bytes
        self.closed = self.received = self.trims = 0
        self.received_at = self._last = 0.0
        self._trim: Any = _malloc_trim()

    def due(self) -> bool:
        now = time.monotonic()
        quiet = self.received >= self.quiet_bytes and now - self.received_at >= self.every_s
        wanted = self.closed >= self.after or self.received >= self.after_bytes or quiet
        return self._trim is not None and wanted and now - self._last >= self.every_s

    def trim(self) -> None:
        self.closed = self.received = 0
        self._last, self.trims = time.monotonic(), self.trims + 1
        self._trim(0)


def _malloc_trim() -> Any:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        return None
