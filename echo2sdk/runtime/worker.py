"""Rollout plane: a worker process. It joins the coordinator over TCP, pulls prompts, generates a GRPO
group per prompt under its installed snapshot version v-hat, scores the responses with the task
adapter, and pushes version-tagged trajectories (with the sampler's per-token log-probs). Snapshots
arrive at any time; the newest one is verified and installed between generation batches, and the
worker switches version the moment its install completes.

Start one by hand with  `echo2 worker --connect HOST:PORT --token T`.

Trust (docs/security.md): the worker authenticates the coordinator as much as the other way round (the
token handshake of `session`, bound to the TLS certificate it sees), learns the snapshot-signing key and
its parents' certificate fingerprints only from sealed frames, and loads only plug-ins registered on this
machine or allowed by its operator (`plugin_policy`), whatever a welcome names.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import socket
import ssl
import time
import zlib
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TypeVar

from echo2sdk.core.broadcast.manifest import Manifest, verify_manifest
from echo2sdk.core.contracts import InferenceBackend, SamplingParams, Task, TaskAdapter, is_episodic
from echo2sdk.core.episodes import EpisodeStats, play_episodes
from echo2sdk.core.records import Message, Meta, Trajectory
from echo2sdk.errors import AdapterError, AuthError, BackendError, ConfigError, NameNotFound, ProtocolError
from echo2sdk.runtime import session
from echo2sdk.runtime.delivery import snapshot_frame_ok
from echo2sdk.runtime.messages import (
    MAX_ID,
    Ack,
    GetTasks,
    Heartbeat,
    Hello,
    Installed,
    Received,
    Refused,
    Shutdown,
    Snapshot,
    SnapshotPlan,
    SnapshotRejected,
    Tasks,
    Trajectories,
    Welcome,
    WireMessage,
    WireTask,
    WorkerConfig,
    clip,
    parse,
    shown,
    to_header,
)
from echo2sdk.runtime.plugin_policy import check_plugins
from echo2sdk.runtime.relay import Assembly, RelayNode, Upstream
from echo2sdk.runtime.tls import client_context
from echo2sdk.runtime.wire import DEFAULT_MAX_PAYLOAD, MAX_HEADER, encode_frame, read_frame

__all__ = ["RolloutWorker", "run_worker", "parse_address"]

log = logging.getLogger("echo2sdk.worker")

STALE_WAIT_S = 60.0  # the longest a worker waits for a snapshot it knows of before generating under its own
FROM_COORDINATOR = (Tasks, Ack, Snapshot, SnapshotPlan, Shutdown)
R = TypeVar("R", Tasks, Ack)


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--connect expects HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class RolloutWorker:
    def __init__(
        self,
        connect: str,
        token: str,
        *,
        worker_id: str | None = None,
        price_per_hour: float = 0.0,
        max_batches: int | None = None,
        connect_timeout_s: float = 60.0,
        reconnect_s: float = 120.0,
        relay: bool = True,
        relay_only: bool = False,
        relay_uplink_bps: float | None = None,
        allow_plugins: Iterable[str] = (),
        tls: bool = True,
        coordinator_fingerprint: bytes | None = None,
        relay_tls: bool | None = None,
        model: str | None = None,
    ):
        """`allow_plugins`: "pkg.mod:Attr" references this worker may import when a welcome names them (besides
        the plug-ins registered here). `tls`: False only against a coordinator started with TLS off.
        `coordinator_fingerprint`: the SHA-256 of the coordinator's certificate, pinned (`echo2 keys`).
        `relay_tls`: whether this worker's relay port speaks TLS (default: as `tls`); chunks stay verified and
        frame headers MACed without it, only the weights travel in clear.
        `model`: the model folder, built-in name or hub id to serve, instead of what the coordinator names
        (the learner's path, or its model name, which this machine may not have)."""
        self.host, self.port = parse_address(connect)
        self.token = token
        self.model = model
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        if len(self.worker_id) > MAX_ID:
            raise ConfigError(f"worker id {self.worker_id!r} is longer than {MAX_ID} characters")
        if not (math.isfinite(price_per_hour) and price_per_hour >= 0):
            raise ConfigError(f"price_per_hour = {price_per_hour!r} must be a finite number >= 0")
        self.price_per_hour, self.max_batches = price_per_hour, max_batches
        self.connect_timeout_s = connect_timeout_s
        # a lost coordinator connection (a WAN blip, or a timeout while this machine was overloaded) is
        # re-dialled for up to reconnect_s; the worker re-joins under its id with its model and version
        # (0: exit instead). `session` tells the coordinator that a re-join is this process, not a namesake.
        self.reconnect_s = reconnect_s
        self.session = os.urandom(8).hex()
        self.joins = 0
        # Chain broadcast: `relay` serves verified chunks to children (off behind a NAT that admits no
        # inbound connection: the worker is then a leaf); `relay_only` forwards snapshots and generates
        # nothing (a bandwidth helper, and the broadcast benchmark's node).
        self.relay_enabled, self.relay_only, self.relay_uplink_bps = relay or relay_only, relay_only, relay_uplink_bps
        self.allow_plugins = frozenset(allow_plugins)
        self.tls, self.pin = tls, coordinator_fingerprint
        self.relay_tls = tls if relay_tls is None else relay_tls
        self._keys: session.Session | None = None
        self.relay: RelayNode | None = None
        self._public_key: bytes | None = None
        self._received_version = 0
        self.backend: InferenceBackend | None = None
        self.adapter: TaskAdapter | None = None
        self.max_len: int | None = None  # the learner's prompt + response limit (episodes stop short of it)
        self.episode_stats = EpisodeStats()  # counters of the episodes this worker played (episodic adapters)
        # the newest snapshot not yet installed: (version, its bytes (direct push), or its assembly in the relay,
        # acquired there so the verified buffer is installed in place (no copy) and never recycled before that)
        self._pending: tuple[int, bytes | Assembly] | None = None
        self._waiters: dict[int, asyncio.Future] = {}
        self._rids = itertools.count(1)
        self._stop = asyncio.Event()
        self._shutdown = False  # the coordinator said so (as opposed to a lost connection)
        self._batch = 0
        self._stale_since: float | None = None
        self._newest = 0  # the newest snapshot version this worker has heard of (welcome, plans, pushes)
        self._held: tuple[str, list[list[dict[str, Any]]]] | None = None  # a pushed batch the coordinator never acked
        self._done = 0
        self._rate = 0.0

    @property
    def version(self) -> int:
        return self.backend.version if self.backend else self._received_version if self.relay_only else 0

    @property
    def _batches_done(self) -> bool:
        return self.max_batches is not None and self._batch >= self.max_batches

    async def _connect(self, timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        deadline, pause = time.monotonic() + timeout_s, 0.5
        tls = client_context() if self.tls else None
        while True:
            try:
                return await asyncio.open_connection(self.host, self.port, ssl=tls,
                                                     server_hostname=self.host if tls else None)
            except ssl.SSLError as e:
                raise ProtocolError(f"TLS handshake with {self.host}:{self.port} failed ({e.reason or e}); "
                                    "a coordinator started with TLS off needs  --plaintext") from None
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(2 * pause, 5.0)

    async def run(self) -> int:
        """Join, work until the coordinator says shutdown (or max_batches), re-joining after a lost
        connection for as long as reconnect_s allows. The backend and the relay live across re-joins."""
        lost_at, first_deadline = 0.0, time.monotonic() + self.connect_timeout_s
        try:
            while True:
                left = self.connect_timeout_s if self.joins == 0 else self.reconnect_s - (time.monotonic() - lost_at)
                try:
                    reader, self._writer = await self._connect(max(0.0, left))
                    lost = await self._session(reader)
                except (OSError, asyncio.IncompleteReadError) as e:  # unreachable, or closed during the handshake
                    if self.joins == 0:
                        if isinstance(e, asyncio.IncompleteReadError) and time.monotonic() < first_deadline:
                            await asyncio.sleep(1.0)  # a busy coordinator closed us before the challenge
                            continue
                        raise
                    if time.monotonic() - lost_at > self.reconnect_s:
                        log.error("could not re-join %s:%d within %.0f s (%s); giving up", self.host, self.port,
                                  self.reconnect_s, e)
                        return 1
                    await asyncio.sleep(1.0)
                    continue
                if not lost or self.reconnect_s <= 0:
                    return 0
                lost_at = time.monotonic()
                log.warning("lost the coordinator; re-dialling %s:%d for up to %.0f s", self.host, self.port, self.reconnect_s)
        finally:
            if self.relay is not None:
                self.relay.close()
            if self.backend is not None:
                self.backend.close()

    async def _session(self, reader: asyncio.StreamReader) -> bool:
        """One connection's life: handshake, then relay or roll out. True when the connection was lost
        (re-join), False when the work is over (shutdown, or max_batches done)."""
        self._stop, self._waiters, self._shutdown = asyncio.Event(), {}, False
        if self.relay is None:  # one relay node for the process: its port stays what the coordinator knows
            local_host = self._writer.get_extra_info("sockname")[0]  # serve children where we reach the learner
            self.relay = RelayNode(
                self.token, node_id=self.worker_id, host=local_host, uplink_bps=self.relay_uplink_bps,
                tls=self.relay_tls,
            )
        welcome = await self._handshake(reader)
        self.worker_id, cfg = welcome.worker_id, welcome.config
        self._newest = max(self._newest, welcome.version)
        self.relay.node_id = self.worker_id
        bcast = welcome.broadcast
        self._public_key = bcast.public_key if bcast is not None else None
        if bcast is not None and bcast.stall_timeout_s is not None:
            self.relay.stall_timeout_s = bcast.stall_timeout_s
        self.joins += 1
        log.info("worker %s %s %s:%d", self.worker_id, "joined" if self.joins == 1 else "re-joined", self.host, self.port)
        reader_task = asyncio.create_task(self._read_loop(reader))
        beat = asyncio.create_task(self._heartbeat(cfg.heartbeat_s))  # alive while loading
        try:
            if self.relay_only:
                await self._stop.wait()
            else:
                if self.backend is None:
                    await asyncio.to_thread(self._setup, cfg)
                await self._rollout_loop(cfg)
        finally:
            beat.cancel()
            reader_task.cancel()
            self._writer.close()
        return not self._shutdown and (not self._batches_done or self._held is not None)

    async def _handshake(self, reader: asyncio.StreamReader) -> Welcome:
        """Mutual authentication (echo2sdk.runtime.session): answer the challenge with a hello sealed with a key
        bound to the token, the challenge and the certificate we see; the welcome must come back sealed with
        the session key, which only a coordinator that knows the token can derive. AuthError otherwise."""
        assert self.relay is not None
        hello = Hello(
            nonce=session.new_nonce(),
            worker_id=self.worker_id,
            session=self.session,
            price_per_hour=self.price_per_hour,
            relay_port=self.relay.port if self.relay_enabled else None,
            relay_fingerprint=self.relay.fingerprint if self.relay_enabled else b"",
            version=self.version,
        )
        where = f"the coordinator at {self.host}:{self.port}"
        try:
            self._keys, answer = await session.client_handshake(reader, self._writer, self.token, to_header(hello),
                                                                pin=self.pin)
        except AuthError as e:
            raise AuthError(f"{where} failed authentication: {e}") from None
        welcome = parse(answer, (Welcome, Refused))
        if isinstance(welcome, Refused):
            raise AuthError(f"coordinator refused worker {self.worker_id!r}: {shown(welcome.reason, 200)}")
        return welcome

    def _setup(self, cfg: WorkerConfig) -> None:
        """Load the adapter and backend the welcome names: registered here, or allowed by the operator
        (ConfigError before anything is imported otherwise); options the plug-in rejects are a refusal."""
        from echo2sdk.plugins import load_adapter, load_backend_class

        check_plugins(cfg, self.allow_plugins)
        self.adapter = load_adapter(cfg.adapter, cfg.adapter_options)
        model = self.model or (cfg.model_path if cfg.model_path and os.path.isdir(cfg.model_path) else cfg.model)
        backend_cls = load_backend_class(cfg.backend)
        try:
            self.backend = backend_cls(model, **cfg.backend_options)
        except TypeError as e:
            opts = shown(cfg.backend_options)
            raise BackendError(f"backend {shown(cfg.backend)} rejected options {opts}: {e}") from None
        self.max_len = cfg.max_len

    async def _send(self, msg: WireMessage) -> None:
        assert self._keys is not None
        self._writer.write(encode_frame(to_header(msg), key=self._keys.send))  # sealed and written at once
        await self._writer.drain()

    async def _notify(self, msg: WireMessage) -> None:
        """A report the coordinator can live without (it re-sends the latest snapshot when we re-join)."""
        try:
            await self._send(msg)
        except (ConnectionError, OSError) as e:
            log.debug("could not report %s: %s", msg.type, e)

    async def _request(self, msg: WireMessage, reply: type[R], timeout: float = 60.0) -> R:
        """Send `msg` under a fresh request id and wait for the coordinator's `reply` to it."""
        if self._stop.is_set():  # the read loop has ended: nobody would ever answer (it fails the waiters it saw)
            raise ConnectionError("coordinator connection closed")
        rid = next(self._rids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        try:
            await self._send(msg.model_copy(update={"rid": rid}))
            answer = await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters.pop(rid, None)
        if not isinstance(answer, reply):
            raise ProtocolError(f"coordinator answered {msg.type} with {answer.type}, not {reply.__name__}")
        return answer

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                assert self._keys is not None
                header, payload = await read_frame(reader, DEFAULT_MAX_PAYLOAD, key=self._keys.recv,
                                                   max_header=MAX_HEADER)
                msg = parse(header, FROM_COORDINATOR)
                if payload and not isinstance(msg, Snapshot):
                    raise ProtocolError(f"a {msg.type} frame with a {len(payload)}-byte payload")
                if isinstance(msg, Snapshot):
                    self._newest = max(self._newest, msg.version)
                    if (why := snapshot_frame_ok(msg, payload)) is not None:
                        log.warning("dropping snapshot v%s: %s", msg.version, why)
                        await self._notify(SnapshotRejected(version=msg.version, reason=why))
                    elif self._pending is None or msg.version > self._pending[0]:
                        self._set_pending(msg.version, payload)
                elif isinstance(msg, SnapshotPlan):
                    self._newest = max(self._newest, msg.manifest.version)
                    asyncio.get_running_loop().create_task(self._fetch(msg))
                elif isinstance(msg, Shutdown):
                    self._shutdown = True
                    self._stop.set()
                    return
                elif (fut := self._waiters.get(msg.rid)) is not None and not fut.done():
                    fut.set_result(msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            log.warning("lost the connection to the coordinator")
        except ProtocolError as e:
            log.warning("protocol error from coordinator: %s", e)
        self._stop.set()
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(ConnectionError("coordinator connection closed"))

    async def _fetch(self, plan: SnapshotPlan) -> None:
        """Chain broadcast: verify the signed manifest, pull the chunks from the upstream list (forwarding
        each to our own children as it lands), then queue the snapshot for install."""
        assert self.relay is not None
        try:
            manifest = Manifest.from_wire(plan.manifest.model_dump())
            if self._public_key is None:
                raise ProtocolError("no broadcast public key was given at join time")
            verify_manifest(manifest, self._public_key)
        except ProtocolError as e:
            log.warning("refusing snapshot plan: %s", shown(str(e), 200))
            await self._notify(SnapshotRejected(version=plan.manifest.version, reason=clip(str(e))))
            return
        # a learner bound to a wildcard address is reached where we reach the coordinator
        upstream = [Upstream(node, self.host if host in ("0.0.0.0", "::", "") else host, port, fp)
                    for node, host, port, fp in plan.upstream]
        report = await asyncio.to_thread(self.relay.fetch, manifest, upstream)
        await self._notify(Received(**report.to_wire()))
        asm = self.relay.acquire(manifest.version) if report.ok else None
        if asm is None:
            log.warning("snapshot v%d: no upstream could serve it (%s)", manifest.version, shown(report.repairs, 300))
            return
        if not self.relay_only and (self._pending is None or manifest.version > self._pending[0]):
            self._set_pending(manifest.version, asm)
        else:
            self.relay.release(asm)
        if self.relay_only:
            self._received_version = max(self._received_version, manifest.version)
            await self._notify(Installed(version=manifest.version))

    async def _heartbeat(self, every: float) -> None:
        while not self._stop.is_set():
            await self._notify(Heartbeat(version=self.version, rollouts=self._done, rollouts_per_s=self._rate))
            await asyncio.sleep(every)

    def _set_pending(self, version: int, payload: bytes | Assembly) -> None:
        if self._pending is not None and isinstance(self._pending[1], Assembly):
            self.relay.release(self._pending[1])  # type: ignore[union-attr]
        self._pending = (version, payload)

    async def _install_pending(self) -> None:
        if self._pending is None or self.backend is None:
            return
        version, payload = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            if version <= self.version:
                return
            weights = payload.view if isinstance(payload, Assembly) else payload
            await asyncio.to_thread(self.backend.install, version, weights)
        except BackendError as e:
            log.warning("snapshot v%s refused by the backend: %s", version, e)
            await self._notify(SnapshotRejected(version=version, reason=clip(str(e))))
            return
        finally:
            if isinstance(payload, Assembly):
                self.relay.release(payload)  # type: ignore[union-attr]
        await self._notify(Installed(version=self.version, install_s=time.perf_counter() - t0))

    async def _rollout_loop(self, cfg: WorkerConfig) -> None:
        n, per_request = cfg.group_size, cfg.tasks_per_request
        base = SamplingParams(**cfg.sampling.model_dump())
        seed0 = zlib.crc32(self.worker_id.encode()) << 20  # distinct, reproducible streams per worker
        while True:
            if self._stop.is_set():
                return
            if self._held is not None:
                held = self._held
                if not await self._push(*held):
                    return
                log.info("pushed batch %s (%d groups) held across the re-join", held[0], len(held[1]))
            if self._batches_done:
                return
            await self._install_pending()
            if await self._too_stale(cfg.staleness):
                continue
            batch, self._batch = self._batch, self._batch + 1  # counts on across re-joins
            params = replace(base, seed=seed0 + batch) if base.seed is None else base
            try:
                reply = await self._request(GetTasks(n=per_request), Tasks)
            except (ConnectionError, TimeoutError, ProtocolError):
                return
            tasks = [_task(t) for t in reply.tasks]
            if not tasks:
                await asyncio.sleep(0.5)
                continue
            t0 = time.perf_counter()
            groups = await asyncio.to_thread(self._rollout, tasks, n, params)
            dt = time.perf_counter() - t0
            self._done += sum(len(g) for g in groups)
            inst = sum(len(g) for g in groups) / max(dt, 1e-6)
            self._rate = inst if self._rate == 0 else 0.7 * self._rate + 0.3 * inst
            if not await self._push(f"{self.session}:{batch}", groups):
                return

    async def _too_stale(self, staleness: int | None) -> bool:
        """True (after a short wait) while a snapshot more than S versions ahead of the installed one is on
        its way: records generated now would be older than v_t - S on arrival and rejected (a late joiner,
        or a worker back from a freeze). Gives up waiting after STALE_WAIT_S, in case no snapshot comes."""
        if staleness is None or self._newest - self.version <= staleness:
            self._stale_since = None
            return False
        now = time.monotonic()
        if self._stale_since is None:
            self._stale_since = now
            log.info("v%d installed, v%d published: waiting for it before generating", self.version, self._newest)
        if now - self._stale_since > STALE_WAIT_S:
            return False
        await asyncio.sleep(0.2)
        return True

    async def _push(self, batch_id: str, groups: list[list[dict[str, Any]]]) -> bool:
        """Push one batch's groups. When the connection is lost on the way they are held and pushed again
        after the re-join under the same id: the coordinator admits a batch once (staleness is judged
        then, as for any record), so nothing generated is lost and nothing is counted twice."""
        try:
            ack = await self._request(Trajectories(batch=batch_id, groups=groups), Ack)
        except (ConnectionError, TimeoutError, ProtocolError):
            self._held = (batch_id, groups)
            return False
        self._held = None
        if ack.duplicate:
            log.info("batch %s had reached the coordinator before the connection was lost", batch_id)
        if ack.rejected:
            log.warning("coordinator rejected %d group(s): %s", len(ack.rejected), shown(list(ack.rejected), 200))
        return True

    def _rollout(self, tasks: list[Task], n: int, params: SamplingParams) -> list[list[dict[str, Any]]]:
        """Generate n samples per task under the installed version v-hat and score them (rollout plane).
        Episodic adapters (multi-turn sandboxes) play n episodes per task instead: `_rollout_episodes`."""
        assert self.backend is not None and self.adapter is not None
        if is_episodic(self.adapter):
            return self._rollout_episodes(tasks, n, params)
        version = self.backend.version  # v-hat: installs only happen between batches
        prompt_ids = [self.backend.encode_chat(t.messages) for t in tasks]
        samples = self.backend.generate([p for p in prompt_ids for _ in range(n)], params)
        groups = []
        for i, task in enumerate(tasks):
            prompt = tuple(Message(role=m["role"], content=m["content"]) for m in task.messages)
            group = []
            for s in samples[i * n : (i + 1) * n]:
                score = self.adapter.score(task, s.text)
                meta = Meta(
                    group_id=task.id,
                    prompt_ids=tuple(prompt_ids[i]),
                    response_ids=tuple(s.token_ids),
                    logprobs=tuple(min(lp, 0.0) for lp in s.logprobs),
                    worker=self.worker_id,
                    extra={"correct": score.correct, "finish_reason": s.finish_reason},
                )
                t = Trajectory(prompt=prompt, response=s.text, reward=float(score.reward), version=version, meta=meta)
                group.append(t.to_wire())
            groups.append(group)
        return groups

    def _rollout_episodes(self, tasks: list[Task], n: int, params: SamplingParams) -> list[list[dict[str, Any]]]:
        """Play n episodes per task under v-hat, one record per episode (see echo2sdk.core.episodes). A
        sandbox that raises becomes a recorded failed episode; the worker goes on."""
        assert self.backend is not None and self.adapter is not None
        groups = play_episodes(
            self.backend,
            self.adapter,  # type: ignore[arg-type]
            tasks,
            n,
            params,
            version=self.backend.version,
            worker_id=self.worker_id,
            max_len=self.max_len,
            stats=self.episode_stats,
        )
        return [[t.to_wire() for t in g] for g in groups]


def _task(t: WireTask) -> Task:
    return Task(id=t.id, messages=t.messages, answer=t.answer, info=t.info)


def run_worker(connect: str, token: str, **kwargs: Any) -> int:
    """Blocking entry point for `echo2 worker`. Returns a process exit code: 2 when either side refused the
    other (token, certificate, a plug-in this worker may not load), 1 when the coordinator is unreachable."""
    try:
        return asyncio.run(RolloutWorker(connect, token, **kwargs).run())
    except ProtocolError as e:  # AuthError included
        log.error("%s", e)
        return 2
    except (ConfigError, AdapterError, BackendError, NameNotFound) as e:
        log.error("refusing the coordinator's worker config: %s", e)
        return 2
    except OSError as e:
        log.error("cannot reach the coordinator at %s: %s", connect, e)
        return 1
