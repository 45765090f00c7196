"""Staleness-bounded, group-aware replay buffer (paper §4.1, "Replay buffer management").

At learner version v_t only trajectories with bounded lag are admissible: v >= v_t - S (and a record
cannot come from the future: v <= v_t). Older trajectories are discarded. The buffer enforces this at
three points: on intake (`add_group` / `add` reject out-of-window records), when the learner advances
(`set_version` evicts everything that fell out of the window) and at sampling time (`sample` re-checks).

Data are held as GRPO groups: exactly `group_size` records sharing one `meta.group_id` and one
version, keyed by ``(group_id, version)``. Only complete groups can be sampled.

Thread-safety: every method takes one lock (a `threading.Condition`); an asyncio coordinator thread
adds while a learner thread blocks in `wait_for` and then calls `sample`.

Counters (all in records, not groups, except the two ``*_groups`` gauges) satisfy at all times::

    admitted == sampled + evicted + held
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from echo2sdk.core import checks
from echo2sdk.core.records import Trajectory, check_admissible
from echo2sdk.errors import ConfigError, TrajectoryRejected

__all__ = ["StalenessBuffer"]

GroupKey = tuple[str, int]  # (meta.group_id, version)

_ORDERS = ("fifo", "freshest")


class StalenessBuffer:
    """Holds admissible GRPO groups for the learner; see the module docstring.

    Args:
        staleness: S, the staleness budget; records with v < v_t - S are never admitted nor sampled.
        group_size: n, records per GRPO group.
        capacity_groups: at most this many complete groups are held; when a new group completes
            beyond it, the oldest complete group (lowest version, then earliest arrival) is dropped
            and counted as evicted with reason "overflow". None = unbounded (the staleness window
            bounds it anyway).
        order: "fifo" samples the earliest-completed groups first; "freshest" the highest version
            first (earliest arrival among equal versions).

    Rejection reasons (keys of ``stats()["rejected"]``): those of `check_admissible` ("stale",
    "future_version", "token_out_of_vocab", "too_long"), plus "schema" (not a Trajectory),
    "group_size" (a group of the wrong size, or a record for an already complete group),
    "group_mixed_ids", "group_mixed_versions" and "duplicate" (the group is already held or was
    already sampled).
    """

    def __init__(
        self,
        staleness: int,
        group_size: int,
        capacity_groups: int | None = None,
        order: str = "fifo",
    ) -> None:
        checks.integer("staleness", staleness, lo=0, error=ConfigError)  # S
        checks.integer("group_size", group_size, lo=1, error=ConfigError)
        if capacity_groups is not None:
            checks.integer("capacity_groups", capacity_groups, lo=1, error=ConfigError)
        if order not in _ORDERS:
            raise ConfigError(f"order must be one of {_ORDERS}, got order={order!r}")
        self.staleness = staleness
        self.group_size = group_size
        self.capacity_groups = capacity_groups
        self.order = order

        self._cond = threading.Condition()
        self._version = 0  # v_t
        self._seq = 0  # arrival counter of complete groups (for "fifo" and ties)
        self._pending: dict[GroupKey, list[Trajectory]] = {}  # incomplete groups fed by `add`
        self._ready: dict[GroupKey, tuple[int, list[Trajectory]]] = {}  # complete: key -> (seq, records)
        # Keys already sampled, kept only while their version is still admissible: a re-sent group
        # older than v_t - S is rejected as stale anyway, so the set stays bounded by the window.
        self._sampled_keys: set[GroupKey] = set()

        self._admitted = 0
        self._sampled = 0
        self._rejected: Counter[str] = Counter()
        self._evicted: Counter[str] = Counter()
        self._staleness_hist: Counter[int] = Counter()

    # ------------------------------------------------------------------ version

    @property
    def version(self) -> int:
        """v_t, the learner version the admission window is anchored at."""
        with self._cond:
            return self._version

    def set_version(self, v_t: int) -> None:
        """Advance the learner version to v_t and evict everything with v < v_t - S ("stale").

        Raises ConfigError if v_t is lower than the current version (versions are monotonic).
        """
        checks.integer("v_t", v_t, error=ConfigError)  # the learner version
        with self._cond:
            if v_t < self._version:
                raise ConfigError(f"learner version must not decrease: at v_t={self._version}, asked for {v_t}")
            self._version = v_t
            self._evict_stale()
            floor = v_t - self.staleness
            self._sampled_keys = {k for k in self._sampled_keys if k[1] >= floor}

    # ------------------------------------------------------------------ intake

    def add_group(self, records: Sequence[Trajectory], *, vocab_size: int, max_len: int) -> None:
        """Admit one complete GRPO group, or reject all of it.

        On rejection the records are counted under the reason (one count per record) and the
        TrajectoryRejected is raised so the caller can log it; nothing of the group is kept.
        """
        records = list(records)
        with self._cond:
            try:
                key = self._check_group(records, vocab_size=vocab_size, max_len=max_len)
            except TrajectoryRejected as e:
                self._rejected[e.reason] += len(records)
                raise
            self._admitted += len(records)
            self._complete(key, records)

    def add(self, record: Trajectory, *, vocab_size: int, max_len: int) -> None:
        """Admit one record into its (possibly incomplete) group; the group becomes sampleable once it
        holds `group_size` records. Raises TrajectoryRejected (and counts it) like `add_group`."""
        with self._cond:
            try:
                self._check_record(record, vocab_size=vocab_size, max_len=max_len)
                key = (record.meta.group_id, record.version)
                if key in self._ready or key in self._sampled_keys:
                    raise TrajectoryRejected(
                        "group_size", "meta.group_id", key[0],
                        f"group already complete with {self.group_size} records at version {key[1]}",
                    )
            except TrajectoryRejected as e:
                self._rejected[e.reason] += 1
                raise
            self._admitted += 1
            group = self._pending.setdefault(key, [])
            group.append(record)
            if len(group) == self.group_size:
                del self._pending[key]
                self._complete(key, group)

    # ------------------------------------------------------------------ sampling

    def ready_groups(self) -> int:
        """Number of complete, admissible groups that `sample` could return now."""
        with self._cond:
            return len(self._ready)

    def wait_for(self, num_groups: int, timeout: float | None = None) -> bool:
        """Block until at least `num_groups` complete groups are ready; False if `timeout` (s) ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._ready) >= num_groups, timeout)

    def sample(self, num_groups: int) -> list[list[Trajectory]]:
        """Remove and return `num_groups` complete groups, in the buffer's `order`.

        Every returned record satisfies v >= v_t - S at the moment of sampling, and no group is ever
        returned twice. Raises ValueError when fewer than `num_groups` groups are ready (call
        `wait_for` first); nothing is removed then.
        """
        checks.integer("num_groups", num_groups, lo=0, error=ValueError)
        with self._cond:
            self._evict_stale()  # re-check the window at sample time
            if len(self._ready) < num_groups:
                raise ValueError(
                    f"asked for {num_groups} groups, only {len(self._ready)} ready; call wait_for() first"
                )
            if self.order == "fifo":
                keys = list(self._ready)[:num_groups]  # dicts keep arrival order
            else:
                keys = sorted(self._ready, key=lambda k: (-k[1], self._ready[k][0]))[:num_groups]
            out = []
            for key in keys:
                _, records = self._ready.pop(key)
                self._sampled_keys.add(key)
                self._sampled += len(records)
                self._staleness_hist[self._version - key[1]] += len(records)
                out.append(records)
            return out

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict:
        """Counters (in records) and gauges; admitted == sampled + evicted + held."""
        with self._cond:
            held = sum(len(g) for g in self._pending.values()) + sum(len(g) for _, g in self._ready.values())
            return {
                "version": self._version,
                "admitted": self._admitted,
                "rejected": dict(self._rejected),
                "evicted": sum(self._evicted.values()),
                "evicted_by_reason": dict(self._evicted),
                "sampled": self._sampled,
                "staleness_hist": dict(sorted(self._staleness_hist.items())),
                "held": held,
                "pending_groups": len(self._pending),
                "ready_groups": len(self._ready),
            }

    # ------------------------------------------------------------------ internals (lock held)

    def _check_record(self, t: object, *, vocab_size: int, max_len: int) -> None:
        if not isinstance(t, Trajectory):
            raise TrajectoryRejected("schema", "<record>", type(t).__name__, "expected a Trajectory")
        check_admissible(
            t, learner_version=self._version, staleness=self.staleness, vocab_size=vocab_size, max_len=max_len
        )

    def _check_group(self, records: list, *, vocab_size: int, max_len: int) -> GroupKey:
        if len(records) != self.group_size:
            raise TrajectoryRejected("group_size", "<group>", len(records), f"a group holds {self.group_size} records")
        for t in records:
            if not isinstance(t, Trajectory):
                raise TrajectoryRejected("schema", "<record>", type(t).__name__, "expected a Trajectory")
        ids = {t.meta.group_id for t in records}
        if len(ids) > 1:
            raise TrajectoryRejected("group_mixed_ids", "meta.group_id", sorted(ids), "one group, one group_id")
        versions = {t.version for t in records}
        if len(versions) > 1:
            raise TrajectoryRejected(
                "group_mixed_versions", "version", sorted(versions), "a group is sampled under one version"
            )
        for t in records:
            self._check_record(t, vocab_size=vocab_size, max_len=max_len)
        key = (records[0].meta.group_id, records[0].version)
        if key in self._ready or key in self._pending or key in self._sampled_keys:
            raise TrajectoryRejected("duplicate", "meta.group_id", key[0], f"group already seen at version {key[1]}")
        return key

    def _complete(self, key: GroupKey, records: list[Trajectory]) -> None:
        self._ready[key] = (self._seq, records)
        self._seq += 1
        if self.capacity_groups is not None and len(self._ready) > self.capacity_groups:
            oldest = min(self._ready, key=lambda k: (k[1], self._ready[k][0]))
            self._evicted["overflow"] += len(self._ready.pop(oldest)[1])
        self._cond.notify_all()

    def _evict_stale(self) -> None:
        floor = self._version - self.staleness  # v_t - S
        for store in (self._pending, self._ready):
            for key in [k for k in store if k[1] < floor]:
                entry = store.pop(key)
                records = entry if isinstance(entry, list) else entry[1]
                self._evicted["stale"] += len(records)
