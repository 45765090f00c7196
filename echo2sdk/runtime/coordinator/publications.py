"""What the coordinator published and who has it: the latest snapshot (a late joiner gets it), each version's
broadcast timings (T_bcast), the versions each worker reported installed (what the audit lets its records
claim), the repairs workers reported, and the base model a worker without it bootstraps from.

With a snapshot store (broadcast.store: runtime/broadcast/store.py) every publication is also written there, with
its signed manifest, on a writer thread; a late joiner, and a worker without a delta's base, is then told to take
the snapshot from the store (`SnapshotInStore`) once it is written, instead of getting it from the learner. A
worker that cannot (no credentials, an unreachable store, an entry that does not verify) says so, and gets the
full snapshot pushed; so does everyone waiting when a write fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from echo2sdk.core import capacity
from echo2sdk.runtime.broadcast.bootstrap import ModelFolder
from echo2sdk.runtime.broadcast.delivery import DirectPush, SnapshotDelivery, SnapshotMeta
from echo2sdk.runtime.protocol.messages import BaseFiles, Received, SnapshotInStore, SnapshotRejected, StoreInfo

if TYPE_CHECKING:
    from echo2sdk.runtime.broadcast.store import SnapshotStore
    from echo2sdk.runtime.coordinator.connection import Conn
    from echo2sdk.runtime.coordinator.registry import Registry

__all__ = ["Publications", "MAX_REPAIRS_KEPT", "MAX_STORE_CHAIN"]

log = logging.getLogger("echo2sdk.coordinator")

MAX_REPAIRS_KEPT = 4096  # broadcast repairs kept for the run's record (all are counted)
MAX_STORE_CHAIN = 16  # deltas after an anchor in the store (with broadcast.anchor_every = 0, or after a skip)


class Publications:
    """The publications of this coordinator, handed to the live workers of `registry` over `delivery`.
    `q` = 1/gamma: the share of the active workers T_bcast counts; `base`: the model folder served to a
    worker that asks for the base (runtime/broadcast/bootstrap.py). All on the server's loop but `t_bcast`."""

    def __init__(self, delivery: SnapshotDelivery, registry: Registry, *, base: ModelFolder | None, q: float,
                 store: SnapshotStore | None = None):
        self.delivery, self.registry, self.base, self.q, self.store = delivery, registry, base, q, store
        if store is not None and getattr(delivery, "signer", None) is None:
            raise ValueError("a snapshot store needs the chain broadcast (its manifests are signed with its key)")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="echo2-store") if store is not None else None
        self._queued: tuple[int, bytes, bytes, SnapshotMeta] | None = None  # the next publication to write
        self._writing = False
        self._last_written: tuple[int, int] | None = None  # (version, deltas since its anchor) of the last entry
        self.stored = 0  # the newest version written to the store
        self.awaiting_store: dict[str, int] = {}  # worker id -> the version it will be told to take from the store
        # (worker, version) sent again after a refusal: from the store ("hinted"), whole ("pushed"); once each
        self._again: dict[str, set[tuple[str, int]]] = {"hinted": set(), "pushed": set()}
        # store writes made, failed, superseded before written; SnapshotInStore sent, and installed after it (a store
        # read); workers that could not read it
        self.store_counts = {"written": 0, "write_failed": 0, "skipped": 0, "hints": 0, "installed": 0, "refused": 0}
        self._hinted: dict[str, int] = {}  # worker id -> the version its last SnapshotInStore named
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
        if not self.bcast:  # this coordinator's first publication settles the versions hellos claimed before it
            for c in self.registry.conns.values():
                c.info.installed -= {v for v in c.info.installed if v >= version}
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
            meta = SnapshotMeta(root=root)  # the root names it as a delta's base later
            loop.create_task(self.delivery.deliver(version, weights, peers, *((meta,) if root else ())))
            self._write(version, weights, weights, meta)
            return
        d, base = delta
        holders = [p for p in peers if p.info.version == base]
        others = [p for p in peers if p.info.version != base]
        meta = SnapshotMeta("delta", base, d.base_root, d.root)
        if holders:
            loop.create_task(self.delivery.deliver(version, d.payload, holders, meta))  # type: ignore[call-arg]
        self._write(version, weights, d.payload, meta)
        if others and self.store is not None:  # they catch up from the store once this version is written
            log.info("snapshot v%d: %d worker(s) without v%d take it from the store: %s", version, len(others), base,
                     ", ".join(sorted(p.worker_id for p in others))[:300])
            for p in others:
                self.awaiting_store[p.worker_id] = version
        elif others:
            self.sent["full_pushed"] += len(others)
            log.info("snapshot v%d: the full snapshot to %d worker(s) without v%d: %s", version, len(others), base,
                     ", ".join(sorted(p.worker_id for p in others))[:300])
            loop.create_task(self._full_push.deliver(version, weights, others))

    async def send_latest(self, conn: Conn) -> None:
        """A late joiner gets the current policy at once (nothing before the first publication): from the store
        (told so once the version is written), over the delivery, or whole over its control connection when the
        newest publication went out as a delta."""
        if self.latest is None:
            return
        if self.store is not None:
            self.awaiting_store[conn.worker_id] = self.latest[0]
            if self.stored >= self.latest[0]:
                await self._hint_awaiting()
        elif self.latest_kind == "delta":
            await self._push_latest(conn)
        else:
            await self.delivery.deliver(self.latest[0], self.latest[1], [conn])

    def t_bcast(self, version: int, event: str = "installed") -> tuple[float | None, float | None]:
        """See Coordinator.t_bcast (any thread)."""
        b = self.bcast.get(version)
        if not b or not b["expected"]:
            return None, None
        if event == "received":  # a worker installs only what it has: one that reported no copy (a direct push,
            # the store) has it at its install
            got = {**b["installed"], **{w: min(t, b["installed"].get(w, t)) for w, t in b["received"].items()}}
        else:
            got = b[event]
        times = [t - b["t0"] for w, t in got.items() if w in b["expected"]]
        t_q = capacity.t_bcast_quantile(times, len(b["expected"]), self.q)
        t_all = max(times) if len(times) == len(b["expected"]) else None
        return t_q, t_all

    # -- the snapshot store -----------------------------------------------------------------------------------
    def store_info(self) -> StoreInfo | None:
        """What a worker needs to read the store (the welcome carries it): its URL and non-secret options."""
        return StoreInfo(url=self.store.url, options=self.store.options) if self.store is not None else None

    def _write(self, version: int, weights: bytes, payload: bytes, meta: SnapshotMeta) -> None:
        """Queue publication `version` for the store (`weights`: the full snapshot, `payload`: what went out). One
        write runs at a time; a publication queued behind it replaces the one waiting (memory: at most two)."""
        if self.store is None:
            return
        if self._queued is not None:
            self.store_counts["skipped"] += 1  # superseded before it was written
        self._queued = (version, weights, payload, meta)
        if not self._writing:
            self._writing = True
            asyncio.get_running_loop().create_task(self._write_queued())

    async def _write_queued(self) -> None:
        try:
            while self._queued is not None:
                job, self._queued = self._queued, None
                await self._write_one(*job)
        finally:
            self._writing = False

    async def _write_one(self, version: int, weights: bytes, payload: bytes, meta: SnapshotMeta) -> None:
        """Write one publication; a delta goes in as a full snapshot when its base is not the last entry written
        (a skipped or failed write) or the store's chain reached MAX_STORE_CHAIN deltas: every delta in the store
        is on the entry before it, and a reader never applies more than MAX_STORE_CHAIN."""
        from echo2sdk.core.broadcast.manifest import build_manifest

        assert self.store is not None and self._writer is not None
        last = self._last_written
        if meta.kind == "delta" and (last is None or last[0] != meta.base_version or last[1] >= MAX_STORE_CHAIN):
            payload, meta = weights, SnapshotMeta(root=meta.root)
        store, signer, chunk = self.store, self.delivery.signer, self.delivery.chunk_bytes  # type: ignore[attr-defined]

        def put() -> float:
            t0 = time.perf_counter()
            store.put(build_manifest(payload, version, chunk, signer, **meta.fields()), payload, signer.public_key)
            return time.perf_counter() - t0

        try:
            seconds = await asyncio.get_running_loop().run_in_executor(self._writer, put)
        except Exception as e:  # noqa: BLE001 - the run goes on; whoever waits for the store gets a full push
            self.store_counts["write_failed"] += 1
            self._last_written = None  # the next entry is a full snapshot
            log.warning("snapshot v%d: writing it to the store %s failed: %s", version, store.url, e)
            await self._push_awaiting(upto=version)
            return
        self.store_counts["written"] += 1
        self._last_written = (version, 0 if meta.kind == "full" else last[1] + 1)  # type: ignore[index]
        self.stored = max(self.stored, version)
        log.info("snapshot v%d: %s (%d bytes) written to the store in %.2f s", version, meta.kind, len(payload), seconds)
        await self._hint_awaiting()

    async def _hint_awaiting(self) -> None:
        """Tell every worker waiting for a version now in the store to take the newest one from there."""
        for w in self._take_awaiting(self.stored):
            conn = self.registry.conns.get(w)
            if conn is None or not conn.info.alive or conn.info.version >= self.stored:
                continue
            self.store_counts["hints"] += 1
            self._hinted[w] = self.stored
            try:
                await conn.send(SnapshotInStore(version=self.stored))
            except (ConnectionError, OSError):
                pass  # gone: the handler drops it

    async def _push_awaiting(self, upto: int) -> None:
        """A failed write: the workers waiting for a version up to `upto` get the latest snapshot whole."""
        for w in self._take_awaiting(upto):
            if (conn := self.registry.conns.get(w)) is not None and conn.info.alive:
                await self._push_latest(conn)

    def _take_awaiting(self, upto: int) -> list[str]:
        """The workers waiting for a version up to `upto`, no longer waiting: taken before the caller's first
        await, so that a concurrent call never sees (or deletes) them again."""
        taken = [w for w, v in self.awaiting_store.items() if v <= upto]
        for w in taken:
            del self.awaiting_store[w]
        return taken

    async def _push_latest(self, conn: Conn) -> None:
        self._hinted.pop(conn.worker_id, None)  # an install from now on may be the push's
        if self.latest is not None:
            self.sent["full_pushed"] += 1
            await self._full_push.deliver(self.latest[0], self.latest[1], [conn])

    def close(self) -> None:
        """Stop the store writer (a write under way finishes on its thread; none is started)."""
        if self._writer is not None:
            self._writer.shutdown(wait=False, cancel_futures=True)

    # -- what workers report -------------------------------------------------------------------------------
    async def on_rejected(self, conn: Conn, msg: SnapshotRejected) -> None:
        """A worker refused a snapshot (a delta it could not apply, one it could not take from the store, one its
        backend refused). Behind the newest version, it gets it once more, never an unverified state: from the
        store when it did not just fail there, else whole over its connection; once per version and worker."""
        if msg.from_store:
            self.store_counts["refused"] += 1
            self._hinted.pop(conn.worker_id, None)
        if self.latest is None or conn.info.version >= self.latest[0]:
            return
        v = self.latest[0]
        for done in self._again.values():  # what was sent again for older versions is history
            done.difference_update({k for k in done if k[1] < v})
        key = (conn.worker_id, v)
        if self.store is not None and not msg.from_store and self.stored >= v and key not in self._again["hinted"]:
            self._again["hinted"].add(key)
            self.awaiting_store[conn.worker_id] = v
            await self._hint_awaiting()
        elif key not in self._again["pushed"]:  # a refusal from the store always ends in a push
            self._again["pushed"].add(key)
            log.info("snapshot v%d: pushed whole to worker %s after its refusal", v, conn.worker_id)
            await self._push_latest(conn)

    def on_installed(self, conn: Conn, version: int) -> None:
        hinted = self._hinted.get(conn.worker_id)
        if hinted is not None and version >= hinted:  # it read the store: nothing else sent it this version
            del self._hinted[conn.worker_id]
            self.store_counts["installed"] += 1
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
        (below the first this coordinator published, in `bcast`: not known here). Before that first publication
        a claimed version is kept until it settles them (a resumed run's orphan worker may re-join first)."""
        first = next(iter(self.bcast), None)
        if first is None and version > 0:  # nothing published here yet (a resumed run's orphan re-joining early):
            conn.info.installed.add(version)  # kept; the first publication drops it unless it is below that one
        elif first is not None and (version in self.bcast or 0 < version < first):
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
