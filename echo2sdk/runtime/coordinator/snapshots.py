"""What the coordinator published and who has it: the latest snapshot (a late joiner gets it), each version's
broadcast timings (T_bcast), the versions each worker reported installed (what the audit lets its records
claim), the repairs workers reported, and the base model a worker without it bootstraps from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from echo2sdk.core import capacity
from echo2sdk.runtime.broadcast.bootstrap import ModelFolder
from echo2sdk.runtime.broadcast.delivery import DirectPush, SnapshotDelivery, SnapshotMeta
from echo2sdk.runtime.protocol.messages import BaseFiles, Received

if TYPE_CHECKING:
    from echo2sdk.runtime.coordinator.connection import Conn
    from echo2sdk.runtime.coordinator.registry import Registry

__all__ = ["Snapshots", "MAX_REPAIRS_KEPT"]

log = logging.getLogger("echo2sdk.coordinator")

MAX_REPAIRS_KEPT = 4096  # broadcast repairs kept for the run's record (all are counted)


class Snapshots:
    """The publications of this coordinator, handed to the live workers of `registry` over `delivery`.
    `q` = 1/gamma: the share of the active workers T_bcast counts; `base`: the model folder served to a
    worker that asks for the base (runtime/broadcast/bootstrap.py). All on the server's loop but `t_bcast`."""

    def __init__(self, delivery: SnapshotDelivery, registry: Registry, *, base: ModelFolder | None, q: float):
        self.delivery, self.registry, self.base, self.q = delivery, registry, base, q
        self.latest: tuple[int, bytes] | None = None  # the newest full snapshot (what a late joiner gets)
        self.latest_kind = "full"  # how the newest publication went out over the delivery: "full" or "delta"
        self._full_push = DirectPush()  # full snapshots to workers without a delta's base, and to late joiners
        self.sent = {"full": 0, "delta": 0, "full_pushed": 0}  # publications by kind; full snapshots pushed to workers
        # every version this coordinator published, in order -> {t0, expected, received: {id: t}, installed: {id: t}}
        self.bcast: dict[int, dict[str, Any]] = {}
        # the latest repairs workers reported, for the run's record; repairs_reported counts all of them
        self.broadcast_repairs: deque[dict[str, Any]] = deque(maxlen=MAX_REPAIRS_KEPT)
        self.repairs_reported = 0
        self.bases_served = 0
        self.base_weights: bytes | None = None  # the base as version 0, kept until the first publication
        self._base_lock = asyncio.Lock()

    # -- publication ---------------------------------------------------------------------------------------
    def publish(self, version: int, weights: bytes, root: bytes = b"", delta: Any = None) -> None:
        """Hand snapshot `version` to every live worker (on the loop: Coordinator.publish schedules it). `weights`:
        the full snapshot; `root`: its BLAKE3 root (b"": deltas are off). `delta`: (core.delta.Delta, its base
        version) when this publication is a delta: the workers that installed the base get the delta over the
        delivery, the others the full snapshot over their control connection."""
        self.latest = (version, weights)
        self.base_weights = None  # a worker that bootstraps from now on gets the latest snapshot
        peers = [c for c in self.registry.conns.values() if c.info.alive]
        # T_bcast counts the active rollout pool (paper §4.2); idle standby workers still get the snapshot
        active = {p.worker_id for p in peers if p.info.active}
        self.bcast[version] = {
            "t0": time.monotonic(),
            "expected": active or {p.worker_id for p in peers},
            "received": {},
            "installed": {},
        }
        loop = asyncio.get_running_loop()
        self.latest_kind = "delta" if delta is not None else "full"
        self.sent[self.latest_kind] += 1
        if delta is None:
            meta = (SnapshotMeta(root=root),) if root else ()  # the root names it as a delta's base later
            loop.create_task(self.delivery.deliver(version, weights, peers, *meta))
            return
        d, base = delta
        holders = [p for p in peers if p.info.version == base]
        others = [p for p in peers if p.info.version != base]
        meta = SnapshotMeta("delta", base, d.base_root, d.root)
        if holders:
            loop.create_task(self.delivery.deliver(version, d.payload, holders, meta))  # type: ignore[call-arg]
        if others:
            self.sent["full_pushed"] += len(others)
            log.info("snapshot v%d: the full snapshot to %d worker(s) without v%d: %s", version, len(others), base,
                     ", ".join(sorted(p.worker_id for p in others))[:300])
            loop.create_task(self._full_push.deliver(version, weights, others))

    async def send_latest(self, conn: Conn) -> None:
        """A late joiner gets the current policy at once (nothing before the first publication): over the
        delivery, or whole over its control connection when the newest publication went out as a delta."""
        if self.latest is None:
            return
        if self.latest_kind == "delta":
            self.sent["full_pushed"] += 1
            await self._full_push.deliver(self.latest[0], self.latest[1], [conn])
        else:
            await self.delivery.deliver(self.latest[0], self.latest[1], [conn])

    def t_bcast(self, version: int, event: str = "installed") -> tuple[float | None, float | None]:
        """See Coordinator.t_bcast (any thread)."""
        b = self.bcast.get(version)
        if not b or not b["expected"]:
            return None, None
        times = [t - b["t0"] for w, t in b[event].items() if w in b["expected"]]
        t_q = capacity.t_bcast_quantile(times, len(b["expected"]), self.q)
        t_all = max(times) if len(times) == len(b["expected"]) else None
        return t_q, t_all

    # -- what workers report -------------------------------------------------------------------------------
    def on_installed(self, conn: Conn, version: int) -> None:
        conn.info.version = version
        self.note_installed(conn, version)
        b = self.bcast.get(version)
        if b is not None:
            b["installed"].setdefault(conn.worker_id, time.monotonic())

    def on_received(self, conn: Conn, msg: Received) -> None:
        b = self.bcast.get(msg.version)
        if b is not None and msg.ok:
            b["received"].setdefault(conn.worker_id, time.monotonic())
        self.repairs_reported += len(msg.repairs)
        for r in msg.repairs:
            self.broadcast_repairs.append({"worker": conn.worker_id, "version": msg.version,
                                           **r.model_dump(exclude_none=True)})
        self.delivery.on_report(conn.worker_id, msg)

    def note_installed(self, conn: Conn, version: int) -> None:
        """Record a version the worker reports installed: a published one only (nothing else exists; with
        kappa > 1 the versions between publications never leave the learner), or one from before a resume
        (below the first this coordinator published, in `bcast`: not known here)."""
        first = next(iter(self.bcast), None)
        if first is not None and (version in self.bcast or 0 < version < first):
            conn.info.installed.add(version)

    # -- bootstrap (runtime/broadcast/bootstrap.py) ------------------------------------------------------------
    async def send_base(self, conn: Conn) -> None:
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
            if self.latest is None and self.base_weights is None:
                try:
                    weights = await asyncio.to_thread(self.base.weights)
                except Exception:  # noqa: BLE001 - the worker waits in vain; the learner goes on
                    log.exception("cannot read the base weights for worker %s", conn.worker_id)
                    return
                if self.latest is None:  # not published meanwhile (the worker got that one)
                    self.base_weights = weights
        if self.latest is None and self.base_weights is not None and conn.info.alive:
            await self.delivery.deliver(0, self.base_weights, [conn])
