"""Pre-rollout prompt skipping: do not generate the groups that will not teach.

A GRPO group whose n rewards are all one value has zero advantage; dynamic sampling drops it after it was generated
(the filter rate f). A prompt that gave such a group is likely to give one again (GRESO, Zheng et al. 2025), so the
learner skips it before rollout with a probability that grows with its streak of zero-variance groups:

    p_skip(x) = min(1 - p_explore ** z(x), 1 - p_min)

where z(x) is the number of consecutive zero-variance groups prompt x gave most recently (0: never seen, or its last
group was mixed: always handed out); every prompt goes out with probability at least p_min. p_explore adapts online toward a target share f* of zero-variance groups among
the groups generated, by one stochastic-approximation step per observed group:

    p_explore <- clip(p_explore + eta * (f* - [group was zero-variance]), p_min, 1)

(more zero-variance groups than f* lower it: skip more; fewer raise it). p_min > 0 keeps exploring: a prompt the
policy could not solve may become solvable, and one it always solves may start to fail.

Each prompt's history remembers the worker whose group set it last: `forget_worker` (a quarantined worker) clears
the streaks that worker set.

A prompt is known by its content (the chat messages and the answer; an environment task, which has neither, by its
info), not by the task id: procedural streams and datasets read again in later epochs give the same prompt a new id.
A task with none of the three has no identity and is never judged (`prompt_key` gives None). Prompts that never repeat (a reasoning-gym stream,
a large dataset in its first epoch) have no history and are never skipped; `stats()["repeat_share"]` says how many
prompts handed out had one.

Bounded: at most `max_prompts` prompts are remembered (the least recently seen forgotten first). Thread-safe: one
lock; the coordinator's loop calls `decide`, the intake's executor `observe`. `state_dict()` / `load_state_dict()`
carry the history and p_explore across a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from echo2sdk.core import checks
from echo2sdk.core.buffer import has_signal
from echo2sdk.core.records import Trajectory
from echo2sdk.errors import ConfigError

__all__ = ["PromptFilter", "REASONS", "MIXED", "COUNTS", "prompt_key", "outcome_of", "zero_reason"]

#: why a prompt is skipped: its last zero-variance groups were all right, all wrong, or one reward without a verdict
REASONS = ("all_correct", "all_wrong", "all_same")
MIXED = "mixed"
#: the counters a checkpoint carries (state_dict's "counts")
COUNTS = ("handed", "handed_known", "handed_repeat", "observed", "zero_variance", "known_observed",
          "known_zero_variance")


def prompt_key(messages: Sequence[Mapping[str, Any]], answer: str = "", info: Mapping[str, Any] | None = None
               ) -> str | None:
    """The identity of a prompt: a 128-bit BLAKE2b of its chat messages and its answer; of its info for a task with
    neither (an environment's, made by the worker from e.g. a seed); None for a task with none of the three (nothing
    tells two such tasks apart). A text task's info is left out: it may carry what changes from one reading of the
    same prompt to the next (a dataset's epoch)."""
    if messages or answer:
        identity: object = [list(messages), answer]
    elif info:
        identity = {"info": dict(info)}
    else:
        return None
    text = json.dumps(identity, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def zero_reason(correct: Sequence[object]) -> str:
    """Why a zero-variance group's prompt may not teach: "all_correct" / "all_wrong" when every member carries that
    verdict (True / False), "all_same" otherwise."""
    if correct and all(c is True for c in correct):
        return "all_correct"
    if correct and all(c is False for c in correct):
        return "all_wrong"
    return "all_same"


def outcome_of(records: Sequence[Trajectory]) -> str:
    """What a group says about its prompt: "mixed" when it carries signal as dynamic sampling counts it
    (core/buffer.has_signal: two loss-carrying members with different rewards), else zero_reason of its members'
    verdicts (meta.extra "correct")."""
    return MIXED if has_signal(records) else zero_reason([t.meta.extra.get("correct") for t in records])


@dataclass
class _History:
    streak: int = 0  # z(x): consecutive zero-variance groups, most recent first
    reason: str = MIXED  # the last group's outcome
    worker: str = ""  # whose group set it last


class PromptFilter:
    """Skip decisions and their counts (module docstring). `decide(key)` returns None (hand it out) or the reason
    it is skipped; `observe(key, outcome)` records a generated group's outcome."""

    def __init__(self, *, target: float = 0.25, explore: float = 0.5, min_explore: float = 0.05, eta: float = 0.02,
                 max_prompts: int = 100_000, seed: int = 0):
        checks.real("prompt_filter.target", target, lo=0, hi=1, error=ConfigError)
        checks.real("prompt_filter.min_explore", min_explore, lo=0, hi=1, open_lo=True, error=ConfigError)
        checks.real("prompt_filter.explore", explore, lo=min_explore, hi=1, error=ConfigError)
        checks.real("prompt_filter.eta", eta, lo=0, hi=1, error=ConfigError)
        checks.integer("prompt_filter.max_prompts", max_prompts, lo=1, error=ConfigError)
        self.target, self.min_explore, self.eta, self.max_prompts = target, min_explore, eta, max_prompts
        self.explore = explore  # p_explore
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, _History] = OrderedDict()
        self.skipped: Counter[str] = Counter()  # by reason
        self.handed = 0  # prompts handed out
        self.handed_known = 0  # of them, prompts with a zero-variance streak (explored despite their history)
        self.handed_repeat = 0  # of them, prompts seen before
        self.observed = 0  # groups whose outcome came back
        self.zero_variance = 0  # of them, zero-variance
        self.known_observed = 0  # groups of prompts handed out with a streak (exploration) ...
        self.known_zero_variance = 0  # ... that were zero-variance again: the precision of a skip

    # ---------------------------------------------------------------------------------------------- decisions
    def decide(self, key: str) -> tuple[str | None, int]:
        """(None, z): hand the prompt out (z > 0: explored despite its streak); (reason, z): skip it (REASONS), with
        p_skip = min(1 - p_explore ** z, 1 - p_min)."""
        with self._lock:
            h = self._seen.get(key)
            z = 0 if h is None else h.streak
            if h is not None:
                self._seen.move_to_end(key)
            if z > 0 and self._rng.random() < min(1 - self.explore ** z, 1 - self.min_explore):
                self.skipped[h.reason] += 1
                return h.reason, z
            self.handed += 1
            self.handed_repeat += h is not None
            self.handed_known += z > 0
            return None, z

    def observe(self, key: str, outcome: str, explored: bool = False, worker: str = "") -> None:
        """A generated group's outcome (outcome_of) for prompt `key`, from `worker`; `explored`: handed out despite
        a streak (its outcome measures how often a skip is right). Adapts p_explore toward the target."""
        zero = outcome != MIXED
        with self._lock:
            h = self._seen.pop(key, None) or _History()
            h.streak, h.reason = (h.streak + 1, outcome) if zero else (0, MIXED)
            h.worker = worker
            self._seen[key] = h
            while len(self._seen) > self.max_prompts:
                self._seen.popitem(last=False)
            self.observed += 1
            self.zero_variance += zero
            if explored:
                self.known_observed += 1
                self.known_zero_variance += zero
            self.explore = min(1.0, max(self.min_explore, self.explore + self.eta * (self.target - zero)))

    def forget_worker(self, worker: str) -> int:
        """Clear the streaks `worker`'s groups set last (a quarantined worker's word is not taken). Returns how many."""
        with self._lock:
            mine = [h for h in self._seen.values() if h.worker == worker and h.streak]
            for h in mine:
                h.streak, h.reason = 0, MIXED
            return len(mine)

    def streak(self, key: str) -> int:
        """z(x) of a prompt now (0 when unknown)."""
        with self._lock:
            h = self._seen.get(key)
            return h.streak if h is not None else 0

    # ---------------------------------------------------------------------------------------------- reading
    def stats(self) -> dict[str, Any]:
        """Counters (cumulative) and the estimates: f_measured (zero-variance share of the generated groups),
        precision (of the explored prompts with a streak, the share zero-variance again: how often a skip is
        right), f_unskipped (what f would have been had nothing been skipped: the skipped prompts counted as
        zero-variance with that precision), repeat_share (of the prompts handed out, those seen before)."""
        with self._lock:
            skipped = sum(self.skipped.values())
            precision = self.known_zero_variance / self.known_observed if self.known_observed else None
            f = self.zero_variance / self.observed if self.observed else None
            unskipped = None
            if f is not None and skipped:
                p = 1.0 if precision is None else precision
                unskipped = (self.zero_variance + skipped * p) / (self.observed + skipped)
            return {
                "handed": self.handed,
                "skipped": skipped,
                "skipped_by_reason": {r: self.skipped[r] for r in REASONS},
                "observed": self.observed,
                "zero_variance": self.zero_variance,
                "f_measured": f,
                "f_unskipped": unskipped,
                "precision": precision,
                "explore": self.explore,
                "repeat_share": self.handed_repeat / self.handed if self.handed else None,
                "prompts_tracked": len(self._seen),
            }

    # ---------------------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """JSON-safe: the history (least recent first), p_explore, the counters and the RNG."""
        with self._lock:
            return {
                "explore": self.explore,
                "history": [[k, h.streak, h.reason, h.worker] for k, h in self._seen.items()],
                "counts": {name: getattr(self, name) for name in COUNTS},
                "skipped": dict(self.skipped),
                "rng": _rng_state(self._rng),
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what state_dict gave (a resumed run skips as the interrupted one would have)."""
        with self._lock:
            self.explore = min(1.0, max(self.min_explore, float(state["explore"])))
            self._seen = OrderedDict()
            for key, streak, reason, *worker in state["history"][-self.max_prompts:]:
                self._seen[str(key)] = _History(max(0, int(streak)), reason if reason in REASONS else MIXED,
                                                str(worker[0]) if worker else "")
            for name in COUNTS:
                setattr(self, name, max(0, int(state["counts"].get(name, 0))))
            self.skipped = Counter({r: int(n) for r, n in state["skipped"].items() if r in REASONS})
            self._rng.setstate(_rng_unstate(state["rng"]))


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_unstate(state: Sequence[Any]) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
