"""echo2sdk.testing.check_backend: the hf backend passes it, and it fails backends that break the contract
(ignore snapshots, install NaNs, report the wrong log-probs, hand out identical samples to a group)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from echo2sdk.backends.hf import HFBackend  # noqa: E402
from echo2sdk.core.contracts import Sample  # noqa: E402
from echo2sdk.errors import NameNotFound  # noqa: E402
from echo2sdk.testing import CHECKS, BackendCheckError, MockBackend, check_backend  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _failed(results) -> dict[str, str]:
    return {r.name: r.detail for r in results if r.passed is False}


def test_hf_passes_check_backend(tiny_dir: str) -> None:
    seen = []
    results = check_backend("hf", tiny_dir, options={"threads": 1}, logprob_tolerance=1e-3, report=seen.append)
    assert [r.name for r in results] == list(CHECKS) == [r.name for r in seen]
    assert all(r.passed is True for r in results), _failed(results)


def test_an_instance_is_checked_but_not_closed(tiny_dir: str) -> None:
    with HFBackend(tiny_dir, threads=1) as be:
        results = {r.name: r for r in check_backend(be, tiny_dir)}
        assert results["close"].passed is None and "caller" in results["close"].detail
        assert all(r.passed for name, r in results.items() if name != "close")
        assert be.version == 2  # the suite installed v1 (perturbed) and v2 (the initial weights)


def test_a_backend_that_ignores_snapshots_fails(tiny_dir: str) -> None:
    with pytest.raises(BackendCheckError) as info:
        check_backend(MockBackend, tiny_dir)
    failed = _failed(info.value.results)
    assert "install_changes_output" in failed
    assert "logprobs_match_reference" in failed  # uniform log-probs are not the model's
    assert "bad_inputs_refused" in failed  # it accepts temperature=0 and empty prompts


class _NoFiniteCheck(HFBackend):
    """Installs snapshots with NaN or inf in them."""

    def _validate(self, state):
        problems = super()._validate(state)
        return [p for p in problems if "non-finite" not in p]


def test_a_backend_that_installs_non_finite_weights_fails(tiny_dir: str) -> None:
    results = check_backend(_NoFiniteCheck, tiny_dir, options={"threads": 1}, raise_on_failure=False)
    failed = _failed(results)
    assert list(failed) == ["bad_snapshots_refused"]
    assert "NaN was installed" in failed["bad_snapshots_refused"]


class _RawLogprobs(HFBackend):
    """Samples at the requested temperature but reports the untempered (T = 1) log-probs."""

    def generate(self, prompts, params):
        samples = super().generate(prompts, params)
        out = []
        for prompt, s in zip(prompts, samples):
            ids = torch.tensor([list(prompt) + list(s.token_ids)])
            with torch.no_grad():
                logp = torch.log_softmax(self._model(input_ids=ids).logits[0].float(), dim=-1)
            n = len(prompt)
            raw = logp[n - 1 : n - 1 + len(s.token_ids)].gather(1, torch.tensor(s.token_ids)[:, None]).squeeze(1)
            out.append(Sample(s.token_ids, tuple(raw.tolist()), s.text, s.finish_reason))
        return out


def test_a_backend_reporting_untempered_logprobs_fails(tiny_dir: str) -> None:
    # a loose tolerance: the suite must still tell tempered from untempered log-probs
    results = check_backend(_RawLogprobs, tiny_dir, options={"threads": 1}, logprob_tolerance=1.0, raise_on_failure=False)
    failed = _failed(results)
    assert set(failed) == {"logprobs_match_reference", "install_changes_output"}
    assert "not those of the tempered distribution" in failed["logprobs_match_reference"]


class _OneSeedForAll(HFBackend):
    """Seeds every row of a batch alike, so a repeated prompt gives identical samples."""

    def generate(self, prompts, params):
        if params.seed is None:
            return super().generate(prompts, params)
        return [super(_OneSeedForAll, self).generate([p], params)[0] for p in prompts]


def test_a_backend_giving_a_group_identical_samples_fails(tiny_dir: str) -> None:
    results = check_backend(_OneSeedForAll, tiny_dir, options={"threads": 1}, raise_on_failure=False)
    assert list(_failed(results)) == ["distinct_samples"]


def test_an_unknown_backend_name_is_a_start_failure(tiny_dir: str) -> None:
    results = check_backend("vlm", tiny_dir, raise_on_failure=False)
    assert results[0].name == "start" and results[0].passed is False and "NameNotFound" in results[0].detail
    assert all(r.passed is None for r in results[1:])
    with pytest.raises(NameNotFound):
        from echo2sdk.plugins import load_backend_class

        load_backend_class("vlm")


def test_the_command_line_prints_one_json_line_per_check(tiny_dir: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "echo2sdk.testing", "check-backend", "mock", "--model", tiny_dir, "--no-reference"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [line["check"] for line in lines[:-1]] == list(CHECKS)
    assert lines[-1]["summary"] == "fail" and "install_changes_output" in lines[-1]["failed"]
    assert proc.returncode == 1

