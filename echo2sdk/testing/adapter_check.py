"""`check_adapter`: the conformance suite for task adapters (single-turn and episodic), in the spirit of
gymnasium's `check_env`.

    python -m echo2sdk.testing check-adapter reasoning-gym://chain_sum --option 'config={"max_terms": 3}'
    python -m echo2sdk.testing check-adapter --config examples/reasoning_gym_mix.toml

prints its report (or the failure) as one JSON line and exits 1 on a failure."""

from __future__ import annotations

from typing import Any, NoReturn

from echo2sdk.core import checks
from echo2sdk.core.contracts import SamplingParams
from echo2sdk.errors import Echo2Error

__all__ = ["ADAPTER_TASKS", "check_adapter"]

#: Tasks check_adapter draws by default: a failure on 1 task in 20 goes unseen with probability 0.95^100 = 0.6 %.
ADAPTER_TASKS = 100

#: Replies no adapter should take for an answer: scored (single-turn) or played to the end (episodes).
_MALFORMED = ("", "   ", "I am not sure what to do here.", "<answer></answer>", "<answer>no_such_action</answer>", "\x00" * 3, "x" * 5000)


def check_adapter(adapter, *, backend=None, seed: int = 0, n: int = 2, groups: int = 2, max_len: int = 4096,
                  tasks: int = ADAPTER_TASKS) -> dict:
    """A public conformance suite for task adapters (single-turn and episodic), in the spirit of
    gymnasium's `check_env`. Raises AdapterError naming the adapter, the failed check, and the task (its id and
    position) and method that failed; returns what it measured (`tasks_checked`: how many tasks it drew).

    Checks: `tasks(seed)` yields `tasks` tasks (fewer if the stream is finite) deterministically for a seed, with
    unique ids, that survive the wire (msgpack, as the coordinator sends them); an adapter with `spec()`
    rebuilds into an equal task stream through the plug-in loader; a single-turn `score` never raises and
    returns a finite reward on every drawn task, for its reference answer (as given, in \\boxed{} and in
    <answer> tags) and a malformed response; an episode (`start`) has system/user opening messages, survives
    malformed replies to the end (counted as fallbacks), and scores a finite reward, also after `abort`. With
    an inference `backend` (any InferenceBackend: `MockBackend()` needs no model; a real one, e.g.
    HFBackend("tiny-random"), checks token-level limits too) it also plays `groups` groups of `n` episodes (or
    samples) through the worker's rollout path and checks the records: schema round trip, one group id per
    group, loss only on sampled tokens.
    """
    from echo2sdk.core.contracts import is_episodic

    checks.integer("tasks", tasks, lo=1, hi=100_000)
    report: dict = {"episodic": is_episodic(adapter)}
    drawn = _adapter_tasks(adapter, seed, max(tasks, groups))
    report["tasks_checked"] = len(drawn)
    first = drawn[:groups]
    _adapter_spec(adapter, seed, groups, first)
    if not report["episodic"]:
        report["scored"] = _adapter_scores(adapter, drawn, report)
    else:
        report["turns"] = _adapter_episodes(adapter, first[0])
    if backend is not None:
        out = _adapter_rollout(adapter, backend, first, n, seed, max_len, report)
        _adapter_records(adapter, first, out, n)
        report["records"] = sum(len(g) for g in out)
        report["rewards"] = [r.reward for g in out for r in g]
    return report


def _adapter_fail(adapter: object, check: str, detail: str) -> NoReturn:
    from echo2sdk.errors import AdapterError

    raise AdapterError(f"check_adapter({adapter!r}): {check}: {detail}")


def _draw(adapter: Any, seed: int, count: int) -> list:
    """The first `count` tasks of tasks(seed); an error naming where the stream failed."""
    import itertools

    out: list = []
    try:
        for t in itertools.islice(adapter.tasks(seed), count):
            out.append(t)
    except Exception as e:  # noqa: BLE001 - any failure of the user's generator is the finding
        _adapter_fail(adapter, "tasks", f"tasks({seed}) raised {type(e).__name__}: {e} after {len(out)} task(s)")
    return out


def _adapter_tasks(adapter: Any, seed: int, count: int) -> list:
    """The first `count` tasks of tasks(seed): deterministic, unique ids, Task objects, msgpack-safe."""
    from echo2sdk.core.contracts import Task
    from echo2sdk.core.records import pack, unpack

    if not callable(getattr(adapter, "tasks", None)):
        _adapter_fail(adapter, "tasks", "the adapter has no tasks(seed) method")
    first = _draw(adapter, seed, count)
    if not first:
        _adapter_fail(adapter, "tasks", f"tasks({seed}) yielded nothing")
    for k, t in enumerate(first):
        if not isinstance(t, Task):
            _adapter_fail(adapter, "tasks", f"task {k} of tasks({seed}) is a {type(t).__name__}, not echo2sdk.Task")
    again = _draw(adapter, seed, count)
    for k, (a, b) in enumerate(zip(first, again, strict=False)):
        if (a.id, a.messages, a.info) != (b.id, b.messages, b.info):
            _adapter_fail(adapter, "tasks", f"tasks({seed}) is not deterministic: two calls differ at task {k} "
                          f"({a.id!r} vs {b.id!r})")
    if len(again) != len(first):
        _adapter_fail(adapter, "tasks", f"tasks({seed}) is not deterministic: {len(first)} then {len(again)} tasks")
    seen: dict[str, int] = {}
    for k, t in enumerate(first):
        if t.id in seen:
            _adapter_fail(adapter, "tasks", f"task id {t.id!r} repeats (tasks {seen[t.id]} and {k} of tasks({seed}))")
        seen[t.id] = k
        wire = {"id": t.id, "messages": list(t.messages), "answer": t.answer, "info": t.info}
        try:
            back = unpack(pack(wire))
        except Exception as e:  # noqa: BLE001
            _adapter_fail(adapter, "tasks", f"task {t.id!r} does not survive msgpack: {type(e).__name__}: {e}")
        if back["id"] != t.id:
            _adapter_fail(adapter, "tasks", f"task {t.id!r} changed on the wire")
    return first


def _adapter_spec(adapter: Any, seed: int, groups: int, first: list) -> None:
    """An adapter with spec() rebuilds through the plug-in loader into the same task stream."""
    import itertools

    if not callable(getattr(adapter, "spec", None)):
        return
    from echo2sdk.plugins import load_adapter

    name, options = adapter.spec()
    rebuilt = load_adapter(name, options)
    if [t.id for t in itertools.islice(rebuilt.tasks(seed), groups)] != [t.id for t in first]:
        _adapter_fail(adapter, "spec", f"load_adapter(*spec()) = {rebuilt!r} yields different tasks")


def _responses(task: Any, k: int) -> list[str]:
    """What check_adapter scores a task with: its reference answer as given, boxed and tagged (where one is
    set), and one malformed response (a different one for consecutive tasks)."""
    answer = str(task.answer)
    given = [answer, f"The answer is \\boxed{{{answer}}}.", f"<answer>{answer}</answer>"] if answer else []
    return [*given, _MALFORMED[k % len(_MALFORMED)]]


def _adapter_scores(adapter: Any, drawn: list, report: dict) -> int:
    """Every drawn task scored (see _responses), and the first one against every malformed response: score()
    returns a Score whose reward is a finite int or float (not a str, not a bool) and never raises. Returns the
    number of score() calls; report["reference_reward_mean"]: the mean over tasks of the best reward of the task's
    own answer (as given, boxed, tagged): 0 means no reference answer scores, e.g. a wrong answer column or scorer."""
    if not callable(getattr(adapter, "score", None)):
        _adapter_fail(adapter, "score", "the adapter has neither score(task, response) nor start(task, index)")
    calls, best = 0, []
    for k, task in enumerate(drawn):
        given = _responses(task, k)
        if k == 0:
            for text in _MALFORMED:
                _adapter_score(adapter, task, k, len(drawn), text)
        rewards = [_adapter_score(adapter, task, k, len(drawn), text) for text in given]
        calls += len(given) + (len(_MALFORMED) if k == 0 else 0)
        if len(given) > 1:  # the reference answer, as given, boxed and tagged: the best of the three
            best.append(max(rewards[:-1]))
    report["reference_reward_mean"] = sum(best) / len(best) if best else None
    return calls


def _adapter_score(adapter: Any, task: Any, k: int, count: int, text: str) -> float:
    """`score(task, text)`'s reward, checked (AdapterError naming the task and the response otherwise)."""
    from echo2sdk.core.contracts import Score
    from echo2sdk.core.failures import RewardError, as_reward

    where = f"task {task.id!r} (task {k + 1} of {count} drawn)"
    try:
        s = adapter.score(task, text)
    except Exception as e:  # noqa: BLE001
        _adapter_fail(adapter, "score", f"{where}: score() raised {type(e).__name__}: {e} on the response {text[:40]!r}")
    if not isinstance(s, Score):
        _adapter_fail(adapter, "score", f"{where}: score() returned {s!r} on {text[:40]!r}; expected a Score")
    if not isinstance(s.info, dict):
        _adapter_fail(adapter, "score", f"{where}: Score.info is {s.info!r} on {text[:40]!r}; expected a dict")
    try:
        return as_reward(s.reward)
    except RewardError as e:
        _adapter_fail(adapter, "score", f"{where}: score() gave {e} (on {text[:40]!r}); a reward is a finite int or "
                      "float, which workers count as a failed rollout otherwise")


def _adapter_episodes(adapter: Any, task: Any) -> list[int]:
    """Episodes fed malformed replies run to the end, count fallbacks and score finite rewards, also after
    abort(). Returns the turns each episode took."""
    turns = [_adapter_episode(adapter, task, text) for text in _MALFORMED[:4]]
    ep = adapter.start(task, 0)
    ep.abort("context_limit")
    _adapter_reward(adapter, task, ep.result().reward, "result reward after abort()")
    ep.close()
    return turns


def _adapter_reward(adapter: Any, task: Any, value: object, what: str) -> None:
    """An episode's reward is a finite int or float (not a str, not a bool)."""
    from echo2sdk.core.failures import RewardError, as_reward

    try:
        as_reward(value, what)
    except RewardError as e:
        _adapter_fail(adapter, "episode", f"task {task.id!r}: {e}")


def _adapter_episode(adapter: Any, task: Any, text: str) -> int:
    ep = adapter.start(task, 0)
    msgs = list(ep.messages)
    if not msgs or msgs[0].get("role") != "system" or msgs[-1].get("role") != "user":
        _adapter_fail(adapter, "episode", f"opening messages must start with system and end with user, got {[m.get('role') for m in msgs]}")
    turns = 0
    for turns in range(1, int(getattr(adapter, "max_turns", 64)) + 1):
        try:
            st = ep.step(text)
        except Exception as e:  # noqa: BLE001
            _adapter_fail(adapter, "episode", f"step() raised {type(e).__name__}: {e} on a malformed reply {text[:30]!r}")
        _adapter_reward(adapter, task, st.reward, "step reward")
        if st.done:
            break
        if not isinstance(st.observation, str) or not st.observation:
            _adapter_fail(adapter, "episode", f"step() returned observation {st.observation!r} while not done")
    else:
        ep.abort("turn_limit")
    result = ep.result()
    _adapter_reward(adapter, task, result.reward, "result reward")
    if text.strip() and int(result.info.get("fallbacks", 1)) < 1:
        _adapter_fail(adapter, "episode", f"a malformed reply {text[:30]!r} was not counted as a fallback: {result.info}")
    ep.close()
    return turns


def _adapter_rollout(adapter: Any, backend: Any, tasks: list, n: int, seed: int, max_len: int, report: dict) -> list:
    """n episodes (or samples) per task through the worker's rollout path (core.episodes, core.rollout): the
    groups of records."""
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed)
    if report["episodic"]:
        from echo2sdk.core.episodes import EpisodeStats, play_episodes

        stats = EpisodeStats()
        out = play_episodes(backend, adapter, tasks, n, params, version=0, max_len=max_len, stats=stats)
        report["failed"] = stats.failed
        if stats.failed:
            _adapter_fail(adapter, "rollout", f"{stats.failed} episode(s) failed: {stats.errors[:2]}")
        return out
    from echo2sdk.core.rollout import RolloutStats, generate_groups

    counts = RolloutStats()
    out = generate_groups(backend, adapter, tasks, n, params, version=0, stats=counts, adapter_name=type(adapter).__name__)
    if counts.failures.total():
        _adapter_fail(adapter, "rollout", f"{counts.failures.total()} sample(s) failed to score: {counts.failures.as_dict()}")
    return out


def _adapter_records(adapter: Any, tasks: list, out: list, n: int) -> None:
    """One group of n records per task, one group id each, a wire round trip, loss only on sampled tokens."""
    from echo2sdk.core.records import Trajectory
    from echo2sdk.runtime.protocol.groups import decode_record, encode_record

    if len(out) != len(tasks):
        _adapter_fail(adapter, "rollout", f"{len(tasks)} tasks gave {len(out)} groups")
    for t, group in zip(tasks, out):
        if len(group) != n or {r.meta.group_id for r in group} != {t.id}:
            _adapter_fail(adapter, "rollout", f"group {t.id!r}: {len(group)} records with ids {sorted({r.meta.group_id for r in group})}")
        for r in group:
            try:
                back = Trajectory.from_wire(decode_record(encode_record(r.to_wire()), max_len=1 << 20))
            except (Echo2Error, TypeError, ValueError, OverflowError) as e:
                _adapter_fail(adapter, "records", f"record of group {t.id!r} cannot cross the wire: {e}")
            if back != r:
                _adapter_fail(adapter, "records", f"record of group {t.id!r} does not round-trip through the wire")
            mask = r.meta.loss_mask
            if mask is not None and sum(mask) > 0 and any(lp != 0.0 for lp, m in zip(r.meta.logprobs, mask) if not m):
                _adapter_fail(adapter, "records", "a token outside the loss mask carries a sampler log-prob")
