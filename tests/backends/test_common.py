"""The snapshot checks every engine backend shares (echo2sdk.backends._common): safetensors parsing and
bounds, the layout check against a model folder, non-finite detection per dtype, per-row seeds."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from echo2sdk.backends._common import Layout, check_version, parse_snapshot, row_seeds
from echo2sdk.errors import BackendError


def _safetensors(tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> bytes:
    header, data, offset = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _folder(tmp_path: Path, shapes: dict[str, tuple[int, ...]], tied: bool = False) -> Path:
    tensors = {n: ("F32", s, np.zeros(s, dtype="<f4").tobytes()) for n, s in shapes.items()}
    (tmp_path / "model.safetensors").write_bytes(_safetensors(tensors))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied, "vocab_size": 4}))
    return tmp_path


SHAPES = {"model.embed_tokens.weight": (4, 2), "model.norm.weight": (2,)}


def _f32(shape, values=None) -> tuple[str, tuple[int, ...], bytes]:
    arr = np.zeros(shape, dtype="<f4") if values is None else np.asarray(values, dtype="<f4").reshape(shape)
    return ("F32", tuple(shape), arr.tobytes())


def test_a_good_snapshot_has_no_problems(tmp_path: Path) -> None:
    layout = Layout.from_folder(_folder(tmp_path, SHAPES))
    data = _safetensors({"model.embed_tokens.weight": _f32((4, 2)), "model.norm.weight": _f32((2,))})
    assert layout.problems(parse_snapshot(data), data) == []


@pytest.mark.parametrize(
    "data, needle",
    [
        (b"", "too short"),
        (struct.pack("<Q", 1000) + b"{}", "runs past the end"),
        (struct.pack("<Q", 4) + b"nope", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (_safetensors({"w": ("F32", (3,), b"\0" * 8)}), "do not fit"),
        ("text", "safetensors bytes"),
    ],
)
def test_malformed_files_are_named(data, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_snapshot(data)


def test_layout_problems_name_the_key(tmp_path: Path) -> None:
    layout = Layout.from_folder(_folder(tmp_path, SHAPES, tied=True))
    bf16_inf = np.array([0x7F80, 0, 0, 0, 0, 0, 0, 0], dtype="<u2").tobytes()  # +inf in bfloat16
    f16_nan = np.array([0x7E00, 0], dtype="<u2").tobytes()  # NaN in float16
    cases = {
        "unknown": ({"x": _f32((1,))}, "unknown key 'x'"),
        "shape": ({"model.norm.weight": _f32((3,))}, "has shape (3,), expected (2,)"),
        "dtype": ({"model.norm.weight": ("I32", (2,), b"\0" * 8)}, "dtype I32, expected a floating dtype"),
        "missing": ({"model.norm.weight": _f32((2,))}, "1 missing keys: 'model.embed_tokens.weight'"),
        "bf16 inf": ({"model.embed_tokens.weight": ("BF16", (4, 2), bf16_inf)}, "'model.embed_tokens.weight' has non-finite"),
        "f16 nan": ({"model.norm.weight": ("F16", (2,), f16_nan)}, "'model.norm.weight' has non-finite"),
        "f32 nan": ({"model.norm.weight": _f32((2,), [0.0, float("nan")])}, "'model.norm.weight' has non-finite"),
        "tied differ": ({"lm_head.weight": _f32((4, 2), [1.0] * 8)}, "tied keys 'model.embed_tokens.weight' and 'lm_head.weight'"),
    }
    full = {"model.embed_tokens.weight": _f32((4, 2)), "model.norm.weight": _f32((2,))}
    for case, (edit, needle) in cases.items():
        tensors = dict(full) if case != "missing" else {}
        tensors.update(edit)
        data = _safetensors(tensors)
        problems = layout.problems(parse_snapshot(data), data)
        assert any(needle in p for p in problems), (case, problems)
    same = _safetensors({**full, "lm_head.weight": _f32((4, 2))})  # a tied copy that is equal is fine
    assert layout.problems(parse_snapshot(same), same) == []


def test_a_folder_without_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BackendError, match="no \\*.safetensors checkpoint"):
        Layout.from_folder(tmp_path)


def test_versions() -> None:
    check_version(3, 3)
    with pytest.raises(BackendError, match="older than the installed v3"):
        check_version(2, 3)
    with pytest.raises(BackendError, match="snapshot version must be an integer, got snapshot version=True; kept v0"):
        check_version(True, 0)


def test_row_seeds_are_distinct_reproducible_and_31_bit() -> None:
    seeds = row_seeds(1 << 50, 256)
    assert len(set(seeds)) == 256 and seeds == row_seeds(1 << 50, 256)
    assert all(0 <= s < 2**31 for s in seeds)
    assert row_seeds(1, 4) != row_seeds(2, 4)
