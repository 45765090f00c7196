"""Delta snapshots (core/delta.py): exact rebuilds, the narrowest gap width, and nothing unverified returned."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2sdk.core import delta
from echo2sdk.errors import ProtocolError


def _pair(size_words: int, positions: list[int], seed: int = 0) -> tuple[bytes, bytes]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 1 << 16, size_words, dtype=np.uint16)
    new = base.copy()
    for p in positions:
        new[p] ^= 1 + int(rng.integers(0, 0xFFFE))  # a different word
    return base.tobytes(), new.tobytes()


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 5000), data=st.data())
def test_a_delta_rebuilds_exactly_the_new_snapshot(size, data):
    positions = data.draw(st.lists(st.integers(0, size - 1), unique=True, max_size=min(size, 300)))
    base, new = _pair(size, positions, seed=size)
    d = delta.encode(base, new)
    assert d.changed == len(positions) and d.words == size and d.snapshot_bytes == 2 * size
    assert delta.apply(base, d.payload, root=d.root) == new
    assert d.root == delta.snapshot_root(new) and d.base_root == delta.snapshot_root(base)


def test_odd_sized_snapshots_compare_bytes():
    base, new = b"abcde", b"abXde"
    d = delta.encode(base, new)
    assert (d.words, d.changed) == (5, 1) and delta.apply(base, d.payload, root=d.root) == new


@pytest.mark.parametrize(("spacing", "width"), [(1, 1), (255, 1), (256, 2), (65535, 2), (65536, 4)])
def test_gaps_take_the_narrowest_width_that_holds_the_largest(spacing, width):
    base, new = _pair(3 * spacing + 1, [spacing - 1, 2 * spacing - 1, 3 * spacing - 1])
    d = delta.encode(base, new)
    assert d.gap_bytes == width and d.changed == 3
    assert d.raw_bytes == delta._HEAD.size + 3 * (width + 2)
    assert delta.apply(base, d.payload, root=d.root) == new


def test_no_change_is_an_empty_delta_and_a_full_change_is_sent_as_an_anchor():
    base, _ = _pair(1000, [])
    same = delta.encode(base, base)
    assert same.changed == 0 and delta.apply(base, same.payload, root=same.root) == base
    rng = np.random.default_rng(1)
    base, new = rng.bytes(20000), rng.bytes(20000)  # every word differs: incompressible positions and values
    every = delta.encode(base, new)
    assert every.changed_fraction > 0.99 and len(every.payload) > len(new)
    assert delta.plan_publication(1, 10, True, len(every.payload), len(new)) == "full"


def test_plan_publication_sends_an_anchor_first_every_k_and_when_a_delta_is_no_smaller():
    plan = delta.plan_publication
    assert plan(0, 10, has_base=False, delta_bytes=None, full_bytes=100) == "full"
    assert plan(0, 10, True, 5, 100) == "delta"
    assert plan(8, 10, True, 5, 100) == "delta" and plan(9, 10, True, 5, 100) == "full"  # the 10th after an anchor
    assert plan(500, 0, True, 5, 100) == "delta"  # anchor_every = 0: anchors only when needed
    assert plan(1, 10, True, 100, 100) == "full" and plan(1, 10, True, None, 100) == "full"


def test_snapshots_of_different_sizes_have_no_delta():
    with pytest.raises(ValueError, match="base 4, new 6 bytes"):
        delta.encode(b"abcd", b"abcdef")


# -- nothing unverified is returned ----------------------------------------------------------------------
@pytest.fixture
def made() -> tuple[bytes, bytes, delta.Delta]:
    base, new = _pair(4096, list(range(0, 4096, 37)))
    return base, new, delta.encode(base, new)


def test_a_wrong_base_is_refused(made):
    base, new, d = made
    other = bytearray(base)
    other[10] ^= 1
    with pytest.raises(ProtocolError, match="not the snapshot this delta was made from"):
        delta.apply(bytes(other), d.payload, root=d.root)
    with pytest.raises(ProtocolError, match="base is 8190 bytes"):
        delta.apply(base[:-2], d.payload, root=d.root)


def test_a_result_root_other_than_the_signed_one_is_refused(made):
    base, _, d = made
    with pytest.raises(ProtocolError, match="another result root"):
        delta.apply(base, d.payload, root=b"\0" * 32)


def _reframe(d: delta.Delta, edit) -> bytes:
    frame = bytearray(zstandard.ZstdDecompressor().decompress(d.payload))
    edit(frame)
    return zstandard.ZstdCompressor().compress(bytes(frame))


def test_a_tampered_value_or_position_never_comes_back(made):
    base, _, d = made
    n = d.changed
    value_at = delta._HEAD.size + n * d.gap_bytes
    for edit, why in [
        (lambda f: f.__setitem__(value_at, f[value_at] ^ 0xFF), "rebuilt snapshot's root"),  # a value
        (lambda f: f.__setitem__(delta._HEAD.size + 3, f[delta._HEAD.size + 3] + 1), "rebuilt snapshot's root"),
        (lambda f: f.__setitem__(delta._HEAD.size, 0), "gap of 0"),
        (lambda f: f.__setitem__(slice(0, 4), b"XXXX"), "expected b'E2D1'"),
        (lambda f: f.__setitem__(slice(-1, None), b""), "need"),  # truncated
    ]:
        with pytest.raises(ProtocolError, match=why):
            delta.apply(base, _reframe(d, edit), root=d.root)


def test_garbage_and_a_lying_frame_size_are_refused(made):
    base, _, d = made
    with pytest.raises(ProtocolError, match="not a zstd frame"):
        delta.apply(base, b"not zstd at all, not at all", root=d.root)
    flipped = bytearray(d.payload)
    flipped[len(flipped) // 2] ^= 0x55
    with pytest.raises(ProtocolError):
        delta.apply(base, bytes(flipped), root=d.root)
    head = zstandard.ZstdDecompressor().decompress(d.payload)[: delta._HEAD.size]
    bomb = zstandard.ZstdCompressor().compress(head + b"\0" * (1 << 20))  # declares 1 MiB more than its count needs
    with pytest.raises(ProtocolError, match="declares"):
        delta.apply(base, bomb, root=d.root)


def test_a_real_update_of_a_model_gives_a_small_delta_that_loads():
    torch = pytest.importorskip("torch")
    from echo2sdk.core.snapshot import load_snapshot, snapshot_bytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
    before = snapshot_bytes(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)  # Adam's first step moves every weight by ~lr
    model(torch.randn(8, 256)).square().mean().backward()
    opt.step()
    after = snapshot_bytes(model)
    d = delta.encode(before, after)
    assert 0 < d.changed_fraction < 0.5  # most bf16 weights round back to where they were
    assert len(d.payload) < len(after) / 2
    rebuilt = delta.apply(before, d.payload, root=d.root)
    got, want = load_snapshot(rebuilt), load_snapshot(after)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def _frame(word: int, gap: int, size: int, base_root: bytes, root: bytes, gaps: list[int], values: list[int]) -> bytes:
    head = delta._HEAD.pack(delta.MAGIC, word, gap, len(gaps), size, base_root, root)
    return zstandard.ZstdCompressor().compress(
        head + np.array(gaps, dtype=f"<u{gap}").tobytes() + np.array(values, dtype=f"<u{word}").tobytes())


def test_gaps_that_would_wrap_or_are_wider_than_the_snapshot_needs_are_refused(made):
    base, _, d = made
    words = len(base) // 2
    # sums that wrap in 64 bits used to turn into negative or huge indices (IndexError, or a write from the end)
    wrap = _frame(2, 8, len(base), d.base_root, d.root, [2**63, 2**63 + 1], [1, 2])
    with pytest.raises(ProtocolError, match="'gap' = 8"):  # 8-byte gaps for a 4096-word snapshot
        delta.apply(base, wrap, root=d.root)
    past = _frame(2, 2, len(base), d.base_root, d.root, [1, words + 5], [1, 2])
    with pytest.raises(ProtocolError, match="gap past the snapshot"):
        delta.apply(base, past, root=d.root)
    end = _frame(2, 2, len(base), d.base_root, d.root, [words - 1, 2], [1, 2])
    with pytest.raises(ProtocolError, match="past the snapshot's 4096 words"):
        delta.apply(base, end, root=d.root)


def test_bytes_after_the_frame_are_refused(made):
    base, _, d = made
    for extra in (b"junk", d.payload):
        with pytest.raises(ProtocolError, match="after the zstd frame"):
            delta.apply(base, d.payload + extra, root=d.root)


def test_buffers_of_wider_items_count_their_bytes(made):
    base, new, d = made
    as_u16 = np.frombuffer(base, dtype=np.uint16)
    assert delta.apply(as_u16, memoryview(d.payload), root=d.root) == new
    assert delta.encode(memoryview(base).cast("H"), np.frombuffer(new, dtype=np.uint16)).payload == d.payload
    with pytest.raises(ProtocolError, match="contiguous"):
        delta.apply(memoryview(base)[::2], d.payload, root=d.root)
    with pytest.raises(ProtocolError, match="delta payload"):
        delta.apply(base, "a string", root=d.root)


def test_positions_are_rebuilt_across_blocks(monkeypatch):
    monkeypatch.setattr(delta, "_BLOCK", 7)  # many blocks: the running position carries over each boundary
    base, new = _pair(2000, list(range(3, 2000, 11)))
    d = delta.encode(base, new)
    assert delta.apply(base, d.payload, root=d.root) == new
