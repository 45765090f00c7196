"""Test helpers that third parties may use too: `MockBackend`, a torch-free inference backend that
speaks the InferenceBackend Protocol, so the coordinator/worker path can be tested without a model, and
`check_backend`, the conformance suite every inference backend (ours and third parties') should pass.

    python -m echo2sdk.testing check-backend vllm --model tiny-random-h64 --option dtype=float32

runs the suite from the command line and prints one JSON line per check. `check_adapter` is the task
adapters' suite:

    python -m echo2sdk.testing check-adapter reasoning-gym://chain_sum --option 'config={"max_terms": 3}'
    python -m echo2sdk.testing check-adapter --config examples/reasoning_gym_mix.toml

prints its report (or the failure) as one JSON line and exits 1 on a failure."""

from __future__ import annotations

import json
import math
import random
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from echo2sdk.core import checks
from echo2sdk.core.contracts import InferenceBackend, Sample, SamplingParams
from echo2sdk.errors import BackendError, Echo2Error

__all__ = ["MockBackend"]


class MockBackend:
    """Byte-level "model": prompts are UTF-8 bytes, responses are random printable bytes drawn
    uniformly (so every log-prob is exactly -log(V)); token 0 is end-of-sequence. Snapshots must be
    well-formed safetensors files with a strictly newer version."""

    VOCAB = 256

    def __init__(self, model: str = "mock", *, answer: str | None = None, seed: int = 0, **_: object):
        self.model, self.answer, self._seed = model, answer, seed
        self._version = 0
        self.installed_keys: list[str] = []

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self.VOCAB

    @property
    def eos_token_id(self) -> int:
        return 0

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [b or 1 for b in text.encode()]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        rng = random.Random(params.seed if params.seed is not None else self._seed + self._version)
        lp = -math.log(self.VOCAB)
        out = []
        for _ in prompts:
            text = self.answer if self.answer is not None else "".join(chr(rng.randint(97, 122)) for _ in range(8))
            ids = list(text.encode())[: params.max_new_tokens - 1] + [0]
            out.append(Sample(tuple(ids), tuple([lp] * len(ids)), bytes(ids[:-1]).decode(), "stop"))
        return out

    def install(self, version: int, weights: bytes) -> None:
        if version <= self._version:
            raise BackendError(f"snapshot version {version} is not newer than installed version {self._version}")
        try:
            (n,) = struct.unpack("<Q", weights[:8])
            header = json.loads(bytes(weights[8 : 8 + n]))
        except (struct.error, ValueError) as e:
            raise BackendError(f"snapshot v{version} is not a safetensors file: {e}") from None
        self.installed_keys = sorted(k for k in header if k != "__metadata__")
        self._version = version

    def close(self) -> None:
        pass


class ToyAdapter:
    """A torch-free task for protocol tests: "repeat the word"; reward 1 if the response is the word."""

    WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")

    def __init__(self, prefix: str = "t"):
        self.prefix = prefix

    def tasks(self, seed: int):
        from itertools import count

        from echo2sdk.core.contracts import Task

        rng = random.Random(seed)
        for i in count():
            word = rng.choice(self.WORDS)
            yield Task(id=f"{self.prefix}{seed}-{i}", messages=({"role": "user", "content": f"Say {word}."},), answer=word)

    def score(self, task, response: str):
        from echo2sdk.core.contracts import Score

        ok = response.strip() == task.answer
        return Score(reward=1.0 if ok else 0.0, correct=ok)


def safetensors_blob(names: Sequence[str] = ("w",)) -> bytes:
    """A minimal valid safetensors file (one float32 zero per tensor), built without torch."""
    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * len(names))


__all__ += ["ToyAdapter", "safetensors_blob", "check_backend", "CheckResult", "BackendCheckError", "CHECKS"]

#: check_backend's default model: tiny-random with 64-wide attention heads, a head size every engine's
#: kernels take (vLLM's CPU attention rejects tiny-random's 16-wide heads on AVX2-only CPUs).
DEFAULT_MODEL = "tiny-random-h64"


# -- adapter conformance (issue 6) -------------------------------------------------------------------
_MALFORMED = ("", "   ", "I am not sure what to do here.", "<answer></answer>", "<answer>no_such_action</answer>", "\x00" * 3, "x" * 5000)


#: Tasks check_adapter draws by default: a failure on 1 task in 20 goes unseen with probability 0.95^100 = 0.6 %.
ADAPTER_TASKS = 100


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


__all__ += ["check_adapter", "ADAPTER_TASKS"]


# ------------------------------------------------------------------------------ backend conformance

_CHAT = (
    ({"role": "user", "content": "Write a short poem about the sea."},),
    ({"role": "user", "content": "hi"},),
    (
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Tell me a story about a fox, a crow and a piece of cheese, in many words."},
    ),
)


@dataclass(frozen=True)
class CheckResult:
    """One check of `check_backend`: passed is True, False, or None when it did not run (detail says why)."""

    name: str
    passed: bool | None
    detail: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"check": self.name, "passed": self.passed, "seconds": round(self.seconds, 3), "detail": self.detail}


class BackendCheckError(AssertionError):
    """`check_backend` found failures; `results` holds every check's outcome."""

    def __init__(self, backend: str, results: list[CheckResult]):
        failed = [r for r in results if r.passed is False]
        lines = "\n".join(f"  {r.name}: {r.detail}" for r in failed)
        super().__init__(f"backend {backend} failed {len(failed)} conformance check(s):\n{lines}")
        self.results = results


class _Failed(Exception):
    pass


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _Failed(message)


def check_backend(
    backend: object,
    model: str | None = None,
    *,
    options: dict | None = None,
    temperature: float = 0.7,
    logprob_tolerance: float = 0.05,
    reference: bool = True,
    report: Callable[[CheckResult], None] | None = None,
    raise_on_failure: bool = True,
) -> list[CheckResult]:
    """Run the InferenceBackend conformance suite; return one CheckResult per check (see CHECKS).

    backend:   a registered name ("hf", "vllm", "openai", ...), a "pkg.mod:Class" reference, a class, or
               an instance. A name or class is constructed as cls(model, **options) and closed at the end;
               an instance is used as it is (it will install snapshots v1 and v2, and is not closed).
    model:     the model folder or built-in name the backend serves (default DEFAULT_MODEL, "tiny-random-h64":
               its 64-wide attention heads run on every engine, vLLM on AVX2-only CPUs included); the suite
               builds its snapshots from this folder's checkpoint, so it must be the backend's model.
    temperature, logprob_tolerance:
               the recorded log-probs must match transformers' log_softmax(logits / temperature) on the
               same tokens within this mean absolute error (fp32 engines agree to ~1e-6; loosen it for
               bf16 engines), and be closer to it than to the untempered log-probs.
    reference: compare log-probs with transformers (needs torch and transformers); False skips that part.
    report:    called with each result as soon as it is known (e.g. to print progress).

    What is checked: the Protocol's members; chat encoding; one Sample per prompt with consistent
    token ids, log-probs, text and finish reasons; the same samples for the same seed and different
    ones for another seed; distinct samples for a repeated prompt (a GRPO group); finite log-probs of
    the tempered sampling distribution; clear errors (naming the field) for bad sampling parameters and
    prompts; a snapshot install that changes the outputs and the version and whose log-probs then match
    the new weights; malformed, misshapen, incomplete, unknown-key, non-finite, non-floating, tied-but-
    different, older and non-int-version snapshots refused with a BackendError naming the problem while
    the old weights and version stay; re-installing the initial weights restoring the initial outputs;
    close() idempotent, with later calls refused. Raises BackendCheckError when a check fails.
    """
    from echo2sdk.weights import resolve_model

    label = backend if isinstance(backend, str) else type(backend).__name__
    suite = _Suite(
        backend=backend,
        options=options or {},
        owned=isinstance(backend, (str, type)),
        folder=resolve_model(model or DEFAULT_MODEL),
        params=SamplingParams(max_new_tokens=8, temperature=temperature, seed=1234),
        temperature=temperature,
        tolerance=logprob_tolerance,
        reference=reference,
    )
    results: list[CheckResult] = []
    for name, check, needs in _SUITE:
        why = _skip_reason(name, suite)
        result = CheckResult(name, None, f"not run: {why}") if why else _run_check(name, check, needs, suite, results)
        results.append(result)
        if report is not None:
            report(result)
    _close_owned(suite, results)
    if raise_on_failure and any(r.passed is False for r in results):
        raise BackendCheckError(str(label), results)
    return results


def _close_owned(suite: _Suite, results: list[CheckResult]) -> None:
    """Close a backend the suite constructed, unless the `close` check already did."""
    if suite.owned and suite.be is not None and not any(r.name == "close" and r.passed for r in results):
        try:
            suite.be.close()
        except Exception:
            pass


@dataclass
class _Suite:
    """What the checks of one `check_backend` call share: its arguments, the backend, and what earlier
    checks found (the prompts, the initial samples, the snapshot versions and weights)."""

    backend: object
    options: dict
    owned: bool  # built here from a name or class (so closed here), not the caller's instance
    folder: str
    params: SamplingParams
    temperature: float
    tolerance: float
    reference: bool
    be: Any = None
    v0: int = 0
    prompts: list = field(default_factory=list)
    initial: list = field(default_factory=list)
    base: dict = field(default_factory=dict)  # the folder's checkpoint tensors
    v1: int = 0
    v1_samples: list = field(default_factory=list)
    ref: dict = field(default_factory=dict)  # the transformers reference model, loaded once


def _skip_reason(name: str, suite: _Suite) -> str | None:
    if name == "logprobs_match_reference" and not suite.reference:
        return "reference=False"
    if name == "close" and not suite.owned:
        return "the backend instance belongs to the caller"
    return None


def _run_check(
    name: str, check: Callable[[_Suite], str | None], needs: tuple[str, ...], suite: _Suite, results: list[CheckResult]
) -> CheckResult:
    """One check's outcome: not run when a check it needs did not pass; failed on _Failed or any exception."""
    missing = [n for n in needs if not any(r.name == n and r.passed for r in results)]
    if missing:
        return CheckResult(name, None, f"not run: {', '.join(missing)} did not pass")
    t0 = time.perf_counter()
    try:
        detail = check(suite) or ""
        return CheckResult(name, True, detail, time.perf_counter() - t0)
    except _Failed as exc:
        return CheckResult(name, False, str(exc), time.perf_counter() - t0)
    except Exception as exc:  # an unexpected exception is a failure of that check, with its type
        return CheckResult(name, False, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)


def _start(suite: _Suite) -> str:
    if suite.owned:
        from echo2sdk.plugins import load_backend_class

        backend = suite.backend
        cls = load_backend_class(backend) if isinstance(backend, str) else backend
        suite.be = cls(suite.folder, **suite.options)  # type: ignore[operator]
    else:
        suite.be = suite.backend
    return repr(suite.be)


def _protocol(suite: _Suite) -> str:
    be = suite.be
    _require(isinstance(be, InferenceBackend), f"{type(be).__name__} lacks members of InferenceBackend")
    v, vocab, eos = be.version, be.vocab_size, be.eos_token_id
    for name, value in (("version", v), ("vocab_size", vocab), ("eos_token_id", eos)):
        checks.integer(name, value, error=_Failed)
    _require(vocab > 0 and 0 <= eos < vocab, f"eos_token_id={eos} is outside the vocabulary [0, {vocab})")
    if suite.owned:
        _require(v == 0, f"a new backend must report version 0, got {v}")
    suite.v0 = v
    return f"version={v} vocab_size={vocab} eos_token_id={eos}"


def _encode(suite: _Suite) -> str:
    be = suite.be
    prompts = [be.encode_chat(list(m)) for m in _CHAT]
    for ids in prompts:
        _require(isinstance(ids, list) and len(ids) > 0, f"encode_chat returned {ids!r:.80}")
        _require(all(type(t) is int and 0 <= t < be.vocab_size for t in ids), "encode_chat returned ids outside the vocabulary")
    _require(be.encode_chat(list(_CHAT[0])) == prompts[0], "encode_chat is not deterministic")
    _require(len({tuple(p) for p in prompts}) == len(prompts), "different messages gave the same prompt ids")
    suite.prompts = prompts + [prompts[1]]  # different lengths, and one prompt twice
    return f"prompt lengths {[len(p) for p in prompts]}"


def _shapes(suite: _Suite) -> str:
    be, prompts, params = suite.be, suite.prompts, suite.params
    samples = be.generate(prompts, params)
    _require(isinstance(samples, list) and len(samples) == len(prompts), f"{len(prompts)} prompts gave {len(samples)} samples")
    for i, s in enumerate(samples):
        _check_sample(s, i, params.max_new_tokens, be.eos_token_id, be.vocab_size)
    suite.initial = samples
    reasons = sorted({s.finish_reason for s in samples})
    return f"{len(samples)} samples, lengths {[len(s.token_ids) for s in samples]}, finish reasons {reasons}"


def _determinism(suite: _Suite) -> str:
    be, params, first = suite.be, suite.params, suite.initial
    again = be.generate(suite.prompts, params)
    _require([s.token_ids for s in again] == [s.token_ids for s in first], "the same seed gave different tokens")
    worst = max(abs(a - b) for x, y in zip(first, again) for a, b in zip(x.logprobs, y.logprobs))
    _require(worst < 1e-3, f"the same seed gave log-probs differing by {worst:.3g}")
    other = be.generate(suite.prompts, replace(params, seed=4321))
    _require([s.token_ids for s in other] != [s.token_ids for s in first], "a different seed gave the same tokens")
    return f"same seed: equal tokens, log-probs within {worst:.1g}"


def _distinct(suite: _Suite) -> str:
    be, params, prompt = suite.be, suite.params, suite.prompts[0]
    group = be.generate([prompt] * 4, replace(params, temperature=1.0, max_new_tokens=16))
    kinds = len({s.token_ids for s in group})
    _require(kinds >= 2, "a prompt repeated 4 times in one seeded batch gave 4 identical samples (a GRPO group needs distinct samples)")
    unseeded = replace(params, seed=None, temperature=1.0, max_new_tokens=16)
    a, b = be.generate([prompt], unseeded), be.generate([prompt], unseeded)
    _require(a[0].token_ids != b[0].token_ids, "two unseeded calls gave the same sample")
    return f"{kinds} distinct samples of 4"


def _finite(suite: _Suite) -> str:
    for i, s in enumerate(suite.initial):
        for lp in s.logprobs:
            _require(isinstance(lp, float) and math.isfinite(lp) and lp <= 1e-6, f"sample {i} has log-prob {lp!r}")
    return "all finite and <= 0"


def _reference_check(suite: _Suite, samples: list, label: str) -> str:
    """The samples' log-probs against transformers' log_softmax(logits / T) on the same tokens."""
    t, tol = suite.temperature, suite.tolerance
    err_t, err_1 = _logprob_errors(suite.ref, suite.folder, suite.prompts, samples, t)
    _require(
        err_t <= tol,
        f"{label}: log-probs differ from transformers' log_softmax(logits / {t}) by {err_t:.3g} "
        f"on average (tolerance {tol})",
    )
    _require(
        err_t < 0.5 * err_1,
        f"{label}: log-probs are not those of the tempered distribution (mean error {err_t:.3g} at "
        f"T={t}, {err_1:.3g} at T=1)",
    )
    return f"mean |error| {err_t:.2g} (at T=1 it would be {err_1:.2g})"


def _logprobs_reference(suite: _Suite) -> str:
    return _reference_check(suite, suite.initial, "initial weights")


def _bad_inputs(suite: _Suite) -> str:
    be, params, prompt = suite.be, suite.params, suite.prompts[1]
    cases = [
        ("temperature=0", [prompt], replace(params, temperature=0.0), "temperature"),
        ("top_p=1.5", [prompt], replace(params, top_p=1.5), "top_p"),
        ("max_new_tokens=0", [prompt], replace(params, max_new_tokens=0), "max_new_tokens"),
        ("an empty prompt", [[]], params, "prompt 0"),
        ("a token id = vocab_size", [[1, be.vocab_size]], params, "prompt 0"),
    ]
    for case, prompts, p, needle in cases:
        try:
            be.generate(prompts, p)
        except Echo2Error as exc:
            _require(needle in str(exc), f"{case}: the error does not name {needle!r}: {exc}")
        else:
            raise _Failed(f"{case} was accepted")
    after = be.generate(suite.prompts, params)
    _require([s.token_ids for s in after] == [s.token_ids for s in suite.initial], "outputs changed after refused calls")
    return f"{len(cases)} bad calls refused with errors naming the field"


def _install_changes(suite: _Suite) -> str:
    be, params = suite.be, suite.params
    suite.base = _folder_state(suite.folder)
    data = _serialize(_perturbed(suite.base), "bfloat16")
    v = suite.v0 + 1
    t0 = time.perf_counter()
    be.install(v, memoryview(data))  # workers install straight from the relay's buffer
    took = time.perf_counter() - t0
    _require(be.version == v, f"after installing v{v} the backend reports version {be.version}")
    after = be.generate(suite.prompts, params)
    for i, s in enumerate(after):
        _check_sample(s, i, params.max_new_tokens, be.eos_token_id, be.vocab_size)
    _require([s.token_ids for s in after] != [s.token_ids for s in suite.initial], "installing new weights did not change the outputs")
    suite.v1, suite.v1_samples = v, after
    detail = f"install {took:.2f}s"
    if suite.reference:  # the reference model takes the same weights
        import safetensors.torch

        model = _reference_model(suite.ref, suite.folder)
        model.load_state_dict({k: t.float() for k, t in safetensors.torch.load(data).items()}, strict=False)
        detail += "; " + _reference_check(suite, after, f"after installing v{v}")
    return detail


def _bad_snapshots_refused(suite: _Suite) -> str:
    be, v = suite.be, suite.v1
    cases = _bad_snapshots(suite.base, v, suite.folder)
    for case, (version, data, needle) in cases.items():
        try:
            be.install(version, data)
        except BackendError as exc:
            _require(needle in str(exc), f"{case}: the error does not name {needle!r}: {exc}")
        except Exception as exc:
            raise _Failed(f"{case}: raised {type(exc).__name__} instead of BackendError: {exc}") from None
        else:
            raise _Failed(f"{case} was installed")
        _require(be.version == v, f"{case}: the version changed to {be.version}")
    after = be.generate(suite.prompts, suite.params)
    _require([s.token_ids for s in after] == [s.token_ids for s in suite.v1_samples], "the weights changed after refused snapshots")
    return f"{len(cases)} bad snapshots refused: {', '.join(cases)}"


def _restores(suite: _Suite) -> str:
    be, v = suite.be, suite.v1 + 1
    be.install(v, _serialize(suite.base, None))
    _require(be.version == v, f"after installing v{v} the backend reports version {be.version}")
    after = be.generate(suite.prompts, suite.params)
    _require([s.token_ids for s in after] == [s.token_ids for s in suite.initial], "re-installing the initial weights did not restore the initial outputs")
    return f"v{v} = the initial weights gives the initial samples"


def _close(suite: _Suite) -> str:
    be = suite.be
    be.close()
    be.close()
    try:
        be.generate(suite.prompts[:1], suite.params)
    except Echo2Error:
        return "closed twice; generate then refused"
    raise _Failed("generate still worked after close()")


#: (check, function, the checks it needs), in the order of CHECKS.
_SUITE: tuple[tuple[str, Callable[[_Suite], str | None], tuple[str, ...]], ...] = (
    ("start", _start, ()),
    ("protocol", _protocol, ("start",)),
    ("encode_chat", _encode, ("start", "protocol")),
    ("generate_shapes", _shapes, ("encode_chat",)),
    ("seeded_determinism", _determinism, ("generate_shapes",)),
    ("distinct_samples", _distinct, ("generate_shapes",)),
    ("logprobs_finite", _finite, ("generate_shapes",)),
    ("logprobs_match_reference", _logprobs_reference, ("generate_shapes",)),
    ("bad_inputs_refused", _bad_inputs, ("generate_shapes",)),
    ("install_changes_output", _install_changes, ("generate_shapes",)),
    ("bad_snapshots_refused", _bad_snapshots_refused, ("install_changes_output",)),
    ("reinstall_restores_output", _restores, ("install_changes_output",)),
    ("close", _close, ("start",)),
)

#: The checks of `check_backend`, in the order they run.
CHECKS: tuple[str, ...] = tuple(name for name, _, _ in _SUITE)


def _check_sample(s: object, i: int, max_new: int, eos: int, vocab: int) -> None:
    _require(isinstance(s, Sample), f"sample {i} is a {type(s).__name__}, not a Sample")
    assert isinstance(s, Sample)
    n = len(s.token_ids)
    _require(1 <= n <= max_new, f"sample {i} has {n} tokens (max_new_tokens={max_new})")
    _require(len(s.logprobs) == n, f"sample {i} has {n} tokens but {len(s.logprobs)} log-probs")
    _require(all(type(t) is int and 0 <= t < vocab for t in s.token_ids), f"sample {i} has token ids outside [0, {vocab})")
    _require(isinstance(s.text, str), f"sample {i} text is {type(s.text).__name__}")
    if s.finish_reason == "stop":
        _require(s.token_ids[-1] == eos and eos not in s.token_ids[:-1], f"sample {i} finished 'stop' without ending at eos={eos}")
    else:
        _require(s.finish_reason == "length", f"sample {i} has finish_reason {s.finish_reason!r}")
        _require(n == max_new and eos not in s.token_ids, f"sample {i} finished 'length' after {n} of {max_new} tokens")


def _folder_state(folder: str) -> dict:
    """The model folder's checkpoint tensors, as stored (names as in the folder, e.g. tied lm_head omitted)."""
    from pathlib import Path

    import safetensors.torch

    state: dict = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        state.update(safetensors.torch.load_file(str(path)))
    _require(bool(state), f"model folder {folder!r} has no *.safetensors checkpoint to build snapshots from")
    return state


def _perturbed(state: dict) -> dict:
    """Every matrix moved by half its own standard deviation of noise (seeded); vectors (norms) kept."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, t in state.items():
        if t.is_floating_point() and t.dim() >= 2:
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            t = (t.float() + 0.5 * float(t.float().std()) * noise).to(t.dtype)
        out[name] = t
    return out


def _serialize(state: dict, dtype: str | None) -> bytes:
    import safetensors.torch
    import torch

    if dtype is not None:
        state = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in state.items()}
    return safetensors.torch.save({k: v.contiguous() for k, v in state.items()}, metadata={"format": "pt"})


def _bad_snapshots(base: dict, current: int, folder: str) -> dict[str, tuple[int, bytes, str]]:
    """name -> (version, bytes, text the refusal must contain); every version but one is newer than `current`."""
    import json
    from pathlib import Path

    import torch

    matrix = next(k for k, t in base.items() if t.dim() == 2 and t.is_floating_point())
    last = sorted(base)[-1]
    v = current + 1

    def edit(fn: Callable[[dict], None]) -> bytes:
        state = {k: t.clone() for k, t in base.items()}
        fn(state)
        return _serialize(state, None)

    def poison(value: float) -> Callable[[dict], None]:
        def fn(state: dict) -> None:
            state[matrix].view(-1)[0] = value

        return fn

    rows, cols = base[matrix].shape
    cases = {
        "garbage bytes": (v, b"\x00\x01 not a safetensors file", "safetensors"),
        "empty bytes": (v, b"", "safetensors"),
        "wrong shape": (v, edit(lambda s: s.__setitem__(matrix, torch.zeros(rows + 1, cols))), matrix),
        "unknown key": (v, edit(lambda s: s.__setitem__("model.echo2_unknown.weight", torch.ones(3))), "model.echo2_unknown.weight"),
        "missing key": (v, edit(lambda s: s.pop(last)), last),
        "NaN": (v, edit(poison(float("nan"))), matrix),
        "inf": (v, edit(poison(float("inf"))), matrix),
        "integer dtype": (v, edit(lambda s: s.__setitem__(matrix, torch.ones(rows, cols, dtype=torch.int32))), matrix),
        "older version": (current - 1, _serialize(base, None), "older"),
        "non-int version": (str(v), _serialize(base, None), "int"),  # type: ignore[dict-item]
    }
    config = json.loads((Path(folder) / "config.json").read_text())
    embed = next((k for k in base if k.endswith("embed_tokens.weight")), None)
    if config.get("tie_word_embeddings") and embed is not None and "lm_head.weight" not in base:
        cases["tied copies differ"] = (v, edit(lambda s: s.__setitem__("lm_head.weight", s[embed] + 1)), "lm_head.weight")
    return cases


def _reference_model(cache: dict, folder: str) -> Any:
    model = cache.get("model")
    if model is None:
        import torch
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        cache["model"] = model
    return model


def _logprob_errors(cache: dict, folder: str, prompts: list, samples: list, temperature: float) -> tuple[float, float]:
    """Mean |recorded - reference| over all tokens, for the reference at `temperature` and at 1. The reference
    model (transformers, float32) is loaded once and carries the weights the backend should have: the
    initial folder, or the last snapshot installed (cache["weights"])."""
    import torch

    model = _reference_model(cache, folder)
    errs_t: list[float] = []
    errs_1: list[float] = []
    with torch.inference_mode():
        for prompt, s in zip(prompts, samples):
            ids = torch.tensor([list(prompt) + list(s.token_ids)])
            logits = model(input_ids=ids).logits[0].float()
            n, targets = len(prompt), torch.tensor(s.token_ids)[:, None]
            recorded = torch.tensor(s.logprobs)
            for temp, errs in ((temperature, errs_t), (1.0, errs_1)):
                ref = torch.log_softmax(logits / temp, dim=-1)[n - 1 : n - 1 + len(s.token_ids)].gather(1, targets).squeeze(1)
                errs.extend((recorded - ref).abs().tolist())
    return sum(errs_t) / len(errs_t), sum(errs_1) / len(errs_1)


def _check_adapter_cli(name: str, options: dict, tasks: int, seed: int, backend: str | None, model: str) -> int:
    """`check-adapter`: one JSON line, {"adapter", "check": "pass", ...the report} or {"check": "fail", "error"}."""
    from echo2sdk.plugins import load_adapter, load_backend_class

    engine = None
    try:
        adapter = load_adapter(name, options)
        if backend == "mock":
            engine = MockBackend()
        elif backend is not None:
            engine = load_backend_class(backend)(model)  # a built-in name or a folder (weights.resolve_model)
        report = check_adapter(adapter, backend=engine, seed=seed, tasks=tasks)
    except Echo2Error as e:
        print(json.dumps({"adapter": name, "check": "fail", "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    finally:
        if engine is not None:
            engine.close()
    report.pop("rewards", None)
    if report.get("reference_reward_mean") == 0:
        report["warning"] = ("every task's own answer (as given, boxed and tagged) scores 0: check the answer column "
                             "or field and the scorer")
    print(json.dumps({"adapter": name, "check": "pass", **report}), flush=True)
    return 0


def _parser() -> Any:
    """The command line of ``python -m echo2sdk.testing``: check-backend and check-adapter."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m echo2sdk.testing", description="echo2sdk conformance suites")
    sub = parser.add_subparsers(dest="command", required=True)
    cb = sub.add_parser("check-backend", help="run check_backend and print one JSON line per check")
    cb.add_argument("backend", help="registered backend name or pkg.mod:Class")
    cb.add_argument("--model", default=DEFAULT_MODEL, help=f"model folder or built-in name (default {DEFAULT_MODEL}: 64-wide heads, which every engine takes)")
    cb.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="backend option (JSON value or text)")
    cb.add_argument("--temperature", type=float, default=0.7)
    cb.add_argument("--tolerance", type=float, default=0.05, help="mean |log-prob error| allowed against transformers")
    cb.add_argument("--no-reference", action="store_true", help="skip the comparison with transformers")
    ca = sub.add_parser("check-adapter", help="run check_adapter on a task adapter and print its report as JSON")
    ca.add_argument("adapter", nargs="?", help="registered name, URL (reasoning-gym://chain_sum, dataset://data.jsonl, "
                    "poker://nlhe_headsup_v1) or pkg.mod:Class")
    ca.add_argument("--config", help="check the task a run config names (its [[task.mix]] mixture too) instead")
    ca.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option (JSON value or text)")
    ca.add_argument("--tasks", type=int, default=ADAPTER_TASKS, help=f"tasks drawn and checked (default {ADAPTER_TASKS})")
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--backend", help="also play 2 groups through this backend: mock (no model) or a registered "
                    "backend name with --model")
    ca.add_argument("--model", default="tiny-random", help="the --backend's model (default tiny-random)")
    return parser


def _main(argv: list[str] | None = None) -> int:
    import json
    import sys

    parser = _parser()
    args = parser.parse_args(argv)
    options = {}
    for item in args.option:
        key, sep, text = item.partition("=")
        if not sep:
            parser.error(f"--option expects KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(text)
        except ValueError:
            options[key] = text
    if args.command == "check-adapter":
        if (args.adapter is None) == (args.config is None):
            parser.error("check-adapter takes an ADAPTER or --config FILE (one of them)")
        if args.config is not None:
            from echo2sdk.config import load_config

            if options:
                parser.error("--option applies to an ADAPTER; --config FILE names the task and its options")
            cfg = load_config(args.config)
            args.adapter, options = cfg.task.adapter, dict(cfg.task.options)
        return _check_adapter_cli(args.adapter, options, args.tasks, args.seed, args.backend, args.model)

    def emit(r: CheckResult) -> None:
        print(json.dumps({"backend": args.backend, **r.to_json()}), flush=True)

    results = check_backend(
        args.backend,
        args.model,
        options=options,
        temperature=args.temperature,
        logprob_tolerance=args.tolerance,
        reference=not args.no_reference,
        report=emit,
        raise_on_failure=False,
    )
    failed = [r.name for r in results if r.passed is False]
    print(json.dumps({"backend": args.backend, "summary": "fail" if failed else "pass", "failed": failed}), flush=True)
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(_main())
