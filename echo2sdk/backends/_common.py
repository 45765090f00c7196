"""What every inference backend shares: argument checks, the chat-prompt encoding, per-row seeds, and
the snapshot checks that run before a single weight is touched.

Snapshot checks work on the safetensors bytes themselves (header + raw buffers, numpy only), against
the layout of the model folder's own checkpoint (the ``*.safetensors`` headers and ``config.json``),
so a backend that cannot look inside its engine (``openai``) refuses exactly what ``vllm`` refuses.
Nothing heavy is imported here.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo2sdk.core import checks
from echo2sdk.core.contracts import Sample, SamplingParams
from echo2sdk.errors import BackendError, ConfigError
from echo2sdk.weights import safetensors_header

__all__ = [
    "BackendBase",
    "check_params",
    "check_prompts",
    "encode_chat",
    "row_seeds",
    "resolve_eos",
    "Layout",
    "SnapshotHeader",
    "parse_snapshot",
    "check_snapshot",
    "finished_sample",
    "refusal",
    "check_version",
    "positive_int",
]

MAX_REPORTED = 5  # problems named in one refusal message

# safetensors dtype -> (numpy dtype of the raw words, bits that are all ones exactly for inf/NaN), None: IEEE float
_FLOAT_WORDS: dict[str, tuple[str, int | None]] = {
    "F64": ("<f8", None),
    "F32": ("<f4", None),
    "F16": ("<u2", 0x7C00),
    "BF16": ("<u2", 0x7F80),
}
_ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


# ------------------------------------------------------------------------------------- arguments


def positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """`value` as a positive int, or a ConfigError naming the option and the value."""
    if value is None and allow_none:
        return None
    return checks.integer(name, value, lo=1, error=ConfigError)


def check_params(params: SamplingParams) -> None:
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
    checks.integer("max_new_tokens", params.max_new_tokens, lo=1, error=ConfigError)
    checks.real("temperature", params.temperature, lo=0, open_lo=True, error=ConfigError)  # no greedy decoding
    checks.real("top_p", params.top_p, lo=0, hi=1, open_lo=True, error=ConfigError)
    checks.integer("top_k", params.top_k, lo=0, error=ConfigError)  # 0: off
    checks.real("min_p", params.min_p, lo=0, hi=1, error=ConfigError)  # 0: off
    if params.seed is not None:
        checks.integer("seed", params.seed, error=ConfigError)


def check_prompts(
    prompts: Sequence[Sequence[int]], vocab: int, max_positions: int | None, max_new_tokens: int
) -> list[list[int]]:
    """Token-id prompts as plain lists, or a BackendError naming the first bad prompt and why."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
        raise BackendError(f"prompts must be a sequence of token-id sequences, got {type(prompts).__name__}")
    batch: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)):
            raise BackendError(f"prompt {i} is text, not token ids (use encode_chat): {prompt!r:.80}")
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError) as exc:
            raise BackendError(f"prompt {i} is not a sequence of token ids: {prompt!r:.80}") from exc
        if not ids:
            raise BackendError(f"prompt {i} is empty; a prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise BackendError(f"prompt {i} has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if max_positions and len(ids) + max_new_tokens > max_positions:
            raise BackendError(
                f"prompt {i} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} that exceeds the "
                f"model's {max_positions} positions. Shorten the prompt or lower max_new_tokens."
            )
        batch.append(ids)
    return batch


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Prompt token ids for chat messages with the generation prompt appended (a transformers tokenizer)."""
    try:
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # jinja2 errors, missing template, malformed messages
        raise BackendError(f"chat template failed on {list(messages)!r:.200}: {exc}") from exc
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(t) for t in ids]


def row_seeds(seed: int | None, n: int) -> list[int | None]:
    """One sampling seed per row, derived from a batch seed: engines seed each request separately, and a
    GRPO group repeats one prompt n times, so equal seeds would give n equal samples. 31-bit (any engine takes it).
    No batch seed: no row seeds (None per row)."""
    if seed is None:
        return [None] * n
    out: list[int | None] = []
    for i in range(n):
        digest = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") & 0x7FFFFFFF)
    return out


def resolve_eos(folder: Any, *candidates: Any) -> int:
    """The end-of-sequence id: the first candidate that is set (tokenizer first, then the model's configs);
    a list means its first entry. Raises BackendError naming the folder when none defines one."""
    eos = next((c for c in candidates if c is not None), None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None:
        raise BackendError(f"model folder {folder!r} defines no end-of-sequence token (tokenizer or config)")
    return int(eos)


# ------------------------------------------------------------------------------------- snapshots


def check_version(version: Any, current: int) -> None:
    try:
        checks.integer("snapshot version", version, error=BackendError)
    except BackendError as exc:
        raise BackendError(f"{exc}; kept v{current}") from None
    if version < current:
        raise BackendError(f"snapshot v{version} is older than the installed v{current}; refused, kept v{current}")


def refusal(version: int, current: int, problems: list[str]) -> BackendError:
    more = f" (and {len(problems) - MAX_REPORTED} more)" if len(problems) > MAX_REPORTED else ""
    return BackendError(f"snapshot v{version} refused, kept v{current}: " + "; ".join(problems[:MAX_REPORTED]) + more)


def check_snapshot(version: Any, current: int, weights: Any, layout: Layout) -> None:
    """What an engine backend checks before it touches its weights: the version moves forward, the bytes
    are well-formed safetensors, and every tensor fits `layout`. Raises the refusal that keeps `current`."""
    check_version(version, current)
    try:
        snap = parse_snapshot(weights)
    except ValueError as exc:
        raise refusal(version, current, [str(exc)]) from exc
    problems = layout.problems(snap, weights)
    if problems:
        raise refusal(version, current, problems)


def finished_sample(
    engine: str, ids: tuple[int, ...], logprobs: tuple[float, ...], reason: Any, eos: int, tokenizer: Any
) -> Sample:
    """An engine's completion as a Sample, once its finish is one a trajectory may record: stopped on the
    end-of-sequence token (kept in `ids`, so the learner scores it) or cut at the length limit."""
    if reason == "stop" and (not ids or ids[-1] != eos):
        last = ids[-1] if ids else None
        raise BackendError(f"{engine} stopped on token {last}, not on the end-of-sequence token {eos}")
    if reason not in ("stop", "length"):
        raise BackendError(f"{engine} finished with reason {reason!r}")
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    return Sample(token_ids=ids, logprobs=logprobs, text=text, finish_reason=reason)


@dataclass(frozen=True)
class SnapshotHeader:
    """A parsed safetensors file: name -> (dtype, shape, (start, end) into the data area), and where data starts."""

    entries: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]]
    data_start: int


def parse_snapshot(weights: Any) -> SnapshotHeader:
    """Parse and bounds-check safetensors bytes; a malformed file raises ValueError saying what is wrong."""
    if not isinstance(weights, (bytes, bytearray, memoryview)):
        raise ValueError(f"a snapshot must be safetensors bytes, got {type(weights).__name__}")
    size = len(weights)
    if size < 8:
        raise ValueError(f"not valid safetensors ({size} bytes): too short for a header")
    (n,) = struct.unpack("<Q", bytes(weights[:8]))
    if n > size - 8:
        raise ValueError(f"not valid safetensors ({size} bytes): header length {n} runs past the end")
    try:
        header = json.loads(bytes(weights[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not valid safetensors ({size} bytes): header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"not valid safetensors ({size} bytes): header is not a JSON object")
    data_start, data_size = 8 + n, size - 8 - n
    entries: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = str(info["dtype"]), tuple(int(d) for d in info["shape"]), info["data_offsets"]
            start, end = int(start), int(end)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"not valid safetensors: entry {name!r} is malformed: {info!r:.120}") from None
        item = _ITEM_BYTES.get(dtype)
        if not 0 <= start <= end <= data_size or (item is not None and end - start != item * math.prod(shape)):
            raise ValueError(f"not valid safetensors: entry {name!r} has data offsets {[start, end]} that do not fit")
        entries[name] = (dtype, shape, (start, end))
    return SnapshotHeader(entries, data_start)


@dataclass(frozen=True)
class Layout:
    """The tensors a snapshot must provide: the model folder's checkpoint names and shapes. `aliases` maps
    tied names a snapshot may add (lm_head.weight when the embeddings are tied) to the tensor they repeat."""

    shapes: dict[str, tuple[int, ...]]
    aliases: dict[str, str]

    @classmethod
    def from_folder(cls, folder: str | Path) -> Layout:
        folder = Path(folder)
        files = sorted(folder.glob("*.safetensors"))
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                listed = set(json.loads(index.read_text())["weight_map"].values())
            except (ValueError, KeyError, TypeError) as exc:
                raise BackendError(f"{index} is not a safetensors index: {exc}") from exc
            files = [folder / f for f in sorted(listed)]
        if not files:
            raise BackendError(
                f"model folder {str(folder)!r} has no *.safetensors checkpoint; snapshots are checked against it "
                "(convert the weights to safetensors, e.g. with save_pretrained)"
            )
        shapes: dict[str, tuple[int, ...]] = {}
        for path in files:
            header, _ = safetensors_header(path)
            for name, info in header.items():
                if name != "__metadata__":
                    shapes[name] = tuple(int(d) for d in info["shape"])
        aliases: dict[str, str] = {}
        config = read_config(folder)
        if config.get("tie_word_embeddings") and "lm_head.weight" not in shapes:
            embed = next((k for k in shapes if k.endswith("embed_tokens.weight")), None)
            if embed is not None:
                aliases["lm_head.weight"] = embed
        return cls(shapes, aliases)

    def problems(self, snap: SnapshotHeader, weights: Any) -> list[str]:
        """Everything wrong with a parsed snapshot: unknown, missing, misshapen, non-floating or non-finite
        tensors, and tied copies that differ. Empty when the snapshot may be installed."""
        problems: list[str] = []
        for name, (dtype, shape, _) in snap.entries.items():
            expected = self.shapes.get(name)
            if expected is None and name in self.aliases:
                expected = self.shapes[self.aliases[name]]
            if expected is None:
                problems.append(f"unknown key {name!r}")
            elif shape != expected:
                problems.append(f"key {name!r} has shape {shape}, expected {expected}")
            elif dtype not in _FLOAT_WORDS:
                problems.append(f"key {name!r} has dtype {dtype}, expected a floating dtype (F32, BF16, F16)")
        missing = [name for name in self.shapes if name not in snap.entries]
        if missing:
            shown = ", ".join(map(repr, missing[:MAX_REPORTED])) + (" ..." if len(missing) > MAX_REPORTED else "")
            problems.append(f"{len(missing)} missing keys: {shown}")
        if problems:
            return problems
        view = memoryview(weights)[snap.data_start :]
        for name in _nonfinite(snap, view):
            problems.append(f"key {name!r} has non-finite values (NaN or inf)")
        for alias, canonical in self.aliases.items():
            if alias in snap.entries:
                (da, _, (a0, a1)), (dc, _, (c0, c1)) = snap.entries[alias], snap.entries[canonical]
                if da != dc or view[a0:a1] != view[c0:c1]:
                    problems.append(f"tied keys {canonical!r} and {alias!r} hold different values")
        return problems


def _nonfinite(snap: SnapshotHeader, data: memoryview) -> list[str]:
    import numpy as np

    bad = []
    for name, (dtype, _, (start, end)) in snap.entries.items():
        words, mask = _FLOAT_WORDS[dtype]
        arr = np.frombuffer(data[start:end], dtype=words)
        if mask is None:
            ok = bool(np.isfinite(arr).all())
        else:  # half floats: inf/NaN are exactly the words whose magnitude bits reach all-ones exponent
            ok = arr.size == 0 or int((arr & 0x7FFF).max()) < mask
        if not ok:
            bad.append(name)
    return bad


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot read the model config {str(path)!r}: {exc}") from exc
    if not isinstance(config, dict):
        raise BackendError(f"{str(path)!r} is not a JSON object")
    return config


# ------------------------------------------------------------------------------------- the base


class BackendBase:
    """The bookkeeping every backend shares: the installed version, the vocabulary and end-of-sequence
    ids, chat encoding with the model's own template, the closed / broken state, and a repr. A subclass
    sets ``_tokenizer``, ``_vocab``, ``_eos`` (and ``_folder``, ``_dtype``) in its ``__init__``."""

    _name = "backend"  # in error messages: "<name> backend for <where> is closed"
    _version = 0
    _closed = False
    _broken: str | None = None  # why the engine's weights are undefined after a failed update
    _tokenizer: Any
    _vocab: int
    _eos: int
    _folder: str
    _dtype: str

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def eos_token_id(self) -> int:
        return self._eos

    def _where(self) -> str:
        return repr(self._folder)

    def _describe(self) -> str:
        return f"model={self._folder!r}, dtype={self._dtype!r}"

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"v{self._version}"
        return f"{type(self).__name__}({self._describe()}, {state})"

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        self._check_open()
        return encode_chat(self._tokenizer, messages)

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError(f"{self._name} backend for {self._where()} is closed")
        if self._broken:
            raise BackendError(self._broken)
