"""The sglang backend. SGLang has no CPU wheel, so the conformance run skips here (bench/gpu_check.sh runs
it on a CUDA machine); what does not need the engine runs everywhere."""

from __future__ import annotations

import importlib.util

import pytest

from echo2sdk.errors import ConfigError, DependencyNotInstalled
from echo2sdk.testing import CHECKS, check_backend

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_SGLANG, reason="sglang is not installed (it has no CPU wheel)")
def test_sglang_passes_check_backend() -> None:
    if not _cuda():
        pytest.skip("sglang needs a CUDA device")
    results = check_backend("sglang", "smollm2-135m", options={"dtype": "float32"}, logprob_tolerance=0.02)
    assert [r.name for r in results] == list(CHECKS)


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"dtype": "float8"}, "dtype"),
        ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
        ({"deterministic": "yes"}, "deterministic"),
        ({"engine_options": 3}, "engine_options"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options: dict, needle: str) -> None:
    from echo2sdk.backends.sglang import SGLangBackend

    with pytest.raises(ConfigError, match=needle):
        SGLangBackend("tiny-random", **options)


def test_untempered_logprobs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from echo2sdk.backends.sglang import SGLangBackend

    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with pytest.raises(ConfigError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        SGLangBackend("tiny-random")


@pytest.mark.skipif(HAVE_SGLANG, reason="sglang is installed here")
def test_a_missing_engine_names_the_extra(tiny_dir: str) -> None:
    from echo2sdk.backends.sglang import SGLangBackend

    with pytest.raises(DependencyNotInstalled, match=r'pip install "echo2sdk\[sglang\]"'):
        SGLangBackend(tiny_dir)
