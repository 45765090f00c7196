"""Rollout plane: a worker process. It joins the coordinator over TCP, pulls prompts, generates a GRPO
group per prompt under its installed snapshot version v-hat, scores the responses with the task
adapter, and pushes version-tagged trajectories (with the sampler's per-token log-probs). Snapshots
arrive at any time; the newest one is verified and installed between generation batches, and the
worker switches version the moment its install completes.

Start one by hand with  `echo2 worker --connect HOST:PORT --token T`.

Trust (docs/security.md): the worker authenticates the coordinator as much as the other way round (the
token handshake of `session`, bound to the TLS certificate it sees), learns the snapshot-signing key and
its parents' certificate fingerprints and the relay keys of the versions it is handed only from sealed
frames, and loads only plug-ins registered on this machine or allowed by its operator (`plugin_policy`),
whatever a welcome names. A per-worker credential (runtime/worker_keys.py) stands in for the token.
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
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from echo2sdk.core.broadcast.manifest import Manifest, verify_manifest
from echo2sdk.core.contracts import InferenceBackend, SamplingParams, Task, TaskAdapter, is_episodic
from echo2sdk.core.episodes import EpisodeStats, play_episodes
from echo2sdk.core.failures import Failures, as_reward, failure_reason
from echo2sdk.core.records import Message, Meta, Trajectory, sampler_logprob
from echo2sdk.errors import AdapterError, AuthError, BackendError, ConfigError, NameNotFound, ProtocolError
from echo2sdk.runtime import session
from echo2sdk.runtime.bootstrap import write_base
from echo2sdk.runtime.delivery import snapshot_frame_ok
from echo2sdk.runtime.messages import (
    MAX_ID,
    MAX_PRICE,
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
from echo2sdk.runtime.worker_keys import Credential
from echo2sdk.runtime.tls import client_context
from echo2sdk.runtime.wire import DEFAULT_MAX_PAYLOAD, MAX_HEADER, encode_frame, read_frame

__all__ = ["RolloutWorker", "run_worker", "parse_address"]

log = logging.getLogger("echo2sdk.worker")

STALE_WAIT_S = 60.0  # the longest a worker waits for a snapshot it knows of before generating under its own
LOGGED_FAILURES = 3  # adapter failures logged one by one per reason; the rest are counted only
FROM_COORDINATOR = (Tasks, Ack, Snapshot, SnapshotPlan, Shutdown, BaseFiles)
HANDSHAKE_S = 30.0  # TLS, challenge, hello and the welcome (or refusal) together
BOOTSTRAP_WAIT_S = 600.0  # the longest a bootstrapping worker waits for the base files, then for the weights
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
        token: str | None,
        *,
        credential: Credential | None = None,
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
        bootstrap: bool = False,
        cache_dir: str | None = None,
    ):
        """`token`: the run token; None with a `credential` (`echo2 keys worker NAME`), which logs in as worker
        NAME without the token. `allow_plugins`: "pkg.mod:Attr" references this worker may import when a welcome names them (besides
        the plug-ins registered here). `tls`: False only against a coordinator started with TLS off.
        `coordinator_fingerprint`: the SHA-256 of the coordinator's certificate, pinned (`echo2 keys`).
        `relay_tls`: whether this worker's relay port speaks TLS (default: as `tls`); chunks stay verified and
        frame headers MACed without it, only the weights travel in clear.
        `model`: the model folder, built-in name or hub id to serve, instead of what the coordinator names
        (the learner's path, or its model name, which this machine may not have).
        `bootstrap`: this machine has no model: take its files and weights from the coordinator
        (runtime/bootstrap.py) into a folder under `cache_dir` (default: weights.default_cache_dir())."""
        self.host, self.port = parse_address(connect)
        self.token, self.credential = token, credential
        if (token is None) == (credential is None):
            raise ConfigError("give a worker either the run token or a worker credential (one of the two)")
        if credential is not None:
            if worker_id not in (None, credential.name):
                raise ConfigError(f"worker id {worker_id!r}: a credential logs in as its own name {credential.name!r}")
            worker_id = credential.name
        self.model = model
        if bootstrap and (model or relay_only):
            raise ConfigError("--bootstrap takes the model from the coordinator: give neither --model nor --relay-only")
        self.bootstrap, self.cache_dir = bootstrap, cache_dir
        self._base: tuple[BaseFiles, bytes] | None = None  # the base files, as the coordinator sent them
        self.base_refused: dict[str, int] = {}  # base files refused (not written), by reason
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        if len(self.worker_id) > MAX_ID:
            raise ConfigError(f"worker id {self.worker_id!r} is longer than {MAX_ID} characters")
        if any(c.isspace() or not c.isprintable() for c in self.worker_id):
            raise ConfigError(f"worker id {self.worker_id!r}: no whitespace or control characters")
        if not (math.isfinite(price_per_hour) and 0 <= price_per_hour <= MAX_PRICE):
            raise ConfigError(f"price_per_hour = {price_per_hour!r} must be a number in [0, {MAX_PRICE:g}]")
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
        self.max_prompt_length: int | None = None  # longer single-turn prompts keep their last tokens only
        self.prompts_truncated = 0
        self.adapter_name = ""
        # rollouts the adapter failed, by reason, and the groups dropped for them (reported in the heartbeat);
        # failed episodes are counted in the same place
        self.failures = Failures()
        self.groups_dropped = 0
        self.episode_stats = EpisodeStats(failures=self.failures)  # counters of the episodes played (episodic adapters)
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
        self._joining = False  # between dialling and a verified welcome: a ProtocolError then may be forged
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
        lost_at: float | None = None
        first_deadline = time.monotonic() + self.connect_timeout_s
        try:
            while True:
                if self.joins == 0:
                    left = self.connect_timeout_s
                else:
                    assert lost_at is not None  # a re-dial follows a lost session or a failed re-dial: both set it
                    left = self.reconnect_s - (time.monotonic() - lost_at)
                self._joining = True  # until the handshake is done (_session)
                try:
                    reader, self._writer = await self._connect(max(0.0, left))
                    lost = await self._session(reader)
                except ProtocolError as e:  # AuthError included
                    # At a re-join only a refusal sealed by the coordinator is final: a plain refusal, garbage, a
                    # failed TLS handshake or a certificate that is not the pinned one can come from anyone on the
                    # path, and must not end a worker that a lost connection would not have ended.
                    if self.joins == 0 or isinstance(e, Refusal) or not self._joining:
                        raise
                    assert lost_at is not None
                    if time.monotonic() - lost_at > self.reconnect_s:
                        log.error("could not re-join %s:%d within %.0f s; the last answer: %s", self.host, self.port,
                                  self.reconnect_s, e)
                        raise
                    log.warning("re-join of %s:%d failed, not on the coordinator's word (%s); re-dialling", self.host,
                                self.port, e)
                    await asyncio.sleep(1.0)
                    continue
                except (OSError, asyncio.IncompleteReadError) as e:  # unreachable, or closed during the handshake
                    if self.joins == 0:
                        if isinstance(e, asyncio.IncompleteReadError) and time.monotonic() < first_deadline:
                            await asyncio.sleep(1.0)  # a busy coordinator closed us before the challenge
                            continue
                        raise
                    lost_at = time.monotonic() if lost_at is None else lost_at
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
        try:
            async with asyncio.timeout(HANDSHAKE_S):  # a peer that accepts and stays silent cannot hold us
                welcome = await self._handshake(reader)
        except BaseException as e:
            self._writer.close()
            if isinstance(e, TimeoutError):
                raise TimeoutError(f"no answer to the handshake from {self.host}:{self.port} within "
                                   f"{HANDSHAKE_S:.0f} s") from None
            raise
        self._joining = False
        self.worker_id, cfg = welcome.worker_id, welcome.config
        self._newest = max(self._newest, welcome.version)
        self.relay.node_id = self.worker_id
        bcast = welcome.broadcast
        self._public_key = bcast.public_key if bcast is not None else None
        self.relay.add_relay_keys(bcast.relay_keys if bcast is not None else ())
        if bcast is not None and bcast.stall_timeout_s is not None:
            self.relay.stall_timeout_s = bcast.stall_timeout_s
        if bcast is not None and bcast.min_relay_bps is not None:
            self.relay.min_relay_bps = bcast.min_relay_bps
        self.joins += 1
        log.info("worker %s %s %s:%d", self.worker_id, "joined" if self.joins == 1 else "re-joined", self.host, self.port)
        reader_task = asyncio.create_task(self._read_loop(reader))
        beat = asyncio.create_task(self._heartbeat(cfg.heartbeat_s))  # alive while loading
        try:
            if self.relay_only:
                await self._stop.wait()
            else:
                if self.backend is None:
                    if self.bootstrap and self.model is None:
                        await self._bootstrap()
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
        secret = self.credential.key if self.credential is not None else self.token
        assert secret is not None
        try:
            self._keys, answer, sealed = await session.client_handshake(reader, self._writer, secret,
                                                                        to_header(hello), pin=self.pin)
        except AuthError as e:
            raise AuthError(f"{where} failed authentication: {e}") from None
        welcome = parse(answer, (Welcome, Refused))
        if isinstance(welcome, Refused):
            why = f"coordinator refused worker {self.worker_id!r}: {shown(welcome.reason, 200)}"
            if sealed or self.joins == 0:  # the coordinator's word (sealed), or a first join (a wrong token)
                raise Refusal(why)
            raise AuthError(f"{why} (unsealed: possibly not the coordinator)")
        return welcome

    def _setup(self, cfg: WorkerConfig) -> None:
        """Load the adapter and backend the welcome names: registered here, or allowed by the operator
        (ConfigError before anything is imported otherwise); options the plug-in rejects are a refusal."""
        from echo2sdk.plugins import load_adapter, load_backend_class

        check_plugins(cfg, self.allow_plugins)
        self.adapter = load_adapter(cfg.adapter, cfg.adapter_options)
        self.adapter_name = cfg.adapter
        model = self.model or (cfg.model_path if cfg.model_path and os.path.isdir(cfg.model_path) else cfg.model)
        backend_cls = load_backend_class(cfg.backend)
        try:
            self.backend = backend_cls(model, **cfg.backend_options)
        except TypeError as e:
            opts = shown(cfg.backend_options)
            raise BackendError(f"backend {shown(cfg.backend)} rejected options {opts}: {e}") from None
        self.max_len = cfg.max_len
        self.max_prompt_length = cfg.max_prompt_length

    async def _bootstrap(self) -> None:
        """No model here: ask for the base files, take the first snapshot that arrives (over the run's delivery,
        verified as any snapshot) as the weights, write both into a cache folder and serve that folder. The
        snapshot stays pending: a version above 0 is then installed as usual, which sets the backend's version."""
        from echo2sdk.weights import default_cache_dir

        t0 = time.perf_counter()
        await self._send(GetBase())
        await self._wait_until(lambda: self._base is not None, "the base files")
        await self._wait_until(lambda: self._pending is not None, "the first snapshot")
        assert self._base is not None and self._pending is not None
        (msg, payload), (version, snap) = self._base, self._pending
        self._pending = None  # ours while it is written: a newer snapshot arriving meanwhile does not release it
        weights = snap.view if isinstance(snap, Assembly) else snap
        try:
            folder, refused = await asyncio.to_thread(write_base, self.cache_dir or default_cache_dir(), msg, payload,
                                                      weights)
        finally:
            if self._pending is None:
                self._pending = (version, snap)
            elif isinstance(snap, Assembly):
                self.relay.release(snap)  # type: ignore[union-attr]
        self.model, self.base_refused, self._base = str(folder), dict(refused), None
        log.info("bootstrapped from the coordinator in %.1f s: %d base file(s) (%d bytes, %d refused) and snapshot v%d "
                 "(%d bytes) in %s", time.perf_counter() - t0, len(msg.files), len(payload), sum(refused.values()),
                 version, len(weights), folder)

    async def _wait_until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + BOOTSTRAP_WAIT_S
        while not ready():
            if self._stop.is_set():
                raise ConnectionError(f"the coordinator connection closed while waiting for {what}")
            if time.monotonic() > deadline:
                raise ProtocolError(f"the coordinator sent no {what} within {BOOTSTRAP_WAIT_S:.0f} s")
            await asyncio.sleep(0.05)

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
                if payload and not isinstance(msg, (Snapshot, BaseFiles)):
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
                elif isinstance(msg, BaseFiles):
                    self._base = (msg, payload)
                elif isinstance(msg, Shutdown):  # a request still in flight fails at once (below), not at its timeout
                    self._shutdown = True
                    break
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
        self.relay.add_relay_keys(plan.relay_keys)
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
            await self._notify(Heartbeat(version=self.version, rollouts=self._done, rollouts_per_s=self._rate,
                                         failures=self.failures.as_dict(),
                                         groups_dropped=self.groups_dropped + self.episode_stats.dropped_groups))
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
        A sample the adapter fails to score (core/failures.py) is counted by reason and its group is not sent
        (GRPO normalizes over the whole group); the worker goes on. Episodic adapters (multi-turn sandboxes)
        play n episodes per task instead: `_rollout_episodes`."""
        assert self.backend is not None and self.adapter is not None
        if is_episodic(self.adapter):
            return self._rollout_episodes(tasks, n, params)
        version = self.backend.version  # v-hat: installs only happen between batches
        encoded = [self.backend.encode_chat(t.messages) for t in tasks]
        prompt_ids = [self._truncated(p) for p in encoded]
        samples = self.backend.generate([p for p in prompt_ids for _ in range(n)], params)
        groups = []
        for i, task in enumerate(tasks):
            cut = len(prompt_ids[i]) < len(encoded[i])
            group = [self._scored(task, prompt_ids[i], s, version, cut) for s in samples[i * n : (i + 1) * n]]
            if any(t is None for t in group):
                self.groups_dropped += 1
                continue
            groups.append(group)
        return groups

    def _truncated(self, prompt_ids: list[int]) -> list[int]:
        """The prompt's last max_prompt_length tokens (TRL truncates prompts from the left); counted."""
        limit = self.max_prompt_length
        if limit is None or len(prompt_ids) <= limit:
            return prompt_ids
        self.prompts_truncated += 1
        if self.prompts_truncated == 1:
            log.warning("a prompt of %d tokens is truncated from the left to max_prompt_length=%d (counted in the "
                        "task metrics as prompt_truncated)", len(prompt_ids), limit)
        return prompt_ids[-limit:]

    def _scored(self, task: Task, prompt_ids: list[int], s: Any, version: int, cut: bool = False) -> dict[str, Any] | None:
        """One sample scored by the adapter, as a wire record; None (counted and logged) when the adapter's
        score raised or gave a reward that is not a finite real number."""
        try:
            score = self.adapter.score(task, s.text)  # type: ignore[union-attr]
            reward = as_reward(getattr(score, "reward", None))
            meta = Meta(
                group_id=task.id,
                prompt_ids=tuple(prompt_ids),
                response_ids=tuple(s.token_ids),
                logprobs=tuple(sampler_logprob(lp) for lp in s.logprobs),
                worker=self.worker_id,
                extra={"correct": score.correct, "finish_reason": s.finish_reason, "prompt_truncated": cut},
            )
        except Exception as e:  # noqa: BLE001 - a bad rollout is data, not a crash
            reason = failure_reason(e)
            self.failures.add(reason)
            if self.failures.counts[reason] <= LOGGED_FAILURES:
                log.warning("adapter %s failed on task %s (%s): %s: %s; its group is dropped", shown(self.adapter_name),
                            shown(task.id), reason, type(e).__name__, shown(str(e), 200))
            return None
        prompt = tuple(Message(role=m["role"], content=m["content"]) for m in task.messages)
        return Trajectory(prompt=prompt, response=s.text, reward=reward, version=version, meta=meta).to_wire()

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


class Refusal(AuthError):
    """The coordinator refused this worker: sealed with the session key (revoked, quarantined, ...), or a plain
    refusal of a first join (a wrong token). Final: the worker exits."""


def _task(t: WireTask) -> Task:
    return Task(id=t.id, messages=t.messages, answer=t.answer, info=t.info)


def run_worker(connect: str, token: str | None, **kwargs: Any) -> int:
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
