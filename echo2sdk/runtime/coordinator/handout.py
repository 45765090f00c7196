"""The tasks handed to workers: drawn from the task stream, each judged by the prompt filter first.

A skipped prompt is drawn past (the stream's `issued` count includes it, so a resumed run starts after it); a
handed-out one is remembered by task id, with the worker it went to, until its group comes back, so that its
outcome (core/prompt_filter.py) is counted once and only from that worker: a worker can teach the filter about the
prompts it was given, not skip anyone else's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from echo2sdk.core.contracts import Task
from echo2sdk.core.prompt_filter import PromptFilter, outcome_of, prompt_key

__all__ = ["Handout", "MAX_DRAWS_PER_TASK", "MAX_PENDING"]

#: a request for n tasks draws at most n times this from the stream; past it, prompts go out unjudged ("forced"),
#: so a stream of nothing but skippable prompts slows a request by a bounded amount and never starves a worker
MAX_DRAWS_PER_TASK = 32
#: tasks handed out whose groups have not come back, remembered at most (the oldest forgotten first)
MAX_PENDING = 1 << 16


class _Pending(NamedTuple):
    key: str  # prompt_key
    worker: str
    explored: bool  # handed out despite a zero-variance streak


class Handout:
    """`take(n, worker)` hands out up to n tasks (fewer only when the stream ends); `outcome(worker, records)`
    gives the filter a group's outcome. Without a filter, tasks go out as drawn and nothing is remembered."""

    def __init__(self, tasks: Iterator[Task], prompt_filter: PromptFilter | None = None, *,
                 max_pending: int = MAX_PENDING):
        self.tasks, self.filter, self.max_pending = tasks, prompt_filter, max_pending
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self.forced = 0  # tasks handed out unjudged after MAX_DRAWS_PER_TASK draws a task
        self.forgotten = 0  # pending tasks dropped over max_pending (their outcome is not counted)
        self.foreign = 0  # outcomes refused: the group came from another worker than the one handed the task
        self._last: dict[str, Any] = {}  # the filter's stats() at the previous metrics()

    def take(self, n: int, worker: str) -> list[Task]:
        out: list[Task] = []
        with self._lock:
            draws = 0
            for task in self.tasks:
                draws += 1
                if self.filter is None:
                    out.append(task)
                else:
                    key = prompt_key(task.messages, task.answer)
                    forced = draws > n * MAX_DRAWS_PER_TASK
                    if forced:
                        self.forced += 1
                    elif self.filter.decide(key) is not None:
                        continue
                    self._remember(task.id, _Pending(key, worker, not forced and self.filter.streak(key) > 0))
                    out.append(task)
                if len(out) >= n:
                    break
        return out

    def _remember(self, task_id: str, pending: _Pending) -> None:
        self._pending.pop(task_id, None)
        self._pending[task_id] = pending
        while len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
            self.forgotten += 1

    def outcome(self, worker: str, records: Sequence[Any]) -> None:
        """A group admitted from `worker` (records sharing meta.group_id = the task's id): its outcome goes to the
        filter if this worker was handed that task and it is still remembered; else nothing."""
        if self.filter is None or not records:
            return
        task_id = records[0].meta.group_id
        with self._lock:
            pending = self._pending.get(task_id)
            if pending is None:
                return
            if pending.worker != worker:
                self.foreign += 1
                return
            del self._pending[task_id]
        correct = [t.meta.extra.get("correct") for t in records]
        self.filter.observe(pending.key, outcome_of([t.reward for t in records], correct), pending.explored)

    def metrics(self) -> dict[str, Any]:
        """The filter's columns of a metrics row, since the previous call: prompts handed out and skipped (by
        reason), p_explore now, and f had nothing been skipped (the skipped prompts counted zero-variance with
        the filter's measured precision). Without a filter: prompts_handed 0 ... and None (the columns always
        exist)."""
        if self.filter is None:
            return {"prompts_handed": 0, "prompts_skipped": 0, "prompts_skipped_by_reason": {},
                    "prompt_explore": None, "filter_rate_unskipped": None}
        now, last = self.filter.stats(), self._last
        self._last = now
        since = {k: now[k] - last.get(k, 0) for k in ("handed", "skipped", "observed", "zero_variance")}
        by_reason = {r: n - last.get("skipped_by_reason", {}).get(r, 0) for r, n in now["skipped_by_reason"].items()}
        unskipped = None
        if since["skipped"] and since["observed"]:
            p = 1.0 if now["precision"] is None else now["precision"]
            unskipped = round((since["zero_variance"] + since["skipped"] * p) / (since["observed"] + since["skipped"]), 4)
        return {"prompts_handed": since["handed"], "prompts_skipped": since["skipped"],
                "prompts_skipped_by_reason": by_reason, "prompt_explore": round(now["explore"], 4),
                "filter_rate_unskipped": unskipped}

    def stats(self) -> dict[str, Any]:
        """The filter's stats() (None without one) and the handout's own counts."""
        with self._lock:
            own = {"forced": self.forced, "forgotten": self.forgotten, "foreign": self.foreign,
                   "pending": len(self._pending)}
        return {"enabled": self.filter is not None, **(self.filter.stats() if self.filter is not None else {}), **own}
