"""Inference backends (the rollout plane's engines): ``hf`` (transformers, the CPU default), ``vllm`` (the
offline vLLM engine), ``sglang`` (the offline SGLang engine) and ``openai`` (any OpenAI-compatible server).
Each implements ``echo2sdk.core.contracts.InferenceBackend`` and registers under the ``echo2sdk.backends``
entry-point group as a "pkg.mod:Class" string; nothing heavy is imported here or by the backend modules
until a backend is constructed. See docs/backends.md."""

from __future__ import annotations

import difflib
import importlib.util

__all__ = ["ENGINES", "backend_problem"]

#: Built-in backends that need an engine package: name -> (module to import, extra that installs it).
ENGINES: dict[str, tuple[str, str]] = {
    "hf": ("transformers", "hf"),
    "vllm": ("vllm", "vllm"),
    "sglang": ("sglang", "sglang"),
    "openai": ("transformers", "openai"),
}


def backend_problem(name: str, local_workers: int) -> str | None:
    """Why `rollout.backend = name` cannot work here, or None. A "pkg.mod:Class" reference is checked when
    it is loaded; an engine is only required when local workers (which run in this environment) use it."""
    from echo2sdk.plugins import BACKENDS, registered

    if ":" in name:
        return None
    known = sorted(registered(BACKENDS))
    if name not in known:
        close = difflib.get_close_matches(name, known, n=2)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        return (
            f"rollout.backend = {name!r} is not a registered backend{hint}; registered: {', '.join(known)}, "
            "or give a 'pkg.module:Class' reference"
        )
    module, extra = ENGINES.get(name, (None, None))
    if module is not None and local_workers > 0 and importlib.util.find_spec(module) is None:
        return (
            f"rollout.backend = {name!r} needs {module}, which is not installed here (local workers run here): "
            f'run  pip install "echo2sdk[{extra}]"'
        )
    return None
