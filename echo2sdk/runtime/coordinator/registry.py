"""The workers of the run: who joined (`WorkerInfo`), who is connected, who is handed tasks (activation), who is
quarantined or revoked, and the worker table the trainer reads.

Joining, leaving and revocation happen on the server's loop; the readers (`alive_workers`, `worker_table`,
`adapter_failures`) and `quarantine` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.coordinator.connection import abort
from echo2sdk.runtime.coordinator.worker_info import WorkerInfo
from echo2sdk.runtime.protocol.messages import MAX_ID, Hello, shown
from echo2sdk.runtime.trust.worker_keys import Revocations

if TYPE_CHECKING:
    from echo2sdk.runtime.coordinator.connection import Conn

__all__ = ["Registry", "WorkerInfo", "KEEP_DEPARTED", "KEEP_QUARANTINED"]

log = logging.getLogger("echo2sdk.coordinator")

KEEP_DEPARTED = 1024  # records of workers that left, kept for the run's worker table (the oldest forgotten)
KEEP_QUARANTINED = 4096  # quarantined worker ids refused by name (the oldest forgotten; `quarantines` counts all)


class Registry:
    """Every worker seen (`workers`, bounded by KEEP_DEPARTED), the live connections (`conns`), the quarantined
    ids and the revoked names. `loop` is the server's event loop once it runs (a quarantine from another thread
    closes the connection there); `stopping` is set at shutdown (a worker leaving then is the end of the run)."""

    def __init__(self, buffer: StalenessBuffer, revocations: Revocations):
        self.buffer, self.revocations = buffer, revocations
        self.workers: dict[str, WorkerInfo] = {}
        self.conns: dict[str, Conn] = {}
        self.quarantined: OrderedDict[str, str] = OrderedDict()  # worker id -> why (core/audit.py): refused by name
        self.quarantines = 0  # workers quarantined in this run (the dict keeps the newest KEEP_QUARANTINED)
        self.ids = itertools.count(1)  # the suffixes of renamed ids and the ids of hellos that name none
        self.join_active = True  # whether a worker that joins is handed tasks at once (join_idle)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        #: told of a quarantined or revoked worker (the coordinator's hand-out: its word on prompts is dropped)
        self.forget_worker: Callable[[str], None] = lambda worker_id: None

    # -- reading (any thread) -------------------------------------------------------------------------------
    def alive_workers(self) -> list[WorkerInfo]:
        return [w for w in list(self.workers.values()) if w.alive]  # list(): a join mid-call from the loop's thread

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

    # -- activation (cost-aware scheduler: echo2sdk.core.scheduler) ---------------------------------------
    def set_active(self, worker_id: str, active: bool) -> bool:
        """See Coordinator.set_active."""
        info = self.workers.get(worker_id)
        if info is None or not info.alive:
            return False
        info.active = bool(active)
        log.info("worker %s %s", worker_id, "activated" if active else "deactivated (registered, idle)")
        return True

    # -- joining and leaving (the loop's thread) ----------------------------------------------------------
    def register(
        self, hello: Hello, address: str, connect: Callable[[WorkerInfo], Conn], credential: bool = False,
        relay_reachable: bool = True,
    ) -> Conn:
        """Enter an authenticated worker in the registry (`connect` makes its connection of its record): a
        re-join from the same process keeps its id and record; another process asking for a taken id gets a
        free `id~N`. `relay_reachable` False: its relay port did not answer the coordinator's probe, so it has
        no relay address (a chain's tail: it fetches, never serves)."""
        peer_host = address.rpartition(":")[0]
        wid, sess = hello.worker_id or f"w{next(self.ids)}", hello.session
        before = self.workers.get(wid)
        rejoin = self.same_process(wid, sess)
        if wid in self.conns:
            if rejoin:  # the same process on a new connection: the old one is dead, whatever TCP says yet
                old = self.conns[wid]
                self.drop(old, "re-joined on a new connection")
                old.close()
            else:  # another process under a taken id: a free one no credential can be named (trust/worker_keys.py)
                base = wid
                while wid in self.workers:
                    suffix = f"~{next(self.ids)}"
                    wid = base[: MAX_ID - len(suffix)] + suffix
        info = WorkerInfo(
            worker_id=wid,
            address=address,
            price_per_hour=hello.price_per_hour,
            backend=hello.backend,
            version=hello.version,
            relay_addr=(peer_host, hello.relay_port) if hello.relay_port is not None and relay_reachable else None,
            relay_reachable=relay_reachable if hello.relay_port is not None else None,
            relay_fingerprint=hello.relay_fingerprint,
            session=sess,
            credential=hello.worker_id if credential else "",
        )
        conn = connect(info)
        info.active = self.join_active
        if rejoin and before is not None:  # its record goes on: counts, activation (the scheduler's choice)
            _carry_over(info, before)
        self.workers[wid], self.conns[wid] = info, conn
        self._forget_departed()
        log.info("worker %s %s from %s", shown(wid, 60), "re-joined" if rejoin else "joined", address)
        return conn

    def same_process(self, worker_id: str, session: str) -> bool:
        """Whether a hello with `session` comes from the process registered under `worker_id` (a re-join)."""
        before = self.workers.get(worker_id)
        return before is not None and bool(session) and before.session == session

    def budget_pool(self, worker_id: str) -> tuple[str, int] | None:
        """The byte-budget pool of `worker_id`'s buffered records (StalenessBuffer.pool_of): its credential's
        (all the ids one credential connects under share one worker's budget), or the shared token's (every
        token worker together: the buffer's bytes_per_pool); None without budgets or for an unknown worker."""
        b = self.buffer
        info = self.workers.get(worker_id)
        if info is None or b.bytes_per_worker is None:
            return None
        if info.credential:
            return f"credential:{info.credential}", b.bytes_per_worker
        return ("token", b.bytes_per_pool) if b.bytes_per_pool is not None else None

    def credential_conns(self, hello: Hello) -> int:
        """Live connections of the credential `hello` logs in with, less the one a re-join of the same process
        replaces. Each gets every snapshot pushed: uncapped, one credential could multiply the learner's uplink."""
        held = sum(1 for c in self.conns.values() if c.info.credential == hello.worker_id)
        return held - (hello.worker_id in self.conns and self.same_process(hello.worker_id, hello.session))

    def drop(self, conn: Conn, why: str) -> None:
        if conn.info.alive:
            conn.info.alive = False
            if self.stopping:
                log.info("worker %s %s at shutdown", conn.worker_id, why)
            else:
                log.warning("worker %s %s; training continues with %d worker(s)", conn.worker_id, why,
                            len(self.alive_workers()))
        if self.conns.get(conn.worker_id) is conn:  # not the connection a re-join registered under the same id
            del self.conns[conn.worker_id]

    def _forget_departed(self) -> None:
        """Keep the registry bounded: beyond KEEP_DEPARTED records of workers that left, drop the longest gone."""
        gone = [w for w in self.workers.values() if not w.alive]
        for w in sorted(gone, key=lambda w: w.last_seen)[: max(0, len(gone) - KEEP_DEPARTED)]:
            del self.workers[w.worker_id]

    # -- worker audit (core/audit.py) ---------------------------------------------------------------------
    def quarantine(self, worker_id: str, reason: str) -> None:
        """See Coordinator.quarantine (any thread)."""
        if worker_id in self.quarantined:
            return
        self.quarantines += 1
        self.quarantined[worker_id] = reason
        while len(self.quarantined) > KEEP_QUARANTINED:  # a shared token lets a liar come back under a new id
            self.quarantined.popitem(last=False)        # anyway: per-worker credentials (revocation) stop that
        dropped = self.buffer.drop_worker(worker_id)
        self.forget_worker(worker_id)
        log.warning("worker %s quarantined: %s; %d buffered record(s) dropped", shown(worker_id, 60), reason, dropped)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._close_quarantined, worker_id)
        info = self.workers.get(worker_id)
        if info is not None and info.credential:  # a credential is one principal, whatever id its connection got:
            self.quarantine(info.credential, f"credential of quarantined worker {shown(worker_id, 60)}")  # its name
            for other in [w for w in list(self.workers.values()) if w.credential == info.credential]:
                self.quarantine(other.worker_id, f"credential {info.credential} is quarantined")

    def _close_quarantined(self, worker_id: str) -> None:
        conn = self.conns.get(worker_id)
        if conn is not None:
            self.drop(conn, "quarantined")
            abort(conn.writer)

    # -- per-worker credentials (runtime/trust/worker_keys.py) ----------------------------------------------
    def check_revocations(self) -> None:
        """Re-read the revoked file if it changed (at each authenticated hello and every second); drop the
        workers whose name or credential is revoked now, with their buffered records."""
        if not self.revocations.refresh():
            return
        for info in list(self.workers.values()):
            if info.worker_id in self.revocations or info.credential in self.revocations:
                self._revoke(info)

    def _revoke(self, info: WorkerInfo) -> None:
        dropped = self.buffer.drop_worker(info.worker_id)
        self.forget_worker(info.worker_id)
        conn = self.conns.get(info.worker_id)
        if conn is not None:
            self.drop(conn, "revoked")
            abort(conn.writer)
        log.warning("worker %s revoked: disconnected, %d buffered record(s) dropped", shown(info.worker_id, 60),
                    dropped)


def _carry_over(info: WorkerInfo, before: WorkerInfo) -> None:
    """A re-join's record goes on from `before`: its counts, activation (the scheduler's choice), recent batch
    ids, installed versions and failure counts."""
    info.joined_at, info.trajectories, info.rejected = before.joined_at, before.trajectories, before.rejected
    info.rollouts_per_s, info.active = before.rollouts_per_s, before.active
    info.rejoins, info.batches, info.installed = before.rejoins + 1, before.batches, before.installed
    info.adapter_failures, info.groups_dropped = before.adapter_failures, before.groups_dropped
