"""`check_backend`: the conformance suite every inference backend (ours and third parties') should pass.

    python -m echo2sdk.testing check-backend vllm --model tiny-random-h64 --option dtype=float32

runs the suite from the command line and prints one JSON line per check. torch and transformers are
imported inside the checks that need them; importing this module is cheap."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from echo2sdk.core import checks
from echo2sdk.core.contracts import InferenceBackend, Sample, SamplingParams
from echo2sdk.errors import BackendError, ConfigError, Echo2Error
from echo2sdk.weights import folder_state, resolve_model

__all__ = ["CHECKS", "DEFAULT_MODEL", "BackendCheckError", "CheckResult", "check_backend"]

#: check_backend's default model: tiny-random with 64-wide attention heads, a head size every engine's
#: kernels take (vLLM's CPU attention rejects tiny-random's 16-wide heads on AVX2-only CPUs).
DEFAULT_MODEL = "tiny-random-h64"

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
    try:
        suite.base = folder_state(suite.folder)
    except ConfigError as exc:
        raise _Failed(f"{exc} to build snapshots from") from None
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
