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
whatever a welcome names. A per-worker credential (runtime/trust/worker_keys.py) stands in for the token.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import ssl
import time
from collections.abc import Iterable
from typing import Any

from echo2sdk.core.contracts import InferenceBackend, SamplingParams, Task, TaskAdapter, is_episodic
from echo2sdk.core.episodes import EpisodeStats, play_episodes
from echo2sdk.core.rollout import RolloutStats, generate_groups
from echo2sdk.errors import AdapterError, AuthError, BackendError, ConfigError, NameNotFound, ProtocolError
from echo2sdk.runtime.broadcast.relay import RelayNode
from echo2sdk.runtime.protocol.messages import (
    MAX_ID,
    MAX_PRICE,
    BaseFiles,
    Heartbeat,
    Hello,
    Refused,
    Snapshot,
    SnapshotInStore,
    SnapshotPlan,
    Welcome,
    WireMessage,
    WorkerConfig,
    parse,
    shown,
    to_header,
)
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.plugin_policy import check_plugins, enforced
from echo2sdk.runtime.trust.tls import client_context
from echo2sdk.runtime.trust.worker_keys import Credential
from echo2sdk.runtime.worker.bootstrap import Bootstrap
from echo2sdk.runtime.worker.link import CoordinatorLink
from echo2sdk.runtime.worker.rollout_loop import RolloutLoop
from echo2sdk.runtime.worker.inbox import SnapshotInbox

__all__ = ["RolloutWorker", "Refusal", "run_worker", "parse_address"]

log = logging.getLogger("echo2sdk.worker")

JOIN_S = 30.0  # joining a coordinator: TLS, challenge, hello and the welcome (or refusal) together
MIN_DIAL_S = 1.0  # the least one dial or handshake is given, even at the very end of a window


def _bounded(deadline: float) -> float:
    """Seconds one dial or handshake may take: JOIN_S, or what is left before `deadline` (at least
    MIN_DIAL_S, so that the last attempt of a window is a real one)."""
    return max(MIN_DIAL_S, min(JOIN_S, deadline - time.monotonic()))


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--connect expects HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _checked_id(token: str | None, credential: Credential | None, worker_id: str | None, *, price_per_hour: float,
                bootstrap: bool, model: str | None, relay_only: bool) -> str:
    """The id this worker joins under (a credential's own name, or `worker_id`, or HOST-PID), once the
    constructor's arguments are checked; ConfigError naming the first one that is wrong."""
    if (token is None) == (credential is None):
        raise ConfigError("give a worker either the run token or a worker credential (one of the two)")
    if credential is not None:
        if worker_id not in (None, credential.name):
            raise ConfigError(f"worker id {worker_id!r}: a credential logs in as its own name {credential.name!r}")
        worker_id = credential.name
    if bootstrap and (model or relay_only):
        raise ConfigError("--bootstrap takes the model from the coordinator: give neither --model nor --relay-only")
    worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
    if len(worker_id) > MAX_ID:
        raise ConfigError(f"worker id {worker_id!r} is longer than {MAX_ID} characters")
    if any(c.isspace() or not c.isprintable() for c in worker_id):
        raise ConfigError(f"worker id {worker_id!r}: no whitespace or control characters")
    if not (math.isfinite(price_per_hour) and 0 <= price_per_hour <= MAX_PRICE):
        raise ConfigError(f"price_per_hour = {price_per_hour!r} must be a number in [0, {MAX_PRICE:g}]")
    return worker_id


class RolloutWorker:
    """One worker process. Its parts: `link` (the sealed connection to the coordinator, link.py), `inbox`
    (pending snapshot, relay node, install: inbox.py), `boot` (a model taken from the coordinator:
    bootstrap.py) and `loop` (the batch loop: rollout_loop.py); it rolls out with core.rollout (single-turn)
    or core.episodes (episodic adapters).

    `token`: the run token; None with a `credential` (`echo2 keys worker NAME`), which logs in as worker
    NAME without the token. `allow_plugins`: "pkg.mod:Attr" references this worker may import when a welcome
    names them (besides the plug-ins registered here). `tls`: False only against a coordinator started with
    TLS off. `coordinator_fingerprint`: the SHA-256 of the coordinator's certificate, pinned (`echo2 keys`).
    `relay_tls`: whether this worker's relay port speaks TLS (default: as `tls`); chunks stay verified and
    frame headers MACed without it, only the weights travel in clear. `relay_port`: the port the relay listens
    on (0: any free one; a fixed one is what a cloud firewall can open).
    `model`: the model folder, built-in name or hub id to serve, instead of what the coordinator names
    (the learner's path, or its model name, which this machine may not have).
    `bootstrap`: this machine has no model: take its files and weights from the coordinator
    (runtime/broadcast/bootstrap.py) into a folder under `cache_dir` (default: weights.default_cache_dir()).
    """

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
        relay_port: int = 0,
        model: str | None = None,
        bootstrap: bool = False,
        cache_dir: str | None = None,
    ):
        self.host, self.port = parse_address(connect)
        self.token, self.credential, self.model = token, credential, model
        self.worker_id = _checked_id(token, credential, worker_id, price_per_hour=price_per_hour, bootstrap=bootstrap,
                                     model=model, relay_only=relay_only)
        self.bootstrap, self.base_refused = bootstrap, {}  # base files refused (not written), by reason
        self.price_per_hour, self.connect_timeout_s = price_per_hour, connect_timeout_s
        # a lost coordinator connection (a WAN blip, or a timeout while this machine was overloaded) is
        # re-dialled for up to reconnect_s; the worker re-joins under its id with its model and version
        # (0: exit instead). `session` tells the coordinator that a re-join is this process, not a namesake.
        self.reconnect_s, self.session, self.joins = reconnect_s, os.urandom(8).hex(), 0
        # Chain broadcast: `relay` serves verified chunks to children (off behind a NAT that admits no
        # inbound connection: the worker is then a leaf); `relay_only` forwards snapshots and generates
        # nothing (a bandwidth helper, and the broadcast benchmark's node).
        self.relay_enabled, self.relay_only, self.relay_uplink_bps = relay or relay_only, relay_only, relay_uplink_bps
        self.allow_plugins = frozenset(allow_plugins)
        self.tls, self.pin = tls, coordinator_fingerprint
        self.relay_tls, self.relay_port = (tls if relay_tls is None else relay_tls), int(relay_port)
        self.backend: InferenceBackend | None = None
        self.adapter: TaskAdapter | None = None
        self.adapter_name = ""
        self.max_len: int | None = None  # the learner's prompt + response limit (episodes stop short of it)
        self.max_prompt_length: int | None = None  # longer single-turn prompts keep their last tokens only
        # rollouts the adapter failed, by reason, and the groups dropped for them (reported in the heartbeat);
        # failed episodes are counted in the same place
        self.stats = RolloutStats()
        self.episode_stats = EpisodeStats(failures=self.stats.failures)  # counters of the episodes played
        self.link = CoordinatorLink()
        self.inbox = SnapshotInbox(self.link, self.host, relay_only, self.allow_plugins)
        self.boot = Bootstrap(self.link, self.inbox, cache_dir)
        self.loop = RolloutLoop(self.link, self.inbox, self, session=self.session, max_batches=max_batches)
        self._joining = False  # between dialling and a verified welcome: a ProtocolError then may be forged

    @property
    def version(self) -> int:
        return self.backend.version if self.backend else self.inbox.received if self.relay_only else 0

    async def _connect(self, deadline: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Dial until `deadline` (monotonic). One dial, TLS handshake included, never outlasts it: a port taken
        over by something that accepts and stays silent must not hold the worker past its window."""
        pause = 0.5
        tls = client_context() if self.tls else None
        while True:
            try:
                async with asyncio.timeout(_bounded(deadline)):
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
                    deadline = first_deadline
                else:
                    assert lost_at is not None  # a re-dial follows a lost session or a failed re-dial: both set it
                    deadline = lost_at + self.reconnect_s
                self._joining = True  # until the handshake is done (_session)
                try:
                    reader, writer = await self._connect(deadline)
                    lost = await self._session(reader, writer, deadline if self.joins else None)
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
            if self.inbox.relay is not None:
                self.inbox.relay.close()
            if self.backend is not None:
                self.backend.close()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       rejoin_by: float | None = None) -> bool:
        """One connection's life: handshake, then relay or roll out. True when the connection was lost
        (re-join), False when the work is over (shutdown, or max_batches done). A re-join's handshake ends by
        `rejoin_by` (the end of the re-join window) at the latest."""
        self.link.reset()
        if self.inbox.relay is None:  # one relay node for the process: its port stays what the coordinator knows
            local_host = writer.get_extra_info("sockname")[0]  # serve children where we reach the learner
            self.inbox.relay = RelayNode(
                self.token, node_id=self.worker_id, host=local_host, port=self.relay_port,
                uplink_bps=self.relay_uplink_bps, tls=self.relay_tls,
            )
        limit = JOIN_S if rejoin_by is None else _bounded(rejoin_by)
        try:
            async with asyncio.timeout(limit):  # a peer that accepts and stays silent cannot hold us
                keys, welcome = await self._handshake(reader, writer)
        except BaseException as e:
            writer.close()
            if isinstance(e, TimeoutError):
                raise TimeoutError(f"no answer to the handshake from {self.host}:{self.port} within "
                                   f"{limit:.1f} s") from None
            raise
        self._joining = False
        self.link.open(reader, writer, keys)
        self.worker_id, cfg = welcome.worker_id, welcome.config
        self.inbox.heard_of(welcome.version)
        self.inbox.relay.node_id = self.worker_id
        self.inbox.on_welcome(welcome.broadcast)
        self.joins += 1
        log.info("worker %s %s %s:%d", self.worker_id, "joined" if self.joins == 1 else "re-joined", self.host, self.port)
        reader_task = asyncio.create_task(self.link.read_loop(self._on_message))
        beat = asyncio.create_task(self._heartbeat(cfg.heartbeat_s))  # alive while loading
        try:
            if self.relay_only:
                await self.link.stop.wait()
            else:
                if self.backend is None:
                    if self.bootstrap and self.model is None:
                        self.model, self.base_refused = await self.boot.fetch()
                    await asyncio.to_thread(self._setup, cfg)
                await self.loop.run(cfg, self.worker_id)
        finally:
            beat.cancel()
            reader_task.cancel()
            writer.close()
        return not self.link.shutdown and (not self.loop.finished or self.loop.held is not None)

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> tuple[session.Session, Welcome]:
        """Mutual authentication (echo2sdk.runtime.trust.session): answer the challenge with a hello sealed with a key
        bound to the token, the challenge and the certificate we see; the welcome must come back sealed with
        the session key, which only a coordinator that knows the token can derive. AuthError otherwise.
        Returns the session's keys and the welcome."""
        relay = self.inbox.relay
        assert relay is not None
        hello = Hello(
            nonce=session.new_nonce(),
            worker_id=self.worker_id,
            session=self.session,
            price_per_hour=self.price_per_hour,
            relay_port=relay.port if self.relay_enabled else None,
            relay_fingerprint=relay.fingerprint if self.relay_enabled else b"",
            version=self.version,
        )
        where = f"the coordinator at {self.host}:{self.port}"
        secret = self.credential.key if self.credential is not None else self.token
        assert secret is not None
        try:
            keys, answer, sealed = await session.client_handshake(reader, writer, secret, to_header(hello), pin=self.pin)
        except AuthError as e:
            raise AuthError(f"{where} failed authentication: {e}") from None
        welcome = parse(answer, (Welcome, Refused))
        if isinstance(welcome, Refused):
            why = f"coordinator refused worker {self.worker_id!r}: {shown(welcome.reason, 200)}"
            if sealed or self.joins == 0:  # the coordinator's word (sealed), or a first join (a wrong token)
                raise Refusal(why)
            raise AuthError(f"{why} (unsealed: possibly not the coordinator)")
        return keys, welcome

    def _setup(self, cfg: WorkerConfig) -> None:
        """Load the adapter and backend the welcome names: registered here, or allowed by the operator
        (ConfigError before anything is imported otherwise); options the plug-in rejects are a refusal."""
        from echo2sdk.plugins import load_adapter, load_backend_class

        check_plugins(cfg, self.allow_plugins)
        with enforced(self.allow_plugins):  # each adapter judged again as it loads, a mixture's components too
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

    async def _on_message(self, msg: WireMessage, payload: bytes) -> None:
        """What the read loop does not answer itself: snapshots, snapshot plans and base files."""
        if isinstance(msg, Snapshot):
            await self.inbox.on_push(msg, payload)
        elif isinstance(msg, SnapshotPlan):
            self.inbox.on_plan(msg)
        elif isinstance(msg, SnapshotInStore):
            self.inbox.on_store_hint(msg)
        elif isinstance(msg, BaseFiles):
            self.boot.base = (msg, payload)

    async def _heartbeat(self, every: float) -> None:
        while not self.link.stop.is_set():
            await self.link.notify(Heartbeat(version=self.version, rollouts=self.loop.done,
                                             rollouts_per_s=self.loop.rate, failures=self.stats.failures.as_dict(),
                                             groups_dropped=self.stats.groups_dropped + self.episode_stats.dropped_groups
                                             + sum(self.loop.left_out.values())))
            await asyncio.sleep(every)

    async def install_pending(self) -> None:
        """Install the newest snapshot received, if any, between generation batches (the loop's install step)."""
        await self.inbox.install(self.backend)

    def rollout(self, tasks: list[Task], n: int, params: SamplingParams) -> list[list[dict[str, Any]]]:
        """Generate n samples per task under the installed version v-hat and score them (rollout plane), as wire
        records: core.rollout.generate_groups. A sample the adapter fails to score (core/failures.py) is counted
        by reason and its group is not sent (GRPO normalizes over the whole group); the worker goes on. Episodic
        adapters (multi-turn sandboxes) play n episodes per task instead, one record per episode
        (core.episodes.play_episodes): a sandbox that raises becomes a recorded failed episode."""
        backend, adapter = self.backend, self.adapter
        assert backend is not None and adapter is not None
        version = backend.version  # v-hat: installs only happen between batches
        if is_episodic(adapter):
            groups = play_episodes(backend, adapter, tasks, n, params, version=version,  # type: ignore[arg-type]
                                   worker_id=self.worker_id, max_len=self.max_len, stats=self.episode_stats)
        else:
            groups = generate_groups(backend, adapter, tasks, n, params, version=version, worker_id=self.worker_id,
                                     max_prompt_length=self.max_prompt_length, stats=self.stats,
                                     adapter_name=self.adapter_name)
        return [[t.to_wire() for t in g] for g in groups]


class Refusal(AuthError):
    """The coordinator refused this worker: sealed with the session key (revoked, quarantined, ...), or a plain
    refusal of a first join (a wrong token). Final: the worker exits."""


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
