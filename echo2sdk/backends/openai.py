"""The ``openai`` inference backend: any OpenAI-compatible server (``vllm serve``, SGLang's server, Parallax).

Generation is ``POST /v1/completions`` with token-id prompts, one request per prompt (sent concurrently;
the server batches them), each with its own seed derived from (SamplingParams.seed, row), so a GRPO
group gets distinct samples and a seeded batch is reproducible. The sampled tokens come back as ids
(vLLM's ``return_token_ids``, else ``return_tokens_as_token_ids``) with their log-probs; text is decoded
locally with the model folder's tokenizer, as the other backends do.

The log-probs are whatever the server reports. They are log pi_sampler at the temperature used only if
the server computes them after temperature: start vLLM with ``--logprobs-mode processed_logprobs``
(its default reports the raw, untempered log-probs); SGLang reports the tempered ones unless
SGLANG_RETURN_ORIGINAL_LOGPROB is set. A CPU vLLM server also needs ``--no-enable-chunked-prefill
--max-num-batched-tokens 8192``: it fails seeded requests whose prefill is split across steps.

Snapshots are checked against the model folder's checkpoint (exactly as the ``vllm`` backend checks
them), written as a model folder under ``snapshot_dir`` (which the server must be able to read: same
machine or shared storage) and loaded by the server's reload endpoint:

* vLLM: ``POST /collective_rpc`` (needs VLLM_SERVER_DEV_MODE=1) calling ``echo2_reload_weights`` when the
  server runs with ``--worker-extension-cls echo2sdk.backends.vllm.Echo2WorkerExtension`` (needed on
  CPU, where vLLM's plain reload leaves a tied output head stale), else ``reload_weights``; then
  ``POST /reset_prefix_cache``;
* SGLang: ``POST /update_weights_from_disk``.

A server with neither cannot follow the policy: install() says so, naming the endpoints it looked for.
Only the standard library speaks HTTP here; transformers is needed for the tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from echo2sdk.backends._common import (
    BackendBase,
    Layout,
    check_params,
    check_prompts,
    check_snapshot,
    check_version,
    finished_sample,
    positive_int,
    read_config,
    resolve_eos,
    row_seeds,
)
from echo2sdk.core import checks
from echo2sdk.core.contracts import Sample, SamplingParams
from echo2sdk.errors import BackendError, ConfigError, DependencyNotInstalled
from echo2sdk.weights import resolve_model

__all__ = ["OpenAIBackend"]

_RELOAD_MODES = ("auto", "vllm", "sglang", "none")
_COPIED = ("config.json", "generation_config.json")  # SGLang reads the config next to the weights


def _check_options(
    base_url: str, served_model: str | None, api_key: str | None, reload: str, snapshot_dir: str | None,
    timeout_s: float, max_concurrency: int,
) -> None:
    """ConfigError naming the first bad option of OpenAIBackend."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"openai backend base_url must be an http(s) URL, got {base_url!r}")
    if reload not in _RELOAD_MODES:
        raise ConfigError(f"openai backend reload must be one of {', '.join(_RELOAD_MODES)}, got {reload!r}")
    checks.real("openai backend timeout_s", timeout_s, lo=0, open_lo=True, error=ConfigError)
    positive_int("openai backend max_concurrency", max_concurrency)
    for name, value in (("served_model", served_model), ("api_key", api_key), ("snapshot_dir", snapshot_dir)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"openai backend {name} must be a string, got {value!r}")


def _snapshot_folder(snapshot_dir: str | None) -> Path:
    """`snapshot_dir`, created if missing; None: a new temporary folder, in /dev/shm when it is writable."""
    if snapshot_dir is None:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        snapshot_dir = tempfile.mkdtemp(prefix="echo2-snapshots-", dir=shm)
    folder = Path(snapshot_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class OpenAIBackend(BackendBase):
    """InferenceBackend on an OpenAI-compatible HTTP server.

    model:           the local model folder (or built-in name) the server serves: its tokenizer encodes
                     prompts, its checkpoint layout checks snapshots
    base_url:        the server, e.g. "http://127.0.0.1:8000" (a trailing /v1 is fine)
    served_model:    the model name at the server (default: the only one it lists)
    api_key:         sent as a bearer token when given
    reload:          "auto" (find the server's reload endpoint), "vllm", "sglang" or "none"
    snapshot_dir:    where snapshots are written for the server to read (default: a private temporary
                     folder, in /dev/shm when it exists); only the installed snapshot is kept
    timeout_s:       per HTTP request
    max_concurrency: requests in flight at once
    """

    _name = "openai"

    def _where(self) -> str:
        return str(self._root)

    def _describe(self) -> str:
        return f"server={self._root!r}, model={self._served!r}, reload={self._reload!r}"

    def __init__(
        self,
        model: str,
        base_url: str = "http://127.0.0.1:8000",
        served_model: str | None = None,
        api_key: str | None = None,
        reload: str = "auto",
        snapshot_dir: str | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
    ) -> None:
        _check_options(base_url, served_model, api_key, reload, snapshot_dir, timeout_s, max_concurrency)
        try:
            import transformers
        except ImportError as exc:
            raise DependencyNotInstalled(exc.name or "transformers", "openai") from exc

        folder = resolve_model(model)
        self._folder = folder
        self._layout = Layout.from_folder(folder)
        config = read_config(folder)
        try:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot load the tokenizer of {folder!r}: {exc}") from exc
        self._root = base_url.rstrip("/").removesuffix("/v1")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = float(timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="echo2-openai")

        listed = self._call("GET", "/v1/models").get("data") or []
        names = [m.get("id") for m in listed if isinstance(m, dict)]
        if served_model is None:
            if len(names) != 1:
                raise ConfigError(f"openai backend: the server at {self._root} serves {names}; set served_model to one")
            served_model = names[0]
        elif served_model not in names:
            raise ConfigError(f"openai backend served_model={served_model!r} is not served at {self._root}; it serves {names}")
        self._served = served_model
        entry = next(m for m in listed if m.get("id") == served_model)
        self._max_len = entry.get("max_model_len") or config.get("max_position_embeddings")
        self._vocab = int(config.get("vocab_size") or len(self._tokenizer))
        self._eos = resolve_eos(folder, self._tokenizer.eos_token_id, config.get("eos_token_id"))
        self._reload = self._find_reload() if reload == "auto" else reload
        self._own_dir = snapshot_dir is None
        self._snapshot_dir = _snapshot_folder(snapshot_dir)
        self._installed: Path | None = None
        self._version = 0
        self._closed = False

    # ------------------------------------------------------------------------------------- HTTP

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._root + path, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise BackendError(f"the server at {self._root} answered {exc.code} to {method} {path}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BackendError(f"cannot reach the server at {self._root} ({method} {path}): {reason}") from exc
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise BackendError(f"the server at {self._root} answered {method} {path} with non-JSON: {raw[:200]!r}") from exc

    def _route_exists(self, path: str) -> bool:
        """A POST-only route answers GET with 405 (or 422); a missing one with 404."""
        request = urllib.request.Request(self._root + path, method="GET", headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=min(self._timeout, 30.0)):
                return True
        except urllib.error.HTTPError as exc:
            return exc.code in (405, 422)
        except (urllib.error.URLError, OSError):
            return False

    def _find_reload(self) -> str:
        if self._route_exists("/collective_rpc"):
            return "vllm"
        if self._route_exists("/update_weights_from_disk"):
            return "sglang"
        return "none"

    # ------------------------------------------------------------------------------- properties

    @property
    def reload_mode(self) -> str:
        """How snapshots reach the server: "vllm", "sglang" or "none"."""
        return self._reload

    # -------------------------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        self._check_open()
        check_params(params)
        if self._reload == "none" and (params.top_k or params.min_p):
            raise ConfigError(
                f"backend 'openai': rollout.top_k={params.top_k} / rollout.min_p={params.min_p} need a vLLM or SGLang "
                f"server (they take top_k and min_p as extra fields); the server at {self._root} is neither: set both to 0"
            )
        batch = check_prompts(prompts, self._vocab, self._max_len, params.max_new_tokens)
        seeds = row_seeds(params.seed, len(batch))
        bodies = []
        for ids, seed in zip(batch, seeds):
            body: dict[str, Any] = {
                "model": self._served,
                "prompt": ids,
                "max_tokens": params.max_new_tokens,
                "temperature": float(params.temperature),
                "top_p": float(params.top_p),
                **({"top_k": int(params.top_k)} if params.top_k else {}),  # vLLM's and SGLang's extra sampling
                **({"min_p": float(params.min_p)} if params.min_p else {}),  # fields; sent only when on
                "logprobs": 0,  # the sampled token's log-prob only
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            }
            if seed is not None:
                body["seed"] = seed
            bodies.append(body)
        replies = list(self._pool.map(lambda b: self._call("POST", "/v1/completions", b), bodies))
        return [self._sample(i, reply) for i, reply in enumerate(replies)]

    def _sample(self, row: int, reply: dict[str, Any]) -> Sample:
        try:
            choice = reply["choices"][0]
            logprobs = choice.get("logprobs") or {}
            values = logprobs.get("token_logprobs") or []
            ids = choice.get("token_ids")
            if ids is None:  # "token_id:123" strings
                ids = [int(str(t).rpartition(":")[2]) for t in logprobs.get("tokens") or []]
            ids = tuple(int(t) for t in ids)
            lps = tuple(float(v) for v in values)
            reason = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"the server's completion for prompt {row} is malformed ({exc}): {reply!r:.300}") from exc
        if not ids or len(lps) != len(ids):
            raise BackendError(
                f"the server returned {len(ids)} token ids and {len(lps)} log-probs for prompt {row}: it must "
                "return token ids and log-probs (vLLM and SGLang do with logprobs=0)"
            )
        return finished_sample(f"the server (prompt {row})", ids, lps, reason, self._eos, self._tokenizer)

    # ---------------------------------------------------------------------------------- snapshots

    def install(self, version: int, weights: bytes) -> None:
        """Check the snapshot, write it where the server can read it, and have the server reload it."""
        self._check_open()
        current = self._version
        check_version(version, current)  # first: a stale version is refused whatever the server can do
        if self._reload == "none":
            raise BackendError(
                f"snapshot v{version} refused, kept v{current}: the server at {self._root} has no weight-reload "
                "endpoint (vLLM: POST /collective_rpc with VLLM_SERVER_DEV_MODE=1; SGLang: POST "
                "/update_weights_from_disk), so it cannot follow the policy"
            )
        check_snapshot(version, current, weights, self._layout)
        target = Path(tempfile.mkdtemp(prefix=f"v{version}-", dir=self._snapshot_dir))
        try:
            (target / "model.safetensors").write_bytes(bytes(weights))
            for name in _COPIED:
                if (Path(self._folder) / name).is_file():
                    shutil.copy(Path(self._folder) / name, target / name)
            self._server_reload(version, str(target))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        if self._installed is not None:
            shutil.rmtree(self._installed, ignore_errors=True)
        self._installed = target
        self._version = version

    def _server_reload(self, version: int, path: str) -> None:
        if self._reload == "sglang":
            reply = self._call("POST", "/update_weights_from_disk", {"model_path": path})
            if reply.get("success") is False:
                raise BackendError(f"the server refused snapshot v{version}: {reply.get('message')}")
            return
        try:
            self._call("POST", "/collective_rpc", {"method": "echo2_reload_weights", "kwargs": {"weights_path": path}})
        except BackendError as exc:
            if "echo2_reload_weights" not in str(exc):
                raise
            # a server without echo2sdk's worker extension: vLLM's own reload (on CPU a tied head stays stale)
            self._call(
                "POST",
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": path, "is_checkpoint_format": True}},
            )
        self._call("POST", "/reset_prefix_cache")

    # ------------------------------------------------------------------------------------- close

    def close(self) -> None:
        """Stop the request pool and delete this backend's snapshot files (the server keeps running)."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        if self._installed is not None:
            shutil.rmtree(self._installed, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self._snapshot_dir, ignore_errors=True)

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(f"openai backend for {self._root} is closed")
