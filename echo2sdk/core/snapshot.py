"""Policy snapshots as safetensors bytes: what the learner publishes and a backend installs.

A snapshot is the model's state dict with shared (tied) tensors stored once under their first
name (for a Llama with tied embeddings: ``model.embed_tokens.weight`` is kept and
``lm_head.weight`` is left out), cast to one floating dtype. The bytes load as they are with
``safetensors.torch.load`` and by transformers, vLLM and SGLang. No pickle anywhere.

torch and safetensors are imported inside the functions; importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from echo2sdk.errors import DependencyNotInstalled, ProtocolError

__all__ = ["snapshot_bytes", "load_snapshot"]

_DTYPES = ("float32", "bfloat16", "float16")


def _import():
    try:
        import safetensors.torch
        import torch
    except ImportError as exc:
        raise DependencyNotInstalled(exc.name or "safetensors", "hf") from exc
    return torch, safetensors.torch


def snapshot_state(model: Any, dtype: str = "bfloat16") -> dict[str, Any]:
    """A private copy of `model`'s weights (a torch Module, or a state dict), ready to serialize.

    Tensors that share memory (tied weights) are kept once, under the first name in state-dict order;
    floating tensors are cast to `dtype` ("bfloat16", "float16" or "float32"), others kept. Every tensor
    is copied, so the learner may keep updating the model while the copy is serialized elsewhere.
    """
    torch, _ = _import()
    if dtype not in _DTYPES:
        raise ValueError(f"snapshot dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    target = getattr(torch, dtype)
    state = model.state_dict() if hasattr(model, "state_dict") else model
    if not isinstance(state, Mapping):
        raise TypeError(f"snapshot_bytes needs a torch Module or a state dict, got {type(model).__name__}")
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...], Any]] = set()
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if tensor.numel() and key in seen:  # a tied alias of a tensor already kept
            continue
        seen.add(key)
        t = tensor.detach()
        out[name] = t.to(device="cpu", dtype=target if t.is_floating_point() else t.dtype, copy=True).contiguous()
    return out


def serialize_state(state: dict[str, Any]) -> bytes:
    """safetensors bytes of a state made by snapshot_state (no further copy or cast)."""
    _, st = _import()
    return st.save(state, metadata={"format": "pt"})


def snapshot_bytes(model: Any, dtype: str = "bfloat16") -> bytes:
    """Serialize `model` (a torch Module, or a state dict) to safetensors bytes (see snapshot_state)."""
    return serialize_state(snapshot_state(model, dtype))


def load_snapshot(weights: bytes) -> dict[str, Any]:
    """Parse safetensors bytes into a {name: tensor} dict (CPU). Malformed bytes raise ProtocolError."""
    _, st = _import()
    if not isinstance(weights, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"a snapshot must be safetensors bytes, got {type(weights).__name__}")
    try:
        return dict(st.load(bytes(weights)))
    except Exception as exc:  # safetensors raises its own SafetensorError, or ValueError/OSError
        raise ProtocolError(f"snapshot is not valid safetensors ({len(weights)} bytes): {exc}") from exc
