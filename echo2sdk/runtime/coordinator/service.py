"""`Coordinator`: the learner's side of the fleet, composed of its parts (see the package docstring). What the
trainer, the tests and the benches use of it is here; what it does is in the part each method names."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.contracts import Task
from echo2sdk.core.prompt_filter import PromptFilter
from echo2sdk.errors import ConfigError
from echo2sdk.runtime.broadcast.bootstrap import ModelFolder
from echo2sdk.runtime.broadcast.delivery import DirectPush, SnapshotDelivery, check_delivery
from echo2sdk.runtime.broadcast.store import SnapshotStore
from echo2sdk.runtime.coordinator.connection import WRITE_TIMEOUT_S, WriteLimit
from echo2sdk.runtime.coordinator.handout import Handout
from echo2sdk.runtime.coordinator.handshake import Handshake
from echo2sdk.runtime.coordinator.intake import Intake
from echo2sdk.runtime.coordinator.registry import Registry
from echo2sdk.runtime.coordinator.worker_info import WorkerInfo
from echo2sdk.runtime.coordinator.server import Server
from echo2sdk.runtime.coordinator.publications import Publications
from echo2sdk.runtime.protocol.messages import WorkerConfig
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.admission import Admission
from echo2sdk.runtime.trust.credentials import new_token
from echo2sdk.runtime.trust.tls import Identity
from echo2sdk.runtime.trust.worker_keys import Revocations

__all__ = ["Coordinator", "checked_worker_config"]


class Coordinator:
    """Worker registry (`registry`), trajectory intake (`intake`), `publications`, `handshake` and `server`,
    composed; the learner thread calls `start`, `publish`, the readers and `stop`; a reader that wants more of a
    part reads the part itself (e.g. `publications.store`)."""

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
        handshake_s: float = session.PEER_HANDSHAKE_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        base: ModelFolder | None = None,
        revoked: Revocations | None = None,
        store: SnapshotStore | None = None,
        prompt_filter: PromptFilter | None = None,
    ):
        """`worker_config`: a complete WorkerConfig (its staleness and heartbeat_s must be the buffer's S and
        `heartbeat_s`), or a mapping, validated and completed with them. `tls`: True (a certificate made for
        this run), an `Identity` (`echo2 keys`), or False: plaintext, an explicit opt-in (workers then need
        `--plaintext`). `admission`: connection caps and the failed-login rate limit (defaults: `Admission()`);
        `handshake_s`: the deadline of a whole handshake; `write_timeout_s`: how long a worker may take no byte
        of what is sent to it before it is dropped. `base`: the model folder served to a worker that asks for
        the base (runtime/broadcast/bootstrap.py). `revoked`: worker names refused and dropped
        (runtime/trust/worker_keys.py; its file re-read when it changes). gamma: T_bcast counts q = 1/gamma of
        the workers. `store`: the run's snapshot store (runtime/broadcast/store.py; needs the chain broadcast):
        every publication is written there, and joiners and workers without a delta's base take it from there.
        `prompt_filter`: prompts that will likely not teach are skipped before they are handed out
        (core/prompt_filter.py; runtime/coordinator/handout.py)."""
        self.buffer = buffer
        self.worker_config = checked_worker_config(worker_config, heartbeat_s=heartbeat_s, staleness=buffer.staleness)
        self.token = token or new_token()
        session.token_key(self.token)  # scrypt once, here, not in the event loop on the first hello
        self.delivery = check_delivery(delivery or DirectPush())
        self.identity = (tls if isinstance(tls, Identity) else Identity.generate()) if tls else None
        self.admission = admission or Admission()
        self.write_limit = WriteLimit(write_timeout_s)
        self.registry = Registry(buffer, revoked or Revocations())
        buffer.pool_of = self.registry.budget_pool  # byte budgets per credential and for the shared token
        self.handout = Handout(tasks, prompt_filter)
        self.registry.forget_worker = self.handout.forget_worker  # a quarantined worker's word on prompts is dropped
        self.intake = Intake(buffer, self.registry, vocab_size=vocab_size, max_len=max_len, handout=self.handout)
        self.publications = Publications(self.delivery, self.registry, base=base, q=1.0 / gamma, store=store)
        self.handshake = Handshake(self.registry, self.publications, self.admission, token=self.token,
                                   identity=self.identity, timeout_s=handshake_s, write_limit=self.write_limit)
        self.server = Server(registry=self.registry, handshake=self.handshake, intake=self.intake,
                             publications=self.publications, handout=self.handout, worker_config=self.worker_config,
                             host=host, port=port, worker_timeout_s=worker_timeout_s)

    # -- lifecycle (called from the learner thread) -----------------------------------------------------
    def start(self) -> tuple[str, int]:
        return self.server.start()

    def stop(self) -> None:
        self.server.stop()

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    # -- publication ------------------------------------------------------------------------------------
    def publish(self, version: int, weights: bytes, *, root: bytes = b"", delta: Any = None) -> None:
        """Hand snapshot `version` to the delivery (non-blocking for the learner). With delta snapshots: `root`, the
        snapshot's BLAKE3 root, and `delta`, (core.delta.Delta, its base version) when this publication is a delta
        (Publications.publish)."""
        self.server.call_soon(self.publications.publish, version, weights, root, delta)

    def t_bcast(self, version: int, event: str = "installed") -> tuple[float | None, float | None]:
        """(T_bcast to q = 1/gamma of the workers active at publication, T_bcast to all of them).
        `event` is "installed" (live in the backend) or "received" (complete, verified copy on the worker; a worker
        that reported no copy, sent it directly or read it from the store, counts at its install)."""
        return self.publications.t_bcast(version, event)

    # -- activation (cost-aware scheduler: echo2sdk.core.scheduler) -------------------------------------
    def join_idle(self, idle: bool = True) -> None:
        """Later joiners are registered idle (handed no tasks) until set_active; False: active at once again."""
        self.registry.join_active = not idle

    def set_active(self, worker_id: str, active: bool) -> bool:
        """Hand tasks to a registered worker again (True) or stop handing it any (False). A deactivated
        worker stays registered, keeps its connection, heartbeats and snapshots, and idles (its
        get_tasks are answered with no tasks). Returns False when no such live worker is registered."""
        return self.registry.set_active(worker_id, active)

    # -- worker audit (core/audit.py) -------------------------------------------------------------------
    def quarantine(self, worker_id: str, reason: str) -> None:
        """Quarantine a lying worker for the rest of the run (any thread): its buffered groups are dropped and
        none of its records is admitted again, its connection is closed, a hello under its id is refused.
        Every worker of its credential, if it logged in with one, and the credential's name go with it."""
        self.registry.quarantine(worker_id, reason)

    # -- statistics (any thread) ------------------------------------------------------------------------
    def alive_workers(self) -> list[WorkerInfo]:
        return self.registry.alive_workers()

    def worker_table(self) -> list[dict[str, Any]]:
        """One row per worker seen (Registry.worker_table: safe while the loop mutates the workers)."""
        return self.registry.worker_table()

    def adapter_failures(self) -> dict[str, Any]:
        """Rollouts the workers' adapters failed, by reason, and the groups they dropped for them (sums)."""
        return self.registry.adapter_failures()

    def stats(self) -> dict[str, Any]:
        return {
            "workers_alive": len(self.alive_workers()),
            "workers_seen": len(self.workers),
            "refused": self.refused,
            "refused_revoked": self.handshake.refused_revoked,
            "quarantines": self.quarantines,
            "rejected": dict(self.rejected),
            "empty_groups": self.intake.empty_groups,
            "protocol_errors": self.protocol_errors,
            "broadcast_repairs": self.publications.repairs_reported,
            "write_timeouts": self.write_limit.timeouts,
            **self.adapter_failures(),
            **self.admission.stats(),
        }

    @property
    def workers(self) -> dict[str, WorkerInfo]:
        return self.registry.workers

    @property
    def quarantined(self) -> OrderedDict[str, str]:
        """Quarantined worker id -> why (the newest KEEP_QUARANTINED): a hello under one is refused."""
        return self.registry.quarantined

    @property
    def quarantines(self) -> int:
        return self.registry.quarantines

    @property
    def rejected(self) -> Counter[str]:
        """Records rejected at intake, by reason."""
        return self.intake.rejected

    @property
    def refused(self) -> int:
        return self.handshake.refused

    @property
    def protocol_errors(self) -> int:
        return self.server.protocol_errors

    @property
    def bases_served(self) -> int:
        return self.publications.bases_served

    # -- identity ---------------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> bytes:
        """The SHA-256 of the coordinator's TLS certificate (b"": plaintext)."""
        return self.handshake.fingerprint


def checked_worker_config(
    config: Mapping[str, Any] | WorkerConfig, *, heartbeat_s: float, staleness: int
) -> WorkerConfig:
    """A WorkerConfig as it is, once its S and heartbeat agree with the coordinator's (ConfigError naming the
    field and both values if not); a mapping validated and completed with them. S: a worker that knows a
    snapshot more than S versions ahead of its own is on the way waits for it rather than generate records the
    buffer must reject."""
    if not isinstance(config, WorkerConfig):
        return WorkerConfig.from_mapping(config, heartbeat_s=heartbeat_s, staleness=staleness)
    for name, own, whose in (("staleness", staleness, "the buffer's S"), ("heartbeat_s", heartbeat_s,
                                                                           "the coordinator's heartbeat_s")):
        if getattr(config, name) != own:
            raise ConfigError(f"worker config: {name} is {getattr(config, name)!r}, but {whose} is {own!r}")
    return config
