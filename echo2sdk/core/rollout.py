"""Rollout plane, single-turn: generate one GRPO group of n samples per task with an inference backend under
its installed version v-hat, score each sample with the task adapter and turn it into a version-tagged record
tau = (x, y, r, v, Omega) that carries the sampler's per-token log-probs. Multi-turn episodes are
echo2sdk.core.episodes; a worker (runtime/worker/process.py) and `echo2sdk.testing.check_adapter` both roll
out through these two.

A sample the adapter fails to score (its `score` raised, or gave a reward that is not a finite real number:
core/failures.py) is counted by reason in `RolloutStats.failures` and its group is dropped and counted
(GRPO normalizes over the whole group); the caller goes on. Prompts longer than `max_prompt_length` keep their
last tokens (TRL truncates prompts from the left) and are counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from echo2sdk.core.checks import shown
from echo2sdk.core.contracts import InferenceBackend, Sample, SamplingParams, Task, TaskAdapter
from echo2sdk.core.failures import Failures, as_reward, failure_reason
from echo2sdk.core.records import Message, Meta, Trajectory, bounded_extra, sampler_logprob

__all__ = ["LOGGED_FAILURES", "RolloutStats", "generate_groups", "score_sample", "truncate_prompt"]

log = logging.getLogger("echo2sdk.worker")  # the rollout plane's lines keep the worker's logger name

LOGGED_FAILURES = 3  # adapter failures logged one by one per reason; the rest are counted only


@dataclass
class RolloutStats:
    """Counters of single-turn rollouts: failed samples by reason (a worker reports them in its heartbeat,
    with its failed episodes in the same `Failures`), the groups dropped for them, and the prompts truncated."""

    failures: Failures = field(default_factory=Failures)
    groups_dropped: int = 0
    prompts_truncated: int = 0


def truncate_prompt(prompt_ids: list[int], limit: int | None, stats: RolloutStats) -> list[int]:
    """The prompt's last `limit` tokens (TRL truncates prompts from the left); counted in `stats`."""
    if limit is None or len(prompt_ids) <= limit:
        return prompt_ids
    stats.prompts_truncated += 1
    if stats.prompts_truncated == 1:
        log.warning("a prompt of %d tokens is truncated from the left to max_prompt_length=%d (counted in the "
                    "task metrics as prompt_truncated)", len(prompt_ids), limit)
    return prompt_ids[-limit:]


def generate_groups(
    backend: InferenceBackend,
    adapter: TaskAdapter,
    tasks: Sequence[Task],
    n: int,
    params: SamplingParams,
    *,
    version: int,
    worker_id: str = "",
    max_prompt_length: int | None = None,
    stats: RolloutStats | None = None,
    adapter_name: str = "",
) -> list[list[Trajectory]]:
    """n samples per task from one batched `generate` call, scored: one group of records per task (group id =
    task id), tagged with `version`. A group with a sample the adapter failed to score is dropped and counted."""
    stats = stats if stats is not None else RolloutStats()
    encoded = [backend.encode_chat(t.messages) for t in tasks]
    prompt_ids = [truncate_prompt(p, max_prompt_length, stats) for p in encoded]
    samples = backend.generate([p for p in prompt_ids for _ in range(n)], params)
    groups = []
    for i, task in enumerate(tasks):
        cut = len(prompt_ids[i]) < len(encoded[i])
        group = [score_sample(adapter, task, prompt_ids[i], s, version=version, worker_id=worker_id, cut=cut,
                              stats=stats, adapter_name=adapter_name) for s in samples[i * n : (i + 1) * n]]
        if any(t is None for t in group):
            stats.groups_dropped += 1
            continue
        groups.append(group)  # type: ignore[arg-type]  # no None left
    return groups


def score_sample(
    adapter: TaskAdapter,
    task: Task,
    prompt_ids: list[int],
    s: Sample,
    *,
    version: int,
    worker_id: str = "",
    cut: bool = False,
    stats: RolloutStats,
    adapter_name: str = "",
) -> Trajectory | None:
    """One sample scored by the adapter, as a record; None (counted in `stats` and logged) when the adapter's
    score raised or gave a reward that is not a finite real number."""
    try:
        score: Any = adapter.score(task, s.text)
        reward = as_reward(getattr(score, "reward", None))
        meta = Meta(
            group_id=task.id,
            prompt_ids=tuple(prompt_ids),
            response_ids=tuple(s.token_ids),
            logprobs=tuple(sampler_logprob(lp) for lp in s.logprobs),
            worker=worker_id,
            # the task's and the score's scalar info (per-task metrics, the samples table), then the runtime's keys
            extra={**bounded_extra({**task.info, **(getattr(score, "info", None) or {})}),
                   "correct": score.correct, "finish_reason": s.finish_reason, "prompt_truncated": cut},
        )
    except Exception as e:  # noqa: BLE001 - a bad rollout is data, not a crash
        reason = failure_reason(e)
        stats.failures.add(reason)
        if stats.failures.counts[reason] <= LOGGED_FAILURES:
            log.warning("adapter %s failed on task %s (%s): %s: %s; its group is dropped", shown(adapter_name),
                        shown(task.id), reason, type(e).__name__, shown(str(e), 200))
        return None
    prompt = tuple(Message(role=m["role"], content=m["content"]) for m in task.messages)
    return Trajectory(prompt=prompt, response=s.text, reward=reward, version=version, meta=meta)
