"""Warnings a user must see while a run goes on (the console and run.log), read from each metrics row.

A run that cannot learn looks healthy in its numbers unless something says so (a task the policy never solves
scores 0 on every completion, with loss 0 and grad_norm 0 every step). `Health` warns when

- no reward signal for `steps` steps in a row: every completion of the trained batch got the same reward
  (reward_std 0, so every advantage is 0 and grad_norm is 0), or every group the workers completed since the
  previous step was filtered for it (filter_rate 1). Repeated every `repeat` steps while it lasts, and an
  INFO line when the signal comes back;
- a mixture's component has every completed group filtered for `steps` of the steps it completed groups in;
- the task adapter fails: the first step with failed rollouts after one without (a score that raised or gave
  no finite reward; their groups are dropped), and again whenever the failure rate since the previous step
  doubles over the last one warned about.

The failures of a step come from the workers' heartbeats (RunMetrics.failures_since_last): metrics.jsonl has
`adapter_failures` (that step's, by reason) and `adapter_failure_rate`; the status page shows them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["Health"]

log = logging.getLogger("echo2sdk.health")


class Health:
    def __init__(self, steps: int = 3, repeat: int = 20):
        self.steps, self.repeat = steps, repeat
        self.silent = 0  # steps in a row without a reward signal
        self.failure_rate = 0.0  # the rate last warned about
        self.flat_tasks: dict[str, int] = {}  # a mixture's components: steps in a row with filter_rate 1
        self.warnings: list[str] = []  # every warning given (summary.json keeps them)

    def check(self, row: Mapping[str, Any]) -> list[str]:
        """The warnings `row` (a metrics row) gives; each is logged at WARNING."""
        out = [*self._signal(row), *self._components(row), *self._failures(row)]
        for text in out:
            log.warning("%s", text)
        self.warnings += out
        return out

    def _signal(self, row: Mapping[str, Any]) -> list[str]:
        flat = row.get("reward_std") == 0
        filtered = row.get("filter_rate") == 1
        if not (flat or filtered):
            if self.silent >= self.steps:
                log.info("step %s: a reward signal again after %d step(s) without one", row.get("step"), self.silent)
            self.silent = 0
            return []
        self.silent += 1
        if self.silent < self.steps or (self.silent - self.steps) % self.repeat:
            return []
        level = row.get("rollout_reward_mean")
        level = row.get("reward_mean") if level is None else level
        acc = row.get("rollout_accuracy")
        acc = row.get("accuracy") if acc is None else acc
        why = ("every group the workers completed got one reward for all its members (filter_rate 1)" if filtered
               else "every completion of the trained batch got the same reward (reward_std 0)")
        shown_acc = "" if acc is None else f", accuracy {acc:.2f}"
        return [f"no reward signal for {self.silent} steps (step {row.get('step')}): {why}, mean reward "
                f"{level:.3f}{shown_acc}; every advantage is 0 (grad_norm {row.get('grad_norm')}), so the policy "
                "does not learn. The task may be too hard (or too easy) for this model at this temperature: check it "
                "with  echo2 eval --config CONFIG  and make it easier, raise rollout.temperature or "
                "rollout.max_new_tokens, or add worked examples to the prompt"]

    def _components(self, row: Mapping[str, Any]) -> list[str]:
        """A mixture's component whose completed groups were all filtered for `steps` steps in a row (steps where it
        completed none do not count either way): it adds nothing to the gradient. Once per streak."""
        out = []
        for name, part in (row.get("tasks") or {}).items():
            rate = part.get("filter_rate")
            if rate is None:
                continue
            self.flat_tasks[name] = self.flat_tasks.get(name, 0) + 1 if rate == 1 else 0
            if self.flat_tasks[name] == self.steps:
                acc = part.get("rollout_accuracy")
                shown = "" if acc is None else f" (workers' accuracy {acc:.2f})"
                out.append(f"task.mix component {name!r}: every group it completed in the last {self.steps} steps had "
                           f"one reward for all its members{shown} (step {row.get('step')}): it adds nothing to the "
                           "gradient; make it easier or harder, or lower its weight")
        return out

    def _failures(self, row: Mapping[str, Any]) -> list[str]:
        failed = row.get("adapter_failures") or {}
        rate = row.get("adapter_failure_rate")
        total = sum(failed.values())
        if not total or rate is None:
            self.failure_rate = 0.0  # a step without failures: the next one warns again
            return []
        if self.failure_rate and rate < 2 * self.failure_rate:
            return []
        first = not self.failure_rate
        self.failure_rate = rate
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
        what = "the task adapter failed" if first else "the task adapter's failure rate rose:"
        return [f"step {row.get('step')}: {what} {total} rollout(s) since the previous step ({rate:.1%} of those "
                f"scored; {reasons}); their groups are dropped. The workers' logs (DIR/workers/*.log) name the tasks "
                "and errors; python -m echo2sdk.testing check-adapter ADAPTER reproduces most of them"]
