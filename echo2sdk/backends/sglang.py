"""The ``sglang`` inference backend: the offline ``sglang.Engine`` inside the worker process (CUDA only:
SGLang has no CPU wheel, so its tests skip here; ``bench/gpu_check.sh`` runs the conformance suite on a
CUDA machine).

Sampling follows the ``hf`` backend's contract: SGLang reports log-probs of the tempered distribution
(log_softmax(logits / T), untruncated by top-p) unless SGLANG_RETURN_ORIGINAL_LOGPROB is set, which this
backend refuses; a response stops at, and includes, the end-of-sequence token; row i of a seeded batch
gets its own ``sampling_seed`` derived from (seed, i). SGLang honours per-request seeds with
``enable_deterministic_inference`` (the default here).

Snapshots are checked against the model folder's checkpoint (as the other backends check them), then
loaded in place with ``Engine.update_weights_from_tensor`` (Hugging Face names; SGLang maps them onto its
fused parameters), which flushes the prefix cache. ``update_weights_from_disk`` is what the ``openai``
backend uses against an SGLang server.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from echo2sdk.backends._common import (
    BackendBase,
    Layout,
    check_params,
    check_prompts,
    check_snapshot,
    finished_sample,
    read_config,
    resolve_eos,
    row_seeds,
)
from echo2sdk.core import checks
from echo2sdk.core.contracts import Sample, SamplingParams
from echo2sdk.errors import BackendError, ConfigError, DependencyNotInstalled
from echo2sdk.weights import resolve_model

__all__ = ["SGLangBackend"]

_DTYPES = ("auto", "bfloat16", "float16", "float32")


def _import_sglang() -> Any:
    try:
        import sglang
    except ImportError as exc:
        if exc.name is not None and exc.name != "sglang" and not exc.name.startswith("sglang."):
            raise BackendError(f"sglang is installed but failed to import ({exc}); check its dependencies") from exc
        raise DependencyNotInstalled("sglang", "sglang") from exc
    return sglang


class SGLangBackend(BackendBase):
    """InferenceBackend on the offline SGLang engine.

    model:               a local HF model folder (safetensors), or a built-in name (echo2sdk.weights)
    dtype:               "bfloat16" (default), "float16", "float32" or "auto"
    seed:                the engine's random seed (used when SamplingParams.seed is None)
    mem_fraction_static: share of GPU memory for weights + KV cache (default: SGLang's)
    deterministic:       enable_deterministic_inference, needed for per-request seeds (default True)
    engine_options:      further keyword arguments for sglang.Engine, passed as they are
    """

    _name = "sglang"

    def __init__(
        self,
        model: str,
        dtype: str = "bfloat16",
        seed: int = 0,
        mem_fraction_static: float | None = None,
        deterministic: bool = True,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        if dtype not in _DTYPES:
            raise ConfigError(f"sglang backend dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        checks.integer("sglang backend seed", seed, error=ConfigError)
        name = "sglang backend mem_fraction_static"
        if mem_fraction_static is not None and checks.real(name, mem_fraction_static, lo=0, open_lo=True, error=ConfigError) >= 1:
            raise ConfigError(f"{name} must be in (0, 1), got {name}={mem_fraction_static!r}")
        if not isinstance(deterministic, bool):
            raise ConfigError(f"sglang backend deterministic must be true or false, got {deterministic!r}")
        if engine_options is not None and not isinstance(engine_options, dict):
            raise ConfigError(f"sglang backend engine_options must be a table of sglang.Engine arguments, got {engine_options!r}")
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true"):
            raise ConfigError(
                "SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would report untempered log-probs, not those of "
                "the distribution sampled from; unset it"
            )
        folder = resolve_model(model)
        self._folder = folder
        self._layout = Layout.from_folder(folder)
        config = read_config(folder)
        sglang = _import_sglang()
        kwargs: dict[str, Any] = dict(
            model_path=folder,
            dtype=dtype,
            random_seed=seed,
            enable_deterministic_inference=deterministic,
            log_level="error",
        )
        if mem_fraction_static is not None:
            kwargs["mem_fraction_static"] = mem_fraction_static
        kwargs.update(engine_options or {})
        try:
            self._engine: Any = sglang.Engine(**kwargs)
        except (ValueError, TypeError, RuntimeError, OSError) as exc:
            raise BackendError(f"sglang could not start on {folder!r} with {kwargs!r}: {exc}") from exc
        import transformers

        self._tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        self._vocab = int(config.get("vocab_size") or len(self._tokenizer))
        self._max_len = config.get("max_position_embeddings")
        self._eos = resolve_eos(folder, self._tokenizer.eos_token_id, config.get("eos_token_id"))
        self._dtype = dtype

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        self._check_open()
        check_params(params)
        batch = check_prompts(prompts, self._vocab, self._max_len, params.max_new_tokens)
        if not batch:
            return []
        seeds = row_seeds(params.seed, len(batch))
        sampling = []
        for seed in seeds:
            sp: dict[str, Any] = {
                "max_new_tokens": params.max_new_tokens,
                "temperature": float(params.temperature),
                "top_p": float(params.top_p),
                "top_k": int(params.top_k) or -1,  # -1: off
                "min_p": float(params.min_p),
                "stop_token_ids": [self._eos],
                "no_stop_trim": True,  # keep the end-of-sequence token in the output ids
            }
            if seed is not None:
                sp["sampling_seed"] = seed
            sampling.append(sp)
        try:
            outputs = self._engine.generate(input_ids=batch, sampling_params=sampling, return_logprob=True)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"sglang generation failed: {exc}") from exc
        if isinstance(outputs, dict):
            outputs = [outputs]
        return [self._sample(i, out) for i, out in enumerate(outputs)]

    def _sample(self, row: int, out: dict[str, Any]) -> Sample:
        meta = out.get("meta_info") or {}
        entries = meta.get("output_token_logprobs") or []  # (logprob, token_id, text or None) per token
        ids = tuple(int(e[1]) for e in entries)
        if "output_ids" in out and tuple(int(t) for t in out["output_ids"]) != ids:
            raise BackendError(f"sglang returned log-probs for other tokens than it generated (prompt {row})")
        logprobs = tuple(float(e[0]) for e in entries)
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type") if isinstance(finish, dict) else finish
        if not ids:
            raise BackendError(f"sglang returned no tokens for prompt {row}")
        return finished_sample(f"sglang (prompt {row})", ids, logprobs, reason, self._eos, self._tokenizer)

    def install(self, version: int, weights: bytes) -> None:
        """Check the snapshot against the model's checkpoint, then update every weight in place."""
        self._check_open()
        current = self._version
        check_snapshot(version, current, weights, self._layout)
        import safetensors.torch

        tensors = list(safetensors.torch.load(bytes(weights)).items())
        try:
            result = self._engine.update_weights_from_tensor(tensors, flush_cache=True)
        except Exception as exc:  # the engine's own failure, after the checks: weights may be half-loaded
            self._broken = f"updating to snapshot v{version} failed midway ({exc}); the engine's weights are undefined"
            raise BackendError(self._broken) from exc
        ok, message = (result[0], result[1]) if isinstance(result, (tuple, list)) and len(result) >= 2 else (True, "")
        if not ok:
            self._broken = f"sglang refused snapshot v{version} after the checks ({message}); weights may be half-loaded"
            raise BackendError(self._broken)
        self._version = version

    def close(self) -> None:
        """Shut the engine down; later calls raise BackendError. Closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        try:
            engine.shutdown()
        except Exception:  # already gone
            pass

    def __enter__(self) -> SGLangBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

