"""Staleness-bounded, group-aware replay buffer (paper §4.1, "Replay buffer management").

At learner version v_t only trajectories with bounded lag are admissible: v >= v_t - S (and a record
cannot come from the future: v <= v_t). Older trajectories are discarded. The buffer enforces this at
three points: on intake (`add_group` / `add` reject out-of-window records), when the learner advances
(`set_version` evicts everything that fell out of the window) and at sampling time (`sample` re-checks).

Data are held as GRPO groups: exactly `group_size` records sharing one `meta.group_id` and one
version, keyed by ``(group_id, version)``. Only complete groups can be sampled.

Thread-safety: every method takes one lock (a `threading.Condition`); an asyncio coordinator thread
adds while a learner thread blocks in `wait_for` and then calls `sample`.

Dynamic sampling (DAPO, `filter_zero_variance`): a group whose members all got the same reward has zero
advantage and teaches nothing; when it completes it is filtered (counted in ``filtered_groups``) instead of
becoming sampleable, so every sampled group is informative. Filtered groups are set aside (the newest
`fallback_after`, staleness-evicted like the others): once `fallback_after` groups have been filtered since the
last `sample`, `wait_for` and `sample` fill a batch that lacks informative groups with the newest of them
(``fallback_groups``), so a run whose groups are all zero-variance cannot starve. `fallback_after = 0`: never.

Counters (all in records, not groups, except the ``*_groups`` gauges and counters) satisfy at all times::

    admitted == sampled + evicted + filtered + held

(``filtered``: records of filtered groups dropped from the side pool unsampled: beyond `fallback_after`, or
out of the staleness window).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from echo2sdk.core import checks
from echo2sdk.core.records import REWARD_BOUND, Trajectory, check_admissible, held_bytes
from echo2sdk.errors import ConfigError, TrajectoryRejected

log = logging.getLogger("echo2sdk.buffer")

__all__ = ["StalenessBuffer", "MAX_TASKS", "OTHER_TASK", "Completed", "COMPLETED", "task_bucket", "RewardValues",
           "MAX_REWARD_VALUES"]

GroupKey = tuple[str, int]  # (meta.group_id, version)

_ORDERS = ("fifo", "freshest")
MAX_TASKS = 64  # task names counted apart (stats()["completed_by_task"]); a mixture names a few
OTHER_TASK = "(other)"


class Completed(NamedTuple):
    """What is counted of every completed group, filtered or not (stats() gives each field under its COMPLETED
    name, and per task one Completed in "completed_by_task"). "scored" records have meta.extra "correct"; the
    scored_groups_* count the groups scored whole: their sums of k (correct records) and k (k - 1) say how alike
    the prompts are (capacity.prompt_concentration)."""

    records: int = 0
    reward_sum: float = 0.0
    scored: int = 0
    correct: int = 0
    groups: int = 0
    filtered_groups: int = 0
    scored_groups: int = 0
    scored_groups_correct: int = 0
    scored_groups_pairs: int = 0

    @classmethod
    def of(cls, records: list[Trajectory], filtered: bool) -> Completed:
        """One completed group's counts: its records, their reward sum, scored and correct records, 1 group,
        filtered or not, and (scored whole only) 1 scored group, its correct count k and k (k - 1)."""
        correct = [t.meta.extra.get("correct") for t in records]
        k = sum(bool(c) for c in correct)
        whole = None not in correct
        return cls(len(records), sum(t.reward for t in records), sum(c is not None for c in correct), k, 1,
                   int(filtered), int(whole), k if whole else 0, k * (k - 1) if whole else 0)

    @classmethod
    def read(cls, stats: Mapping[str, Any]) -> Completed:
        """The counts in a stats() dict (COMPLETED's keys)."""
        return cls(*(stats[k] for k in COMPLETED))

    def plus(self, more: Completed) -> Completed:
        return Completed(*(a + b for a, b in zip(self, more, strict=True)))

    def since(self, before: Completed) -> Completed:
        """What completed between an earlier reading `before` and this one."""
        return Completed(*(a - b for a, b in zip(self, before, strict=True)))


#: Completed's fields as stats() names them, in its order
COMPLETED = ("completed_records", "completed_reward_sum", "completed_scored", "completed_correct", "completed_groups",
             "filtered_groups", "scored_groups", "scored_groups_correct", "scored_groups_pairs")


#: distinct reward values a run's groups are tallied by (capacity.value_concentration); past them the reward is
#: taken for continuous and the tally stops
MAX_REWARD_VALUES = 16


class RewardValues:
    """Groups of G records by reward value: how many there were, and for each value v its records and the sum over
    groups of n_v (n_v - 1) (n_v: the group's records with reward v; the filter drops a group when one value has
    all G). `stats()`: {"groups": m, "values": [[v, records, pairs], ...]} by v, or None once more than
    MAX_REWARD_VALUES distinct values came (a continuous reward: no prediction)."""

    def __init__(self, group_size: int) -> None:
        self.group_size = checks.integer("group_size", group_size, lo=1, error=ConfigError)
        self.groups = 0
        self.values: dict[float, list[int]] | None = {}

    def add(self, rewards: Sequence[float]) -> None:
        if len(rewards) != self.group_size:
            raise ValueError(f"a group of {len(rewards)} rewards, not group_size = {self.group_size}")
        if self.values is None:
            return
        n = Counter(r + 0.0 for r in rewards)  # -0.0 is 0.0 (the filter's equality), shown as 0.0
        if len(self.values.keys() | n.keys()) > MAX_REWARD_VALUES:
            self.values = None
            log.info("rewards took more than %d values: the reward is taken for continuous, and the filter rate "
                     "is not predicted from its values", MAX_REWARD_VALUES)
            return
        self.groups += 1
        for v, k in n.items():
            counts = self.values.setdefault(v, [0, 0])
            counts[0] += k
            counts[1] += k * (k - 1)

    def stats(self) -> dict | None:
        if self.values is None:
            return None
        return {"groups": self.groups, "values": [[v, *c] for v, c in sorted(self.values.items())]}


def task_bucket(name: str, known: Collection[str], seen: Collection[str]) -> str:
    """The name a record's claimed task is counted under: itself when it is one of `known` (a mixture's
    components; any name when none are known) and among the first MAX_TASKS `seen`, else OTHER_TASK. A peer's
    names are not trusted: the learner's own, and few."""
    if (known and name not in known) or (name not in seen and len(seen) >= MAX_TASKS):
        return OTHER_TASK
    return name


MAX_BANNED = 4096  # quarantined worker ids remembered (bounded state; the coordinator refuses them by name too)


class StalenessBuffer:
    """Holds admissible GRPO groups for the learner; see the module docstring.

    Args:
        staleness: S, the staleness budget; records with v < v_t - S are never admitted nor sampled.
        group_size: n, records per GRPO group.
        capacity_groups: at most this many complete groups are held; when a new group completes
            beyond it, the oldest complete group (lowest version, then earliest arrival) is dropped
            and counted as evicted with reason "overflow". None = unbounded (the staleness window
            bounds it anyway).
        groups_per_worker: at most this many complete groups of one worker (`meta.worker` of the group's
            first record) are held; beyond it that worker's oldest held group is dropped, counted as evicted
            with reason "worker_overflow": one worker pushing faster than the learner trains cannot fill the
            learner's memory. None = no per-worker bound.
        bytes_per_worker: at most this many bytes (`records.held_bytes`) of one worker's complete groups are
            held; beyond it its oldest held groups are dropped, counted as evicted with reason "worker_bytes".
        bytes_per_pool: the budget of the shared-token pool, for `pool_of` to hand out (see below).
        pool_of: worker id -> (pool, its byte budget), or None for a worker in no pool. Workers of one pool
            hold at most that many bytes together; beyond it the oldest group of the pool member holding the
            most is dropped ("pool_bytes"), so many ids under one principal cannot add up to more (the
            coordinator pools every worker that logged in with the shared token, and each credential's ids).
        order: "fifo" samples the earliest-completed groups first; "freshest" the highest version
            first (earliest arrival among equal versions).
        reward_bound: records with |r| > reward_bound are rejected ("reward_out_of_range").
        filter_zero_variance: dynamic sampling: groups without reward variance are not sampled (see above).
        fallback_after: filtered groups since the last `sample` after which they may fill a batch (0: never).

    Rejection reasons (keys of ``stats()["rejected"]``): those of `check_admissible` ("stale",
    "future_version", "token_out_of_vocab", "too_long", "reward_out_of_range"), plus "schema" (not a Trajectory),
    "group_size" (a group of the wrong size, or a record for an already complete group),
    "group_mixed_ids", "group_mixed_versions", "duplicate" (the group is already held or was
    already sampled) and "quarantined" (a record of a worker `drop_worker` named).
    """

    def __init__(
        self,
        staleness: int,
        group_size: int,
        capacity_groups: int | None = None,
        order: str = "fifo",
        groups_per_worker: int | None = None,
        reward_bound: float = REWARD_BOUND,
        filter_zero_variance: bool = False,
        fallback_after: int = 0,
        bytes_per_worker: int | None = None,
        bytes_per_pool: int | None = None,
        pool_of: Callable[[str], tuple[str, int] | None] | None = None,
        task_names: Collection[str] = (),
    ) -> None:
        checks.integer("staleness", staleness, lo=0, error=ConfigError)  # S
        checks.integer("group_size", group_size, lo=1, error=ConfigError)
        if capacity_groups is not None:
            checks.integer("capacity_groups", capacity_groups, lo=1, error=ConfigError)
        if groups_per_worker is not None:
            checks.integer("groups_per_worker", groups_per_worker, lo=1, error=ConfigError)
        checks.real("reward_bound", reward_bound, lo=0.0, open_lo=True, error=ConfigError)
        if order not in _ORDERS:
            raise ConfigError(f"order must be one of {_ORDERS}, got order={order!r}")
        self.staleness = staleness
        self.group_size = group_size
        self.capacity_groups = capacity_groups
        self.groups_per_worker = groups_per_worker
        for name, value in (("bytes_per_worker", bytes_per_worker), ("bytes_per_pool", bytes_per_pool)):
            if value is not None:
                checks.integer(name, value, lo=1, error=ConfigError)
        self.bytes_per_worker, self.bytes_per_pool = bytes_per_worker, bytes_per_pool
        self.pool_of: Callable[[str], tuple[str, int] | None] = pool_of or (lambda worker: None)
        self._bytes = _Bytes()  # ready groups' held_bytes by owner and pool, fixed at admission (with budgets)
        self.order = order
        self.reward_bound = float(reward_bound)
        checks.integer("fallback_after", fallback_after, lo=0, error=ConfigError)
        self.filter_zero_variance, self.fallback_after = bool(filter_zero_variance), fallback_after
        self.task_names = frozenset(task_names)  # a mixture's components: other names a record claims count as OTHER_TASK
        self._init_groups()
        self._init_counters()

    def _init_groups(self) -> None:
        """The held groups (empty) and the state around them: v_t, the arrival counter, the sampled keys, the
        refused workers and the filtered groups set aside."""
        self._cond = threading.Condition()
        self._version = 0  # v_t
        self._seq = 0  # arrival counter of complete groups (for "fifo" and ties)
        self._pending: dict[GroupKey, list[Trajectory]] = {}  # incomplete groups fed by `add`
        self._ready: dict[GroupKey, tuple[int, list[Trajectory]]] = {}  # complete: key -> (seq, records)
        # Keys already sampled, kept only while their version is still admissible: a re-sent group
        # older than v_t - S is rejected as stale anyway, so the set stays bounded by the window.
        self._sampled_keys: set[GroupKey] = set()
        self._banned: dict[str, None] = {}  # workers whose records are refused (drop_worker): the newest MAX_BANNED
        self._aside: dict[GroupKey, list[Trajectory]] = {}  # filtered groups, newest last (at most fallback_after)

    def _init_counters(self) -> None:
        """The counters `stats()` reports, all zero: filtered and completed groups (overall and by task),
        admissions, samples, rejections and evictions by reason, the staleness histogram."""
        self._filtered_since = 0  # groups filtered since the last sample
        self._fallback_groups = 0
        self._filtered = 0  # records of filtered groups dropped unsampled
        # Every completed group, filtered or not (what the workers produce, not what the learner trains on): the
        # COMPLETED counts, and the groups scored whole that were all right or all wrong (a binary reward's filter)
        self._completed = Completed()
        self._all_or_none = 0
        self._reward_values = RewardValues(self.group_size)
        # the same by task (a record's meta.extra "task": a mixture's component); at most MAX_TASKS names, the rest
        # under OTHER_TASK
        self._by_task: dict[str, Completed] = {}
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

    @property
    def floor(self) -> int:
        """v_t - S: the oldest version still admitted and sampled."""
        with self._cond:
            return self._version - self.staleness

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

    def drop_worker(self, worker_id: str) -> int:
        """Drop every held group, complete or not, with a record from `worker_id` (a quarantined worker:
        core/audit.py), counted as evicted with reason "quarantined", and reject its records from now on
        (reason "quarantined"). Returns the records dropped."""
        dropped = 0
        with self._cond:
            self._banned[worker_id] = None
            for old in list(self._banned)[: max(0, len(self._banned) - MAX_BANNED)]:
                del self._banned[old]
            for store in (self._pending, self._ready, self._aside):
                for key, entry in list(store.items()):
                    records = entry if isinstance(entry, list) else entry[1]
                    if any(t.meta.worker == worker_id for t in records):
                        del store[key]
                        self._bytes.forget(key) if store is self._ready else None
                        dropped += len(records)
            self._evicted["quarantined"] += dropped
        return dropped

    # ------------------------------------------------------------------ sampling

    def ready_groups(self) -> int:
        """Number of complete, admissible groups that `sample` could return now."""
        with self._cond:
            return len(self._ready)

    def wait_for(self, num_groups: int, timeout: float | None = None) -> bool:
        """Block until `sample(num_groups)` can return (at least `num_groups` complete groups are ready, or the
        zero-variance fallback can fill the batch); False if `timeout` (s) ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._ready) >= num_groups or self._can_fill(num_groups), timeout)

    def sample(self, num_groups: int) -> list[list[Trajectory]]:
        """Remove and return `num_groups` complete groups, in the buffer's `order`.

        Every returned record satisfies v >= v_t - S at the moment of sampling, and no group is ever
        returned twice. Raises ValueError when fewer than `num_groups` groups are ready (call
        `wait_for` first); nothing is removed then.
        """
        checks.integer("num_groups", num_groups, lo=0, error=ValueError)
        with self._cond:
            self._evict_stale()  # re-check the window at sample time
            fill = 0
            if len(self._ready) < num_groups:
                if not self._can_fill(num_groups):
                    raise ValueError(
                        f"asked for {num_groups} groups, only {len(self._ready)} ready; call wait_for() first"
                    )
                fill = num_groups - len(self._ready)
            if self.order == "fifo":
                keys = list(self._ready)[:num_groups]  # dicts keep arrival order
            else:
                keys = sorted(self._ready, key=lambda k: (-k[1], self._ready[k][0]))[:num_groups]
            out = [records for _, records in (self._pop_ready(key) for key in keys)]
            aside = sorted(reversed(list(self._aside)), key=lambda k: -k[1])[:fill]  # the newest filtered groups
            out += [self._aside.pop(key) for key in aside]
            self._fallback_groups += fill
            self._filtered_since = 0
            for key, records in zip(keys + aside, out):
                self._sampled_keys.add(key)
                self._sampled += len(records)
                self._staleness_hist[self._version - key[1]] += len(records)
            return out

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict:
        """Counters (in records) and gauges; admitted == sampled + evicted + held."""
        with self._cond:
            held = sum(len(g) for g in self._pending.values()) + sum(len(g) for _, g in self._ready.values())
            held += sum(len(g) for g in self._aside.values())
            held_bytes_ = sum(self._bytes.owner.values())
            return {
                "version": self._version,
                "admitted": self._admitted,
                "rejected": dict(self._rejected),
                "evicted": sum(self._evicted.values()),
                "evicted_by_reason": dict(self._evicted),
                "sampled": self._sampled,
                "staleness_hist": dict(sorted(self._staleness_hist.items())),
                "held": held,
                "held_bytes": held_bytes_,  # of the ready groups, counted with a byte budget (else 0)
                "pending_groups": len(self._pending),
                "ready_groups": len(self._ready),
                "filtered": self._filtered,
                **dict(zip(COMPLETED, self._completed, strict=True)),
                "scored_groups_all_or_none": self._all_or_none,  # all right or all wrong
                "reward_values": self._reward_values.stats(),  # the filter's own terms (RewardValues)
                "fallback_groups": self._fallback_groups,
                "aside_groups": len(self._aside),
                "completed_by_task": dict(self._by_task),
            }

    # ------------------------------------------------------------------ internals (lock held)

    def _check_record(self, t: object, *, vocab_size: int, max_len: int) -> None:
        if not isinstance(t, Trajectory):
            raise TrajectoryRejected("schema", "<record>", type(t).__name__, "expected a Trajectory")
        if t.meta.worker in self._banned:
            raise TrajectoryRejected("quarantined", "meta.worker", t.meta.worker, "the worker is quarantined")
        check_admissible(
            t, learner_version=self._version, staleness=self.staleness, vocab_size=vocab_size, max_len=max_len,
            reward_bound=self.reward_bound,
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

    def _can_fill(self, num_groups: int) -> bool:
        """The zero-variance fallback may fill a batch of `num_groups` now."""
        return (0 < self.fallback_after <= self._filtered_since
                and len(self._ready) + len(self._aside) >= num_groups)

    def _complete(self, key: GroupKey, records: list[Trajectory]) -> None:
        filtered = self.filter_zero_variance and not has_signal(records)
        counts = Completed.of(records, filtered)
        self._completed = self._completed.plus(counts)
        self._all_or_none += int(counts.scored_groups == 1 and counts.correct in (0, len(records)))
        if len(records) == self.group_size and all(t.meta.trains for t in records):
            self._reward_values.add([t.reward for t in records])
        name = records[0].meta.extra.get("task")
        if isinstance(name, str):
            bucket = task_bucket(name, self.task_names, self._by_task)
            self._by_task[bucket] = self._by_task.get(bucket, Completed()).plus(counts)
        if filtered:
            self._filtered_since += 1
            self._aside[key] = records
            while len(self._aside) > self.fallback_after:  # keep the newest fallback_after (none when 0)
                self._filtered += len(self._aside.pop(min(self._aside, key=lambda k: k[1])))
            self._cond.notify_all()
            return
        self._ready[key] = (self._seq, records)
        self._seq += 1
        owner = records[0].meta.worker
        pool = self.pool_of(owner)
        tracked = self.bytes_per_worker is not None or pool is not None
        if tracked:
            self._bytes.add(key, owner, pool, held_bytes(records))
        if self.capacity_groups is not None and len(self._ready) > self.capacity_groups:
            oldest = min(self._ready, key=lambda k: (k[1], self._ready[k][0]))
            self._evicted["overflow"] += len(self._pop_ready(oldest)[1])
        if self.groups_per_worker is not None:
            mine = (list(self._bytes.keys.get(owner, ())) if tracked
                    else [k for k, (_, recs) in self._ready.items() if recs[0].meta.worker == owner])
            if len(mine) > self.groups_per_worker:
                oldest = min(mine, key=lambda k: (k[1], self._ready[k][0]))
                self._evicted["worker_overflow"] += len(self._pop_ready(oldest)[1])
        if tracked and key in self._ready:
            self._trim_bytes(owner, pool)
        self._cond.notify_all()

    def _pop_ready(self, key: GroupKey) -> tuple[int, list[Trajectory]]:
        self._bytes.forget(key)
        return self._ready.pop(key)

    def _trim_bytes(self, owner: str, pool: tuple[str, int] | None) -> None:
        """Hold the byte budgets after `owner`'s group came in: its own, then its pool's. A pool over its budget
        loses the oldest group of the member holding the most above a fair share (one worker's budget); when no
        member holds more than that, the newcomer's own oldest (so a pool never grows past its budget)."""
        b = self._bytes
        if self.bytes_per_worker is not None:
            while b.owner[owner] > self.bytes_per_worker and b.keys.get(owner):
                self._evict_bytes(owner, "worker_bytes")
        if pool is None:
            return
        name, budget = pool
        fair = self.bytes_per_worker or budget
        while b.pool[name] > budget:
            over = [w for w in b.members[name] if b.owner[w] > fair]
            victim = max(over, key=lambda w: (b.owner[w], w)) if over else owner
            if not b.keys.get(victim):
                break
            self._evict_bytes(victim, "pool_bytes")

    def _evict_bytes(self, owner: str, reason: str) -> None:
        """Drop `owner`'s oldest ready group (lowest version, then arrival), counted under `reason`."""
        oldest = min(self._bytes.keys[owner], key=lambda k: (k[1], self._ready[k][0]))
        self._evicted[reason] += len(self._pop_ready(oldest)[1])

    def _evict_stale(self) -> None:
        floor = self._version - self.staleness  # v_t - S
        for store in (self._pending, self._ready):
            for key in [k for k in store if k[1] < floor]:
                entry = store.pop(key)
                self._bytes.forget(key)
                records = entry if isinstance(entry, list) else entry[1]
                self._evicted["stale"] += len(records)
        for key in [k for k in self._aside if k[1] < floor]:  # filtered groups: not counted as evicted
            self._filtered += len(self._aside.pop(key))


class _Bytes:
    """The ready groups' held_bytes, by owner (the group's `meta.worker`) and by pool, each group's owner and pool
    fixed when it was admitted (a worker the registry later forgets stays in its pool until its groups leave).
    O(1) per group added or forgotten."""

    def __init__(self) -> None:
        self.groups: dict[GroupKey, tuple[str, str | None, int]] = {}
        self.owner: Counter[str] = Counter()
        self.pool: Counter[str] = Counter()
        self.keys: dict[str, dict[GroupKey, None]] = {}  # owner -> its groups, in arrival order
        self.members: dict[str, set[str]] = {}  # pool -> owners holding groups in it

    def add(self, key: GroupKey, owner: str, pool: tuple[str, int] | None, n: int) -> None:
        name = pool[0] if pool is not None else None
        self.groups[key] = (owner, name, n)
        self.owner[owner] += n
        self.keys.setdefault(owner, {})[key] = None
        if name is not None:
            self.pool[name] += n
            self.members.setdefault(name, set()).add(owner)

    def forget(self, key: GroupKey) -> None:
        entry = self.groups.pop(key, None)
        if entry is None:
            return
        owner, name, n = entry
        self.owner[owner] -= n
        mine = self.keys[owner]
        del mine[key]
        if not mine:
            del self.keys[owner], self.owner[owner]
        if name is not None:
            self.pool[name] -= n
            if not mine:
                self.members[name].discard(owner)
                if not self.members[name]:
                    del self.members[name], self.pool[name]


def has_signal(records: Sequence[Trajectory]) -> bool:
    """True when the group's records that carry loss (a failed episode's all-zero loss mask does not) are at
    least two with different rewards: only then is any GRPO advantage non-zero."""
    rewards = {t.reward for t in records if t.meta.trains}
    return len(rewards) > 1
