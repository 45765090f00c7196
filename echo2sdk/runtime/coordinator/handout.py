"""The tasks handed to workers: drawn from the task stream, each judged by the prompt filter first.

A skipped prompt is drawn past (the stream's `issued` count includes it, so a resumed run starts after it); a
handed-out one is remembered by task id, with the worker it went to, until its group comes back, so that its
outcome (core/prompt_filter.py) is counted once and only from that worker. What one worker can do to the filter is
bounded: it is handed at most MAX_PENDING_PER_WORKER tasks the filter waits on (its oldest forgotten first, not
another worker's), a prompt's streak it set is cleared when it is quarantined or revoked (`forget_worker`), and
every prompt still goes out with probability at least learner.prompt_skip_min_explore.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from echo2sdk.core.contracts import Task
from echo2sdk.core.prompt_filter import PromptFilter, outcome_of, prompt_key

__all__ = ["Handout", "MAX_DRAWS_PER_TASK", "MAX_DRAWS_PER_REQUEST", "MAX_PENDING_PER_WORKER"]

#: a request for n tasks draws at most n times this from the stream, and never more than MAX_DRAWS_PER_REQUEST;
#: past that, prompts go out unjudged ("forced"): a stream of nothing but skippable prompts slows a request by a
#: bounded amount (the draws run on the coordinator's event loop) and never starves a worker
MAX_DRAWS_PER_TASK = 32
MAX_DRAWS_PER_REQUEST = 4096
#: tasks handed to one worker whose groups the filter waits for, at most (that worker's oldest forgotten first)
MAX_PENDING_PER_WORKER = 4096


class _Pending(NamedTuple):
    key: str  # prompt_key
    worker: str
    explored: bool  # handed out despite a zero-variance streak


class Handout:
    """`take(n, worker)` hands out up to n tasks (fewer only when the stream ends); `outcome(worker, records)`
    gives the filter a group's outcome. Without a filter, tasks go out as drawn and nothing is remembered."""

    def __init__(self, tasks: Iterator[Task], prompt_filter: PromptFilter | None = None, *,
                 max_pending_per_worker: int = MAX_PENDING_PER_WORKER):
        self.tasks, self.filter, self.max_pending_per_worker = tasks, prompt_filter, max_pending_per_worker
        self._lock = threading.Lock()
        self._pending: dict[str, OrderedDict[str, _Pending]] = {}  # worker -> task id -> what the filter waits for
        self.handed = 0  # tasks handed out, judged or not
        self.forced = 0  # of them, handed out unjudged after the request's draws ran out
        self.forgotten = 0  # pending tasks dropped over a worker's bound (their outcome is not counted)
        self.foreign = 0  # outcomes refused: the group came from another worker than the one handed the task
        self._last: dict[str, Any] = {}  # the counts at the previous metrics()

    def take(self, n: int, worker: str) -> list[Task]:
        out: list[Task] = []
        with self._lock:
            limit, draws = min(n * MAX_DRAWS_PER_TASK, MAX_DRAWS_PER_REQUEST), 0
            for task in self.tasks:
                draws += 1
                key = prompt_key(task.messages, task.answer, task.info) if self.filter is not None else None
                if key is not None:
                    if draws > limit:
                        self.forced += 1
                        self._remember(task.id, _Pending(key, worker, False))
                    else:
                        skipped, z = self.filter.decide(key)
                        if skipped is not None:
                            continue
                        self._remember(task.id, _Pending(key, worker, z > 0))
                out.append(task)
                if len(out) >= n:
                    break
            self.handed += len(out)
        return out

    def _remember(self, task_id: str, pending: _Pending) -> None:
        mine = self._pending.setdefault(pending.worker, OrderedDict())
        mine.pop(task_id, None)
        mine[task_id] = pending
        while len(mine) > self.max_pending_per_worker:
            mine.popitem(last=False)
            self.forgotten += 1

    def outcome(self, worker: str, records: Sequence[Any]) -> None:
        """A group admitted from `worker` (records sharing meta.group_id = the task's id): its outcome goes to the
        filter (outcome_of: zero variance as dynamic sampling counts it) if this worker was handed that task and it is
        still remembered; else nothing."""
        if self.filter is None or not records:
            return
        task_id = records[0].meta.group_id
        with self._lock:
            pending = self._pending.get(worker, {}).pop(task_id, None)
            if pending is None:
                self.foreign += any(task_id in other for other in self._pending.values())
                return
        self.filter.observe(pending.key, outcome_of(records), pending.explored, worker)

    def forget_worker(self, worker: str) -> None:
        """A quarantined or revoked worker: its pending tasks are dropped and the streaks its groups set cleared."""
        with self._lock:
            self._pending.pop(worker, None)
        if self.filter is not None:
            self.filter.forget_worker(worker)

    # -- reading and checkpoints --------------------------------------------------------------------------------
    def _counts(self) -> dict[str, Any]:
        f = self.filter.stats()
        return {"handed": self.handed, "skipped": f["skipped"], "skipped_by_reason": f["skipped_by_reason"],
                "observed": f["observed"], "zero_variance": f["zero_variance"], "precision": f["precision"],
                "explore": f["explore"]}

    def metrics(self) -> dict[str, Any]:
        """The filter's columns of a metrics row, since the previous call: prompts handed out and skipped (by
        reason), p_explore now, and f had nothing been skipped (the skipped prompts counted zero-variance with
        the filter's measured precision, 1 until one was measured). Without a filter: prompts_handed 0 ... and None
        (the columns always exist)."""
        if self.filter is None:
            return {"prompts_handed": 0, "prompts_skipped": 0, "prompts_skipped_by_reason": {},
                    "prompt_explore": None, "filter_rate_unskipped": None}
        with self._lock:
            now, last = self._counts(), self._last
            self._last = now
        since = {k: now[k] - last.get(k, 0) for k in ("handed", "skipped", "observed", "zero_variance")}
        by_reason = {r: n - last.get("skipped_by_reason", {}).get(r, 0) for r, n in now["skipped_by_reason"].items()}
        unskipped = None
        if since["skipped"] and since["observed"]:
            p = 1.0 if now["precision"] is None else now["precision"]
            zero = since["zero_variance"] + since["skipped"] * p
            unskipped = round(zero / (since["observed"] + since["skipped"]), 4)
        return {"prompts_handed": since["handed"], "prompts_skipped": since["skipped"],
                "prompts_skipped_by_reason": by_reason, "prompt_explore": round(now["explore"], 4),
                "filter_rate_unskipped": unskipped}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, read at one moment: the tasks drawn from the stream (its `issued`, skipped ones
        included; 0 for a stream that does not count) and the filter's state (None without one)."""
        with self._lock:
            return {"tasks_issued": getattr(self.tasks, "issued", 0), "handed": self.handed, "forced": self.forced,
                    "prompt_filter": self.filter.state_dict() if self.filter is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The counts and the filter's state a checkpoint kept (the stream's position is CountedTasks' skip); the
        next metrics() counts from here."""
        with self._lock:
            self.handed, self.forced = int(state.get("handed", 0)), int(state.get("forced", 0))
            if self.filter is not None and state.get("prompt_filter"):
                self.filter.load_state_dict(state["prompt_filter"])
            self._last = self._counts() if self.filter is not None else {}

    def stats(self) -> dict[str, Any]:
        """The filter's stats() (only `enabled` without one) and the handout's own counts."""
        with self._lock:
            own = {"handed_all": self.handed, "forced": self.forced, "forgotten": self.forgotten,
                   "foreign": self.foreign, "pending": sum(len(p) for p in self._pending.values())}
        return {"enabled": self.filter is not None, **(self.filter.stats() if self.filter is not None else {}), **own}
