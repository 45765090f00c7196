"""Learner-side service: worker registry, heartbeats, task hand-out, trajectory intake, snapshot push.

It runs an asyncio server on its own thread so the learner's update loop never blocks on the network.
Every message a worker sends is validated; a bad trajectory is rejected, counted and logged with the
field and value; a worker with a wrong token is refused; a dead worker is dropped, never waited for.
Trajectory intake (validation and buffering) runs on a thread of the loop's executor, so a large push
delays no other worker's messages; what a worker reports is bounded (its recent batch ids, the repairs
kept for the run's record, its adapter-failure counts).

Messages (echo2sdk.runtime.messages; worker -> coordinator): hello, get_tasks, trajectories, heartbeat,
received, installed, snapshot_rejected, get_base. Messages (coordinator -> worker): challenge, welcome |
refused, tasks, ack, snapshot_plan (chain broadcast) or snapshot (direct push), base_files, shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from echo2sdk.core import capacity
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.contracts import Task
from echo2sdk.core.records import Trajectory
from echo2sdk.errors import AuthError, ProtocolError, TrajectoryRejected
from echo2sdk.runtime import session
from echo2sdk.runtime.admission import Admission, Ticket
from echo2sdk.runtime.bootstrap import ModelFolder
from echo2sdk.runtime.credentials import new_token
from echo2sdk.runtime.delivery import DirectPush, SnapshotDelivery, check_delivery
from echo2sdk.runtime.messages import (
    MAX_ID,
    Ack,
    BaseFiles,
    GetBase,
    GetTasks,
    Heartbeat,
    Hello,
    Installed,
    Received,
    Refused,
    Shutdown,
    SnapshotRejected,
    Tasks,
    Trajectories,
    Welcome,
    WireMessage,
    WireTask,
    WorkerConfig,
    parse,
    shown,
    to_header,
)
from echo2sdk.runtime.tls import Identity, server_context
from echo2sdk.runtime.wire import MAX_HEADER, encode_frame, read_frame, write_frame
from echo2sdk.runtime.worker_keys import Revocations

__all__ = ["Coordinator", "WorkerInfo"]

log = logging.getLogger("echo2sdk.coordinator")

HANDSHAKE_S = 10.0  # one deadline for TLS, challenge and hello together
WRITE_TIMEOUT_S = 30.0  # a worker that takes no byte of what we send for this long is dropped
SEND_SLICE = 1 << 20  # a payload goes out in slices: at most one slice per worker waits in memory
FROM_WORKER = (GetTasks, Trajectories, Heartbeat, Installed, Received, SnapshotRejected, GetBase)
MAX_REPAIRS_KEPT = 4096  # broadcast repairs kept for the run's record (all are counted)
LOGGED_REJECTIONS = 8  # rejected groups of one push logged one by one; the rest in one summary line
MAX_CONNS_PER_CREDENTIAL = 4  # live connections one worker credential may hold (a re-join replaces its own)
KEEP_DEPARTED = 1024  # records of workers that left, kept for the run's worker table (the oldest forgotten)
KEEP_QUARANTINED = 4096  # quarantined worker ids refused by name (the oldest forgotten; `quarantines` counts all)


@dataclass
class WorkerInfo:
    worker_id: str
    address: str
    price_per_hour: float = 0.0
    backend: str = ""
    version: int = 0
    joined_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    trajectories: int = 0
    rejected: int = 0
    rollouts_per_s: float = 0.0
    alive: bool = True
    active: bool = True  # handed tasks; False: registered and idle (Coordinator.set_active)
    relay_addr: tuple[str, int] | None = None  # where this worker serves snapshot chunks to its children
    relay_fingerprint: bytes = field(default=b"", repr=False)  # its relay's TLS certificate (SHA-256)
    session: str = ""  # the worker process's random id: a re-join from it keeps worker_id and record
    credential: str = ""  # the name of the worker credential it logged in with ("": the run token)
    rejoins: int = 0
    batches: deque[str] = field(default_factory=lambda: deque(maxlen=64), repr=False)  # recent pushes' ids
    installed: set[int] = field(default_factory=set, repr=False)  # published versions it reported installed (audit)
    adapter_failures: dict[str, int] = field(default_factory=dict)  # rollouts its adapter failed, by reason
    groups_dropped: int = 0  # groups it did not send because a member's rollout failed


class _Conn:
    """A connected, authenticated worker (implements delivery.Peer). Every frame is sealed with its session.
    Sends take turns (a lock: a payload's slices never interleave with another frame) and each slice must be
    taken within `write_timeout_s`, or the worker is dropped: a peer that stops reading holds up nobody else."""

    def __init__(self, info: WorkerInfo, writer: asyncio.StreamWriter, keys: session.Session, owner: Coordinator):
        self.info, self.writer, self.keys, self.owner = info, writer, keys, owner
        self._lock = asyncio.Lock()
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

    async def send(self, msg: WireMessage, payload: bytes | memoryview = b"") -> None:
        view = memoryview(payload)
        async with self._lock:
            self.writer.write(encode_frame(to_header(msg), view, self.keys.send))  # sealed in stream order
            try:
                for a in range(0, max(1, view.nbytes), SEND_SLICE):
                    self.writer.write(view[a : a + SEND_SLICE])
                    await asyncio.wait_for(self.writer.drain(), self.owner.write_timeout_s)
                    # taking our bytes is a sign of life: its handler waits for this lock and reads nothing meanwhile
                    self.info.last_seen = time.monotonic()
            except TimeoutError:
                self.owner.write_timeouts += 1
                log.warning("worker %s took no data for %.0f s (sending %s): dropped", self.worker_id,
                            self.owner.write_timeout_s, msg.type)
                _abort(self.writer)
                raise ConnectionError(f"worker {self.worker_id} stopped reading") from None

    def close(self) -> None:
        self.writer.close()


class Coordinator:
    def __init__(
        self,
        *,
        buffer: StalenessBuffer,
        tasks: Iterator[Task],
        worker_config: Mapping[str, Any] | WorkerConfig,
        vocab_size: int,
        max_len: int,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_s: float = 1.0,
        worker_timeout_s: float = 15.0,
        gamma: float = 1.1,
        delivery: SnapshotDelivery | None = None,
        tls: bool | Identity = True,
        admission: Admission | None = None,
        handshake_s: float = HANDSHAKE_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        base: ModelFolder | None = None,
        revoked: Revocations | None = None,
    ):
        """`tls`: True (a certificate made for this run), an `Identity` (`echo2 keys`), or False: plaintext,
        an explicit opt-in (workers then need `--plaintext`). `admission`: connection caps and the failed-
        login rate limit (defaults: `Admission()`); `handshake_s`: the deadline of a whole handshake;
        `write_timeout_s`: how long a worker may take no byte of what is sent to it before it is dropped.
        `base`: the model folder served to a worker that asks for the base (runtime/bootstrap.py).
        `revoked`: worker names refused and dropped (runtime/worker_keys.py; its file re-read when it changes)."""
        self.buffer, self._tasks = buffer, tasks
        # staleness: a worker that knows a snapshot more than S versions ahead of its own is on the way waits
        # for it rather than generate records the buffer must reject
        self.worker_config = WorkerConfig.from_mapping(
            worker_config, heartbeat_s=heartbeat_s, staleness=buffer.staleness
        )
        self.vocab_size, self.max_len = vocab_size, max_len
        self.token = token or new_token()
        session.token_key(self.token)  # scrypt once, here, not in the event loop on the first hello
        self.host, self.port = host, port
        self.worker_timeout_s, self.q = worker_timeout_s, 1.0 / gamma  # T_bcast counts q = 1/gamma of workers
        self.delivery = check_delivery(delivery or DirectPush())
        self.identity = (tls if isinstance(tls, Identity) else Identity.generate()) if tls else None
        self._tls = server_context(self.identity) if self.identity is not None else None
        self.fingerprint = self.identity.fingerprint if self.identity is not None else b""
        self.admission = admission or Admission()
        self.handshake_s, self.write_timeout_s = handshake_s, write_timeout_s
        self.write_timeouts = 0  # workers dropped because they stopped reading
        self.base, self.bases_served = base, 0
        self._base_weights: bytes | None = None  # the base as version 0, kept until the first publication
        self._base_lock = asyncio.Lock()
        self.workers: dict[str, WorkerInfo] = {}
        self.refused = 0
        self.revocations, self.refused_revoked = revoked or Revocations(), 0  # hellos of revoked names refused
        self.rejected: Counter[str] = Counter()
        self.protocol_errors = 0
        # the latest repairs workers reported, for the run's record; repairs_reported counts all of them
        self.broadcast_repairs: deque[dict[str, Any]] = deque(maxlen=MAX_REPAIRS_KEPT)
        self.repairs_reported = 0
        self._conns: dict[str, _Conn] = {}
        self.quarantined: OrderedDict[str, str] = OrderedDict()  # worker id -> why (core/audit.py): refused by name
        self.quarantines = 0  # workers quarantined in this run (the dict keeps the newest KEEP_QUARANTINED)
        self._ids = itertools.count(1)
        self._task_lock = threading.Lock()
        self._latest: tuple[int, bytes] | None = None
        # every version this coordinator published, in order -> {t0, expected, installed: {id: t}}
        self._bcast: dict[int, dict[str, Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._stopping = False  # set by stop(): a worker leaving then is the end of the run
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # -- lifecycle (called from the learner thread) -----------------------------------------------
    def start(self) -> tuple[str, int]:
        self._thread = threading.Thread(target=self._run_loop, name="echo2-coordinator", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("coordinator did not start within 30 s")
        return self.host, self.port

    def _run_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        monitor = self._loop.create_task(self._monitor())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            monitor.cancel()
            left = asyncio.all_tasks(self._loop)  # handshakes in flight, handlers: cancelled, and cleaned up
            for task in left:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self._loop.close()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            fut.result(10)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._stopping = True  # workers leaving now are the run's end, not a loss
        self._server.close()
        conns = list(self._conns.values())
        await asyncio.gather(*(asyncio.wait_for(c.send(Shutdown()), 2) for c in conns), return_exceptions=True)
        for conn in conns:
            conn.close()
        self.delivery.close()

    # -- publication -------------------------------------------------------------------------------
    def publish(self, version: int, weights: bytes) -> None:
        """Hand snapshot `version` to the delivery (non-blocking for the learner)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._publish, version, weights)

    def _publish(self, version: int, weights: bytes) -> None:
        self._latest = (version, weights)
        self._base_weights = None  # a worker that bootstraps from now on gets the latest snapshot
        peers = [c for c in self._conns.values() if c.info.alive]
        # T_bcast counts the active rollout pool (paper §4.2); idle standby workers still get the snapshot
        active = {p.worker_id for p in peers if p.info.active}
        self._bcast[version] = {
            "t0": time.monotonic(),
            "expected": active or {p.worker_id for p in peers},
            "received": {},
            "installed": {},
        }
        self._loop.create_task(self.delivery.deliver(version, weights, peers))  # type: ignore[union-attr]

    def t_bcast(self, version: int, event: str = "installed") -> tuple[float | None, float | None]:
        """(T_bcast to q = 1/gamma of the workers active at publication, T_bcast to all of them).
        `event` is "installed" (live in the backend) or "received" (complete, verified copy on the worker)."""
        b = self._bcast.get(version)
        if not b or not b["expected"]:
            return None, None
        times = [t - b["t0"] for w, t in b[event].items() if w in b["expected"]]
        t_q = capacity.t_bcast_quantile(times, len(b["expected"]), self.q)
        t_all = max(times) if len(times) == len(b["expected"]) else None
        return t_q, t_all

    # -- statistics --------------------------------------------------------------------------------
    def alive_workers(self) -> list[WorkerInfo]:
        return [w for w in list(self.workers.values()) if w.alive]  # list(): a join mid-call from the loop's thread

    def stats(self) -> dict[str, Any]:
        return {
            "workers_alive": len(self.alive_workers()),
            "workers_seen": len(self.workers),
            "refused": self.refused,
            "refused_revoked": self.refused_revoked,
            "quarantines": self.quarantines,
            "rejected": dict(self.rejected),
            "protocol_errors": self.protocol_errors,
            "broadcast_repairs": self.repairs_reported,
            "write_timeouts": self.write_timeouts,
            **self.adapter_failures(),
            **self.admission.stats(),
        }

    def adapter_failures(self) -> dict[str, Any]:
        """Rollouts the workers' adapters failed (score raised, or gave a NaN or a non-number), by reason, and
        the groups the workers dropped for them: the sums of what every worker seen last reported."""
        total: Counter[str] = Counter()
        workers = list(self.workers.values())  # copied in one C-level call each: the loop may mutate them meanwhile
        for w in workers:
            total.update(dict(w.adapter_failures))
        return {"adapter_failures": dict(total), "groups_dropped": sum(w.groups_dropped for w in workers)}

    def worker_table(self) -> list[dict[str, Any]]:
        """One row per worker seen, without its session, relay fingerprint and bookkeeping sets. Safe to call
        from another thread than the coordinator's loop: no field is deep-copied while the loop mutates it
        (dataclasses.asdict did, and raised "deque mutated during iteration" on `batches`); the workers and
        their failure counts are copied in one C-level call each."""
        hidden = ("batches", "installed", "session", "relay_fingerprint")
        rows = []
        for w in list(self.workers.values()):
            row = {f.name: getattr(w, f.name) for f in fields(w) if f.name not in hidden}
            row["adapter_failures"] = dict(row["adapter_failures"])
            rows.append(row)
        return rows

    # -- activation (cost-aware scheduler: echo2sdk.core.scheduler) ---------------------------------
    default_active: bool = True  # whether a worker that joins is handed tasks at once

    def set_active(self, worker_id: str, active: bool) -> bool:
        """Hand tasks to a registered worker again (True) or stop handing it any (False). A deactivated
        worker stays registered, keeps its connection, heartbeats and snapshots, and idles (its
        get_tasks are answered with no tasks). Returns False when no such live worker is registered."""
        info = self.workers.get(worker_id)
        if info is None or not info.alive:
            return False
        info.active = bool(active)
        log.info("worker %s %s", worker_id, "activated" if active else "deactivated (registered, idle)")
        return True

    # -- the connection handler --------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        ip, address = (peer[0], f"{peer[0]}:{peer[1]}") if peer else ("?", "?")
        ticket = self.admission.open(ip, lambda: _abort(writer))
        if ticket is None:  # rate-limited or over capacity: nothing read, nothing sent
            _abort(writer)
            return
        conn: _Conn | None = None
        try:
            try:
                async with asyncio.timeout(self.handshake_s):
                    conn = await self._authenticate(reader, writer, address, ticket)
            except TimeoutError:
                self.refused += 1
                self.admission.timed_out()
                log.warning("refused %s: no valid hello within %.0f s", address, self.handshake_s)
            if conn is None:
                return
            await self._welcome(conn)
            while True:
                header, _ = await read_frame(reader, 0, key=conn.keys.recv, max_header=MAX_HEADER)
                conn.info.last_seen = time.monotonic()
                await self._dispatch(conn, header)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # peer went away
        except asyncio.CancelledError:
            pass  # the coordinator is shutting down (asyncio would log a re-raised cancellation as an error)
        except ProtocolError as e:  # AuthError included: a frame whose MAC fails after the handshake
            self.protocol_errors += 1
            log.warning("protocol error from %s: %s; closing the connection", address, e)
        finally:
            self.admission.close(ticket)
            if conn is not None:
                self._drop(conn, "disconnected")
            writer.close()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str, ticket: Ticket
    ) -> _Conn | None:
        """TLS, challenge, hello (sealed with the hello key: it proves the token and binds this connection);
        the registered connection with its session keys, or None when the peer was refused."""
        if self._tls is not None:
            plain = writer.transport
            try:
                await writer.start_tls(self._tls)
            except AttributeError:  # asyncio 3.11: the peer left during the TLS handshake, and start_tls
                writer._transport = plain  # left the writer without a transport (its __del__ would raise)
                raise ConnectionResetError("closed during the TLS handshake") from None
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
        who = f"{address}: worker {shown(hello.worker_id, 60)}"
        if hello.worker_id in self.quarantined:  # from here on a refusal is sealed: the worker can trust it
            return await self._refuse(writer, f"{who} is quarantined",
                                      f"worker {hello.worker_id} is quarantined for the rest of the run", keys)
        self._check_revocations()
        if hello.worker_id in self.revocations:
            self.refused_revoked += 1
            return await self._refuse(writer, f"{who} is revoked", f"worker {hello.worker_id} is revoked", keys)
        by_credential = root != session.token_key(self.token)
        if by_credential and self._credential_conns(hello) >= MAX_CONNS_PER_CREDENTIAL:
            self.refused += 1
            return await self._refuse(writer, f"{who}: its credential holds {MAX_CONNS_PER_CREDENTIAL} connections",
                                      f"credential {hello.worker_id} already holds {MAX_CONNS_PER_CREDENTIAL} "
                                      "connections, the most one credential may", keys)
        self.admission.authenticated(ticket)
        conn = self._register(hello, keys, writer, address, credential=by_credential)
        self._note_installed(conn, hello.version)  # a re-join's version: its `installed` report may have been lost
        return conn

    def _credential_conns(self, hello: Hello) -> int:
        """Live connections of the credential `hello` logs in with, less the one a re-join of the same process
        replaces. Each gets every snapshot pushed: uncapped, one credential could multiply the learner's uplink."""
        held = sum(1 for c in self._conns.values() if c.info.credential == hello.worker_id)
        return held - (hello.worker_id in self._conns and self._same_process(hello.worker_id, hello.session))

    def _same_process(self, worker_id: str, session: str) -> bool:
        """Whether a hello with `session` comes from the process registered under `worker_id` (a re-join)."""
        before = self.workers.get(worker_id)
        return before is not None and bool(session) and before.session == session

    def _register(
        self, hello: Hello, keys: session.Session, writer: asyncio.StreamWriter, address: str, credential: bool = False
    ) -> _Conn:
        """Enter an authenticated worker in the registry: a re-join from the same process keeps its id and
        record; another process asking for a taken id gets a free `id~N`."""
        peer_host = address.rpartition(":")[0]
        wid, sess = hello.worker_id or f"w{next(self._ids)}", hello.session
        before = self.workers.get(wid)
        rejoin = self._same_process(wid, sess)
        if wid in self._conns:
            if rejoin:  # the same process on a new connection: the old one is dead, whatever TCP says yet
                old = self._conns[wid]
                self._drop(old, "re-joined on a new connection")
                old.close()
            else:  # another process under a taken id: a free one no credential can be named (runtime/worker_keys.py)
                base = wid
                while wid in self.workers:
                    suffix = f"~{next(self._ids)}"
                    wid = base[: MAX_ID - len(suffix)] + suffix
        info = WorkerInfo(
            worker_id=wid,
            address=address,
            price_per_hour=hello.price_per_hour,
            backend=hello.backend,
            version=hello.version,
            relay_addr=(peer_host, hello.relay_port) if hello.relay_port is not None else None,
            relay_fingerprint=hello.relay_fingerprint,
            session=sess,
            credential=hello.worker_id if credential else "",
        )
        conn = _Conn(info, writer, keys, self)
        info.active = self.default_active
        if rejoin and before is not None:  # its record goes on: counts, activation (the scheduler's choice)
            info.joined_at, info.trajectories, info.rejected = before.joined_at, before.trajectories, before.rejected
            info.rollouts_per_s, info.active = before.rollouts_per_s, before.active
            info.rejoins, info.batches, info.installed = before.rejoins + 1, before.batches, before.installed
            info.adapter_failures, info.groups_dropped = before.adapter_failures, before.groups_dropped
        self.workers[wid], self._conns[wid] = info, conn
        self._forget_departed()
        log.info("worker %s %s from %s", shown(wid, 60), "re-joined" if rejoin else "joined", address)
        return conn

    def _forget_departed(self) -> None:
        """Keep the registry bounded: beyond KEEP_DEPARTED records of workers that left, drop the longest gone."""
        gone = [w for w in self.workers.values() if not w.alive]
        for w in sorted(gone, key=lambda w: w.last_seen)[: max(0, len(gone) - KEEP_DEPARTED)]:
            del self.workers[w.worker_id]

    async def _welcome(self, conn: _Conn) -> None:
        """The sealed welcome (it proves the coordinator knows the token), then the latest snapshot."""
        latest_version = self._latest[0] if self._latest else 0
        await conn.send(Welcome(worker_id=conn.worker_id, config=self.worker_config, version=latest_version,
                                broadcast=self.delivery.welcome_info()))
        if self._latest is not None:  # a late joiner gets the current policy at once
            await self.delivery.deliver(self._latest[0], self._latest[1], [conn])

    async def _refuse(
        self, writer: asyncio.StreamWriter, detail: str, reason: str, keys: session.Session | None = None
    ) -> None:
        """Count and log (`detail`) a refused hello and tell the peer why (`reason`: short); sealed with the
        session `keys` when the hello verified, so that the worker knows the refusal is ours and final."""
        self.refused += 1
        log.warning("refused %s", detail)
        await write_frame(writer, to_header(Refused(reason=reason)), key=keys.send if keys is not None else None)

    async def _dispatch(self, conn: _Conn, header: dict[str, Any]) -> None:
        msg = parse(header, FROM_WORKER)
        if isinstance(msg, GetTasks):
            tasks = self._next_tasks(msg.n) if conn.info.active else []  # an inactive worker idles
            await conn.send(Tasks(rid=msg.rid, tasks=tasks))
        elif isinstance(msg, Trajectories):
            if self._claims_lie(conn, msg.groups):  # quarantined: no ack, the connection is closing
                return
            await conn.send(await self._admit(conn, msg))
        elif isinstance(msg, Heartbeat):
            conn.info.version, conn.info.rollouts_per_s = msg.version, msg.rollouts_per_s
            conn.info.adapter_failures, conn.info.groups_dropped = dict(msg.failures), msg.groups_dropped
        elif isinstance(msg, Installed):
            conn.info.version = msg.version
            self._note_installed(conn, msg.version)
            b = self._bcast.get(msg.version)
            if b is not None:
                b["installed"].setdefault(conn.worker_id, time.monotonic())
        elif isinstance(msg, Received):
            b = self._bcast.get(msg.version)
            if b is not None and msg.ok:
                b["received"].setdefault(conn.worker_id, time.monotonic())
            self.repairs_reported += len(msg.repairs)
            for r in msg.repairs:
                self.broadcast_repairs.append({"worker": conn.worker_id, "version": msg.version,
                                               **r.model_dump(exclude_none=True)})
            self.delivery.on_report(conn.worker_id, msg)
        elif isinstance(msg, GetBase):  # on its own task: reading the base may take longer than a heartbeat
            if conn.base_task is None or conn.base_task.done():  # asked again meanwhile: the answer is on its way
                conn.base_task = asyncio.get_running_loop().create_task(self._send_base(conn))
        elif isinstance(msg, SnapshotRejected):
            log.warning("worker %s refused snapshot v%s: %s", conn.worker_id, msg.version, shown(msg.reason, 200))

    async def _admit(self, conn: _Conn, msg: Trajectories) -> Ack:
        """Admit a push of groups once per batch id: a re-sent push is acknowledged, not re-admitted. The
        records are validated and buffered on an executor thread (the buffer takes its own lock), then
        counted here, on the loop: a push of a thousand groups holds up no other worker's messages."""
        if msg.batch is not None:
            if msg.batch in conn.info.batches:
                return Ack(rid=msg.rid, accepted=0, duplicate=True)
            conn.info.batches.append(msg.batch)  # now: a re-send arriving during the intake is a duplicate
        loop = asyncio.get_running_loop()
        accepted, rejections = await loop.run_in_executor(None, self._intake, msg.groups, conn.worker_id)
        self._count(conn, accepted, rejections)
        return Ack(rid=msg.rid, accepted=accepted, rejected=[e.reason for _, e in rejections])

    async def _send_base(self, conn: _Conn) -> None:
        """A worker without the model: the base files, then the weights over the delivery as any snapshot - the
        latest (its welcome delivered it already) or, before the first publication, the base as version 0."""
        if self.base is None:
            msg, payload = BaseFiles(reason="this coordinator serves no model folder"), b""
        else:
            msg, payload = await asyncio.to_thread(self.base.message)
        try:
            await conn.send(msg, payload)
        except (ConnectionError, OSError):
            return  # gone: the handler drops it
        if self.base is None or not msg.files:
            return
        self.bases_served += 1
        log.info("worker %s bootstraps: %d base file(s), %d bytes", conn.worker_id, len(msg.files), len(payload))
        async with self._base_lock:  # workers asking at once share one read of the folder
            if self._latest is None and self._base_weights is None:
                try:
                    weights = await asyncio.to_thread(self.base.weights)
                except Exception:  # noqa: BLE001 - the worker waits in vain; the learner goes on
                    log.exception("cannot read the base weights for worker %s", conn.worker_id)
                    return
                if self._latest is None:  # not published meanwhile (the worker got that one)
                    self._base_weights = weights
        if self._latest is None and self._base_weights is not None and conn.info.alive:
            await self.delivery.deliver(0, self._base_weights, [conn])

    def _next_tasks(self, n: int) -> list[WireTask]:
        with self._task_lock:
            batch = list(itertools.islice(self._tasks, n))
        return [WireTask(id=t.id, messages=t.messages, answer=t.answer, info=t.info) for t in batch]

    def _intake(self, groups: tuple[Any, ...], worker_id: str) -> tuple[int, list[tuple[int, TrajectoryRejected]]]:
        """Validate and buffer each group of raw records (on an executor thread: it touches only the buffer).
        Every record is attributed to `worker_id`, the authenticated sender: a record that names no worker would
        otherwise escape the per-worker cap, the audit's quarantine and revocation (one naming another worker
        never gets here: _claims_lie). Returns the records accepted and, per rejected group, its size and why."""
        accepted, rejections = 0, []
        for group in groups:
            try:
                if not isinstance(group, (list, tuple)):
                    raise TrajectoryRejected("schema", "groups[]", type(group).__name__, "a group is a list")
                records = [_attributed(Trajectory.from_wire(obj), worker_id) for obj in group]
                self.buffer.add_group(records, vocab_size=self.vocab_size, max_len=self.max_len)
                accepted += len(records)
            except TrajectoryRejected as e:
                rejections.append((len(group) if isinstance(group, (list, tuple)) else 1, e))
        return accepted, rejections

    def _count(self, conn: _Conn, accepted: int, rejections: list[tuple[int, TrajectoryRejected]]) -> None:
        """Count a push's outcome by reason, and log its first rejections one by one (the rest in one line)."""
        conn.info.trajectories += accepted
        for n, e in rejections:
            self.rejected[e.reason] += n
            conn.info.rejected += n
        for n, e in rejections[:LOGGED_REJECTIONS]:
            log.warning("worker %s: %s (group of %d dropped)", conn.worker_id, e, n)
        if len(rejections) > LOGGED_REJECTIONS:
            more = Counter(e.reason for _, e in rejections[LOGGED_REJECTIONS:])
            log.warning("worker %s: %d more group(s) of the same push rejected: %s", conn.worker_id,
                        len(rejections) - LOGGED_REJECTIONS, dict(more))

    # -- worker audit (core/audit.py) ---------------------------------------------------------------
    def quarantine(self, worker_id: str, reason: str) -> None:
        """Quarantine a lying worker for the rest of the run (any thread): its buffered groups are dropped and
        none of its records is admitted again, its connection is closed, a hello under its id is refused."""
        if worker_id in self.quarantined:
            return
        self.quarantines += 1
        self.quarantined[worker_id] = reason
        while len(self.quarantined) > KEEP_QUARANTINED:  # a shared token lets a liar come back under a new id
            self.quarantined.popitem(last=False)        # anyway: per-worker credentials (revocation) stop that
        dropped = self.buffer.drop_worker(worker_id)
        log.warning("worker %s quarantined: %s; %d buffered record(s) dropped", shown(worker_id, 60), reason, dropped)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._close_quarantined, worker_id)
        info = self.workers.get(worker_id)
        if info is not None and info.credential:  # a credential is one principal, whatever id its connection got:
            self.quarantine(info.credential, f"credential of quarantined worker {shown(worker_id, 60)}")  # its name
            for other in [w for w in list(self.workers.values()) if w.credential == info.credential]:
                self.quarantine(other.worker_id, f"credential {info.credential} is quarantined")

    def _close_quarantined(self, worker_id: str) -> None:
        conn = self._conns.get(worker_id)
        if conn is not None:
            self._drop(conn, "quarantined")
            _abort(conn.writer)

    def _note_installed(self, conn: _Conn, version: int) -> None:
        """Record a version the worker reports installed: a published one only (nothing else exists; with
        kappa > 1 the versions between publications never leave the learner), or one from before a resume
        (below the first this coordinator published, in `_bcast`: not known here)."""
        first = next(iter(self._bcast), None)
        if first is not None and (version in self._bcast or 0 < version < first):
            conn.info.installed.add(version)

    def _claims_lie(self, conn: _Conn, groups: tuple[Any, ...]) -> bool:
        """True, with the worker quarantined, when a pushed record names another worker or claims a version
        (other than the initial 0) this worker never reported installed. Malformed records are left to intake."""
        installed = conn.info.installed
        for obj in (o for g in groups if isinstance(g, (list, tuple)) for o in g if isinstance(o, dict)):
            meta, v = obj.get("meta"), obj.get("version")
            who = meta.get("worker") if isinstance(meta, dict) else None
            if isinstance(who, str) and who != conn.worker_id:
                reason = f"a record names worker {shown(who, 60)}"
            elif type(v) is int and v > 0 and v not in installed:
                reason = f"a record claims version {v}, which it never reported installed"
            else:
                continue
            self.quarantine(conn.worker_id, reason)
            return True
        return False

    def _drop(self, conn: _Conn, why: str) -> None:
        if conn.info.alive:
            conn.info.alive = False
            if self._stopping:
                log.info("worker %s %s at shutdown", conn.worker_id, why)
            else:
                log.warning("worker %s %s; training continues with %d worker(s)", conn.worker_id, why,
                            len(self.alive_workers()))
        if self._conns.get(conn.worker_id) is conn:  # not the connection a re-join registered under the same id
            del self._conns[conn.worker_id]

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._check_revocations()
            now = time.monotonic()
            for conn in list(self._conns.values()):
                if now - conn.info.last_seen > self.worker_timeout_s:
                    self._drop(conn, f"silent for {now - conn.info.last_seen:.0f} s")
                    conn.close()


    # -- per-worker credentials (runtime/worker_keys.py) -------------------------------------------------
    def _hello_roots(self, header: dict[str, Any]) -> list[bytes]:
        """The root keys a hello may be sealed with: K_token, then K_worker(NAME) for the worker id NAME it claims
        (one HMAC), read from the pre-authentication header before its MAC is checked (session.open_hello)."""
        root, name = session.token_key(self.token), header.get("worker_id")
        return [root, session.worker_key(root, name)] if isinstance(name, str) and 0 < len(name) <= MAX_ID else [root]

    def _check_revocations(self) -> None:
        """Re-read the revoked file if it changed (at each authenticated hello and every second); drop the
        workers whose name or credential is revoked now, with their buffered records."""
        if not self.revocations.refresh():
            return
        for info in list(self.workers.values()):
            if info.worker_id in self.revocations or info.credential in self.revocations:
                self._revoke(info)

    def _revoke(self, info: WorkerInfo) -> None:
        dropped = self.buffer.drop_worker(info.worker_id)
        conn = self._conns.get(info.worker_id)
        if conn is not None:
            self._drop(conn, "revoked")
            _abort(conn.writer)
        log.warning("worker %s revoked: disconnected, %d buffered record(s) dropped", shown(info.worker_id, 60),
                    dropped)


def _attributed(t: Trajectory, worker_id: str) -> Trajectory:
    """`t` with meta.worker = `worker_id`, the connection's authenticated id."""
    if t.meta.worker == worker_id:
        return t
    return t.model_copy(update={"meta": t.meta.model_copy(update={"worker": worker_id})})


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a connection at once, whatever state its (TLS) transport is in."""
    transport = writer.transport
    if transport is not None:
        transport.abort()
