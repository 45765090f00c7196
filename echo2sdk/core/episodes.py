"""Rollout plane, multi-turn: play a batch of episodes with an inference backend and turn each into one
version-tagged record tau = (x, y, r, v, Omega) (paper appendix F.3-F.5). Single-turn groups: core/rollout.py.

Token bookkeeping. The model's context grows as *tokens*, never by re-encoding text: the first context
is `encode_chat(opening messages)`; after each action the sampled tokens are kept exactly as sampled and
the next user turn is appended as the chat template renders it (the end-of-turn glue, the user message
and the generation prompt). So the record's token sequence is exactly what the sampler conditioned on,
and the learner's log-probs line up with the sampler's token for token. The record holds

    prompt_ids   = encode_chat([system, user_1])                 (shared by a group with one initial state)
    response_ids = a_1 + u_2 + a_2 + ... + a_T                   (a_t sampled, u_t the rendered user turn)
    loss_mask    = 1 on a_t tokens, 0 on u_t tokens              (turn-aware mask m^loss, F.5.1)
    logprobs     = the sampler's log-probs on a_t, 0.0 on u_t    (masked out; never used)

A sandbox that raises, or scores a reward that is not a finite real number (NaN, a str such as "0.1", a
bool: core/failures.py), becomes a *failed episode*: it is logged, counted by reason
(`EpisodeStats.failures`, reported by the worker) and kept as a record with
`extra.failed = True` and an all-zero loss mask (so it carries no gradient and no weight in its group's
statistics), unless every episode of its group failed, in which case the group is dropped and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from echo2sdk.core.contracts import Episode, EpisodicTaskAdapter, InferenceBackend, Sample, SamplingParams, Task
from echo2sdk.core.failures import Failures, as_reward, failure_reason
from echo2sdk.core.records import Message, Meta, Trajectory, bounded_extra, sampler_logprob

__all__ = ["EpisodeStats", "assistant_ids", "continuation_ids", "play_episodes"]

log = logging.getLogger("echo2sdk.episodes")

_PROBE = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"})
_ERROR_CHARS = 300


def continuation_ids(backend: InferenceBackend, content: str) -> list[int]:
    """Tokens that follow an assistant turn which ended with the end-of-sequence token: the template's
    glue after that turn, the user message `content`, and the generation prompt.

    Found by rendering a probe conversation (system, user, assistant, user=`content`) and keeping what
    follows the end-of-sequence token that closes the probe's assistant turn (the second-to-last one).
    Templates whose turns do not end with the backend's eos token (e.g. MockBackend's) get the user turn
    rendered on its own.
    """
    ids = backend.encode_chat([*_PROBE, {"role": "user", "content": content}])
    eos = backend.eos_token_id
    ends = [i for i, t in enumerate(ids) if t == eos]
    if len(ends) >= 2:
        return ids[ends[-2] + 1 :]
    return backend.encode_chat([{"role": "user", "content": content}])


def assistant_ids(backend: InferenceBackend, text: str) -> list[int]:
    """Tokens of an assistant turn with content `text`, through its closing eos token, as the chat template
    renders it after a generation prompt (for replaying logged episodes, which have text but no tokens)."""
    from echo2sdk.errors import AdapterError

    head = backend.encode_chat(list(_PROBE[:2]))
    ids = backend.encode_chat([*_PROBE[:2], {"role": "assistant", "content": text}, {"role": "user", "content": "u"}])
    ends = [i for i, t in enumerate(ids) if t == backend.eos_token_id]
    if ids[: len(head)] != head or len(ends) < 2 or ends[-2] < len(head):
        raise AdapterError(
            "replaying a logged episode needs a chat template whose turns end with the eos token "
            f"(eos id {backend.eos_token_id}); this backend's template does not"
        )
    return ids[len(head) : ends[-2] + 1]


@dataclass
class EpisodeStats:
    """Counters of one `play_episodes` call."""

    episodes: int = 0
    failed: int = 0
    dropped_groups: int = 0
    aborted: int = 0
    fallbacks: int = 0
    errors: list[str] = field(default_factory=list)
    failures: Failures = field(default_factory=Failures)  # failed episodes by reason (core/failures.py)


@dataclass
class _Live:
    task: Task
    index: int
    episode: Episode | None
    messages: list[dict[str, str]]
    prompt_ids: list[int] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    off_policy: bool = False
    done: bool = False
    error: str | None = None
    reason: str | None = None  # the failure's counter key
    aborted: str | None = None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:_ERROR_CHARS]


def _fail(live: _Live, e: BaseException) -> None:
    """The episode failed with exception `e`: it is done, with its error text and reason."""
    live.error, live.reason, live.done = _error(e), failure_reason(e), True


def play_episodes(
    backend: InferenceBackend,
    adapter: EpisodicTaskAdapter,
    tasks: Sequence[Task],
    n: int,
    params: SamplingParams,
    *,
    version: int,
    worker_id: str = "",
    max_len: int | None = None,
    stats: EpisodeStats | None = None,
) -> list[list[Trajectory]]:
    """Play n episodes per task (one GRPO group per task, group id = task id) in lockstep: every round,
    one batched `generate` call gives each live episode its next action. Returns the groups of records."""
    stats = stats if stats is not None else EpisodeStats()
    max_turns = int(getattr(adapter, "max_turns", 16))
    cap = getattr(adapter, "max_action_tokens", None)  # an episodic task may keep each action short
    budget = min(params.max_new_tokens, cap) if cap is not None else params.max_new_tokens
    eps = _start_episodes(backend, adapter, tasks, n, budget, max_len)
    for rnd in range(max_turns):
        active = [e for e in eps if not e.done]
        if not active:
            break
        p = replace(params, seed=params.seed + 7919 * rnd) if params.seed is not None else params
        p = replace(p, max_new_tokens=budget)
        for e, s in zip(active, _next_actions(backend, active, p)):
            if s is not None:
                _take_turn(backend, e, s, budget, max_len)
    for e in eps:
        if not e.done:
            _abort(e, "turn_limit")
    groups = _group_records(backend, eps, tasks, n, version, worker_id, stats)
    for e in eps:
        if e.episode is not None:
            try:
                e.episode.close()
            except Exception:  # noqa: BLE001
                pass
    return groups


def _start_episodes(
    backend: InferenceBackend, adapter: EpisodicTaskAdapter, tasks: Sequence[Task], n: int, budget: int, max_len: int | None
) -> list[_Live]:
    """n started episodes per task, in task order; one whose start fails, or whose opening prompt leaves no
    room for one action of `budget` tokens under max_len, is done with its error."""
    eps: list[_Live] = []
    for task in tasks:
        for k in range(n):
            live = _Live(task, k, None, [])
            try:
                live.episode = adapter.start(task, k)
                live.messages = [dict(m) for m in live.episode.messages]
                live.prompt_ids = backend.encode_chat(live.messages)
                live.context = list(live.prompt_ids)
            except Exception as e:  # noqa: BLE001 - a broken sandbox is data, not a crash
                _fail(live, e)
            eps.append(live)
    for e in eps:  # the opening prompt must leave room for one action under max_len
        if not e.done and max_len is not None and len(e.context) + budget > max_len:
            e.error, e.reason, e.done = f"opening prompt has {len(e.context)} tokens; with {budget} new tokens that exceeds max_len={max_len}", "prompt_too_long", True
    return eps


def _next_actions(backend: InferenceBackend, active: list[_Live], p: SamplingParams) -> list[Sample | None]:
    """Each live episode's next action: logged (offline) episodes bring their own responses, the others
    share one batched `generate` call. None where a logged response could not be replayed."""
    samples: list[Sample | None] = [None] * len(active)
    for j, e in enumerate(active):
        script = getattr(e.episode, "next_response", None)
        if callable(script):
            try:
                text = str(script())
                ids = assistant_ids(backend, text)
            except Exception as ex:  # noqa: BLE001
                _fail(e, ex)
                continue
            e.off_policy = True
            samples[j] = Sample(tuple(ids), tuple([0.0] * len(ids)), text, "stop")
    todo = [j for j, e in enumerate(active) if samples[j] is None and not e.done]
    if todo:
        for j, s in zip(todo, backend.generate([active[j].context for j in todo], p)):
            samples[j] = s
    return samples


def _take_turn(backend: InferenceBackend, e: _Live, s: Sample, budget: int, max_len: int | None) -> None:
    """Append action `s` (loss on its tokens), step the episode, and append the next user turn (no loss),
    unless the episode ended, failed, or would no longer fit max_len with another action."""
    e.turns += 1
    e.response += s.token_ids
    e.mask += [1] * len(s.token_ids)
    e.logprobs += [sampler_logprob(lp) for lp in s.logprobs]
    e.messages.append({"role": "assistant", "content": s.text})
    e.context += s.token_ids
    try:
        st = e.episode.step(s.text)  # type: ignore[union-attr]
        reward = as_reward(st.reward, "step reward")
    except Exception as ex:  # noqa: BLE001
        _fail(e, ex)
        return
    e.step_rewards.append(reward)
    if st.done or st.observation is None:
        e.done = True
        return
    glue = [] if s.finish_reason == "stop" else [backend.eos_token_id]  # close a length-cut turn
    cont = glue + continuation_ids(backend, st.observation)
    if max_len is not None and len(e.context) + len(cont) + budget > max_len:
        _abort(e, "context_limit")  # the record stays within max_len: the next state is not appended
        return
    e.messages.append({"role": "user", "content": st.observation})
    e.response += cont
    e.mask += [0] * len(cont)
    e.logprobs += [0.0] * len(cont)
    e.context += cont


def _group_records(
    backend: InferenceBackend, eps: list[_Live], tasks: Sequence[Task], n: int, version: int, worker_id: str, stats: EpisodeStats
) -> list[list[Trajectory]]:
    """One group of records per task; a group whose episodes all failed is dropped and counted."""
    groups: list[list[Trajectory]] = []
    for g in range(len(tasks)):
        members = eps[g * n : (g + 1) * n]
        records = [_record(backend, e, version, worker_id, stats) for e in members]
        stats.episodes += len(records)
        if all(r.meta.extra.get("failed") for r in records):
            stats.dropped_groups += 1
            log.warning("group %s dropped: all %d episodes failed (%s)", tasks[g].id, n, members[0].error)
            continue
        groups.append(records)
    return groups


def _abort(e: _Live, reason: str) -> None:
    e.done, e.aborted = True, reason
    try:
        e.episode.abort(reason)  # type: ignore[union-attr]
    except Exception as ex:  # noqa: BLE001
        e.error, e.reason = _error(ex), failure_reason(ex)


def _record(backend: InferenceBackend, e: _Live, version: int, worker_id: str, stats: EpisodeStats) -> Trajectory:
    reward, extra = 0.0, {}
    if e.error is None:
        try:
            score = e.episode.result()  # type: ignore[union-attr]
            reward = as_reward(score.reward, "episode reward")
            extra = bounded_extra({**e.task.info, **score.info})  # the task's, then the episode's scalar info
            if score.correct is not None:
                extra["correct"] = bool(score.correct)
        except Exception as ex:  # noqa: BLE001
            e.error, e.reason = _error(ex), failure_reason(ex)
    if e.aborted:
        stats.aborted += 1
        extra["aborted"] = e.aborted
    extra.update(turns=e.turns, failed=e.error is not None)
    stats.fallbacks += int(extra.get("fallbacks", 0) or 0)
    mask, response, logprobs, prompt_ids = e.mask, e.response, e.logprobs, e.prompt_ids
    if e.error is not None:
        stats.failed += 1
        stats.failures.add(e.reason or "adapter_error")
        stats.errors.append(e.error)
        log.warning("episode %s/%d failed after %d turn(s): %s", e.task.id, e.index, e.turns, e.error)
        reward, extra["error"] = 0.0, e.error
        mask = [0] * len(response)  # carries no loss
        if not prompt_ids:
            prompt_ids = backend.encode_chat([{"role": "user", "content": "(episode failed to start)"}])
        if not response:
            response, mask, logprobs = [backend.eos_token_id], [0], [0.0]
    messages = tuple(Message(role=m["role"], content=m["content"]) for m in e.messages)  # type: ignore[arg-type]
    last = next((m.content for m in reversed(messages) if m.role == "assistant"), "")
    meta = Meta(
        group_id=e.task.id,
        prompt_ids=tuple(prompt_ids),
        response_ids=tuple(response),
        logprobs=tuple(logprobs),
        loss_mask=tuple(mask),
        off_policy=e.off_policy,
        worker=worker_id,
        extra=extra,
    )
    return Trajectory(prompt=messages or (Message(role="user", content="(none)"),), response=last, reward=reward, version=version, meta=meta)
