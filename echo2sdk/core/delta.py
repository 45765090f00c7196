"""Delta snapshots: the 16-bit words of a snapshot that changed since a base snapshot, instead of all of them.

An RL update changes few bf16 weights (a change below half a bf16 step rounds away): sending only the changed
words and their new values takes a few percent of the bytes. A delta is computed on the snapshot bytes
(core/snapshot.py: safetensors, the same header for every version of a run) word by word:

- positions: the indices of the changed words, gap-encoded (each the distance from the previous one, >= 1) in the
  narrowest unsigned integer width that holds the largest gap;
- values: the new words at those positions. They overwrite (not add, not XOR): applying a delta twice is harmless;
- the frame (a fixed header naming the word size, the gap width, the count, the snapshot size, the BLAKE3 root of
  the base and of the rebuilt snapshot; then the gaps; then the values), zstd-compressed.

`apply` rebuilds the new snapshot from its base and returns it only when its BLAKE3 root is the expected one
(the signed manifest's); a wrong base, a corrupt or truncated frame, or a tampered value raises ProtocolError.
`plan_publication` decides full snapshot (an anchor) or delta (`Anchors` keeps its count of publications since
the last anchor, for the learner and the simulator alike): an anchor every `anchor_every` publications, when
there is no base, and whenever the delta would not be smaller than the full snapshot.

numpy, blake3 and zstandard; no torch. Pure: nothing here touches the network or the disk.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import blake3
import numpy as np
import zstandard

from echo2sdk.errors import ProtocolError

__all__ = ["Delta", "encode", "apply", "snapshot_root", "plan_publication", "Anchors", "ZSTD_LEVEL"]

MAGIC = b"E2D1"
_HEAD = struct.Struct("<4sBBQQ32s32s")  # magic, word bytes, gap bytes, changed words, snapshot bytes, base root, root
ZSTD_LEVEL = 3  # zstd's default: ~0.3-0.5 GB/s on one core here; higher levels buy little on gaps and bf16 values
_GAP_BYTES = (1, 2, 4, 8)  # the widths a gap may take: the narrowest that holds the largest gap is used
_WORDS = {1: np.uint8, 2: np.uint16}


def snapshot_root(data: bytes | bytearray | memoryview) -> bytes:
    """The BLAKE3 digest of a whole snapshot's bytes (what a delta's base and result are named by)."""
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()


@dataclass(frozen=True)
class Delta:
    """An encoded delta (`payload`, zstd-compressed) and what was measured making it."""

    payload: bytes
    base_root: bytes
    root: bytes
    snapshot_bytes: int  # the size of the snapshot it rebuilds (and of its base)
    words: int  # words compared
    changed: int  # words changed
    raw_bytes: int  # the frame before zstd (header + gaps + values)
    gap_bytes: int  # the width of one gap

    @property
    def changed_fraction(self) -> float:
        return self.changed / max(self.words, 1)


def _word_bytes(size: int) -> int:
    return 2 if size % 2 == 0 else 1


def _gap_width(largest: int) -> int:
    """The narrowest gap width that holds `largest`."""
    return next(w for w in _GAP_BYTES if largest < 1 << (8 * w))


def _flat(data: object, what: str, error: type[Exception]) -> memoryview:
    """`data` as a flat view of bytes (a buffer of wider items counts its bytes); `error` names `what` otherwise."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
        if not view.c_contiguous:
            raise BufferError("not contiguous")
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError, BufferError) as exc:
        raise error(f"{what} must be a contiguous bytes-like buffer, got {type(data).__name__}: {exc}") from None


def _words(data: bytes | bytearray | memoryview, word: int) -> np.ndarray:
    return np.frombuffer(data, dtype=_WORDS[word])


def encode(base: bytes | memoryview, new: bytes | memoryview, *, base_root: bytes | None = None,
           root: bytes | None = None, level: int = ZSTD_LEVEL) -> Delta:
    """The delta that turns `base` into `new` (same size: the same run's snapshots). The roots are computed
    unless given (the learner has them from the manifests)."""
    base, new = _flat(base, "base", ValueError), _flat(new, "new", ValueError)
    if len(base) != len(new):
        raise ValueError(f"a delta needs snapshots of one size: base {len(base)}, new {len(new)} bytes "
                         "(the model's shapes or dtypes changed: publish a full snapshot)")
    word = _word_bytes(len(new))
    a, b = _words(base, word), _words(new, word)
    idx = np.flatnonzero(a != b)
    gaps = np.diff(idx, prepend=-1)  # >= 1 each: the first is its index + 1
    gap_bytes = _gap_width(int(gaps.max()) if gaps.size else 0)
    base_root = base_root or snapshot_root(base)
    root = root or snapshot_root(new)
    head = _HEAD.pack(MAGIC, word, gap_bytes, idx.size, len(new), base_root, root)
    frame = b"".join((head, gaps.astype(f"<u{gap_bytes}").tobytes(), b[idx].astype(f"<u{word}").tobytes()))
    payload = zstandard.ZstdCompressor(level=level).compress(frame)
    return Delta(payload, base_root, root, len(new), a.size, int(idx.size), len(frame), gap_bytes)


def read_header(payload: bytes | memoryview) -> tuple[int, int, int, int, bytes, bytes]:
    """(word bytes, gap bytes, changed words, snapshot bytes, base root, root) of an encoded delta, read from
    the start of its frame. Raises ProtocolError when it is not one."""
    payload = _flat(payload, "delta payload", ProtocolError)
    try:
        with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
            head = reader.read(_HEAD.size)
    except Exception as exc:  # zstandard.ZstdError on bytes that are no zstd frame
        raise ProtocolError(f"delta is not a zstd frame: {exc}") from exc
    if len(head) != _HEAD.size:
        raise ProtocolError(f"delta frame is {len(head)} bytes, shorter than its {_HEAD.size}-byte header")
    magic, word, gap, n, size, base_root, root = _HEAD.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"delta frame starts with {magic!r}, expected {MAGIC!r}")
    if word not in _WORDS or word != _word_bytes(size):
        raise ProtocolError(f"delta field 'word' = {word} does not fit a snapshot of {size} bytes")
    if gap not in _GAP_BYTES or gap > _gap_width(size // word):  # no gap exceeds the word count
        raise ProtocolError(f"delta field 'gap' = {gap} does not fit a snapshot of {size // word} words")
    if n > size // word:
        raise ProtocolError(f"delta field 'changed' = {n} exceeds the snapshot's {size // word} words")
    return word, gap, n, size, base_root, root


def apply(base: bytes | bytearray | memoryview, payload: bytes | memoryview, *, root: bytes,
          base_root: bytes | None = None) -> bytearray:
    """The snapshot `payload` rebuilds from `base`, returned only when its BLAKE3 root is `root` (the one the
    learner signed). Raises ProtocolError on a base other than the delta's (by size or root), a malformed frame,
    or a rebuilt snapshot whose root differs (a tampered or corrupt delta): nothing unverified is returned."""
    payload, base = _flat(payload, "delta payload", ProtocolError), _flat(base, "base", ProtocolError)
    word, gap, n, size, want_base, want_root = read_header(payload)
    if want_root != root:
        raise ProtocolError("delta: the frame names another result root than the signed manifest")
    if len(base) != size:
        raise ProtocolError(f"delta: base is {len(base)} bytes, the delta is for a {size}-byte snapshot")
    if (base_root or snapshot_root(base)) != want_base:
        raise ProtocolError("delta: the base is not the snapshot this delta was made from (its root differs)")
    expected = _HEAD.size + n * (gap + word)
    frame = _decompress(payload, expected, n)
    gaps = np.frombuffer(frame, dtype=f"<u{gap}", count=n, offset=_HEAD.size)
    values = np.frombuffer(frame, dtype=f"<u{word}", count=n, offset=_HEAD.size + n * gap)
    out = bytearray(base)
    _overwrite(_words(out, word), gaps, values)
    if snapshot_root(out) != root:
        raise ProtocolError("delta: the rebuilt snapshot's root is not the signed one (corrupt or tampered delta)")
    return out


def _decompress(payload: memoryview, expected: int, n: int) -> bytes:
    """The one zstd frame of `payload`, `expected` bytes long: its declared size is checked before anything is
    allocated for it, and bytes after the frame are refused."""
    try:
        declared = zstandard.frame_content_size(payload)
    except Exception as exc:  # noqa: BLE001 - zstandard.ZstdError and friends
        raise ProtocolError(f"delta: no readable zstd frame header: {exc}") from exc
    if declared != expected:
        raise ProtocolError(f"delta frame declares {declared} bytes; {n} changed words need {expected}")
    try:
        dec = zstandard.ZstdDecompressor().decompressobj()
        frame = dec.decompress(payload)
    except Exception as exc:  # noqa: BLE001
        raise ProtocolError(f"delta: the zstd frame does not decompress: {exc}") from exc
    if dec.unused_data:
        raise ProtocolError(f"delta: {len(dec.unused_data)} bytes after the zstd frame")
    if len(frame) != expected:
        raise ProtocolError(f"delta frame is {len(frame)} bytes; {n} changed words need {expected}")
    return frame


_BLOCK = 1 << 20  # positions rebuilt per block: the running sums take O(block) memory, not O(changed words)


def _overwrite(words: np.ndarray, gaps: np.ndarray, values: np.ndarray) -> None:
    """words[p_i] = values[i] with p_i = gaps[0] + ... + gaps[i] - 1, block by block; ProtocolError on a gap of 0
    or a position past the end (checked before each block is written; sums cannot wrap: every gap is at most
    the word count, and the running position is checked against it after every block)."""
    limit, at = words.size, 0
    for lo in range(0, gaps.size, _BLOCK):
        g = gaps[lo : lo + _BLOCK]
        if int(g.min()) < 1:
            raise ProtocolError("delta: a position gap of 0 (positions must increase)")
        if int(g.max()) > limit:
            raise ProtocolError(f"delta: a position gap past the snapshot's {limit} words")
        pos = np.cumsum(g, dtype=np.int64)  # <= _BLOCK * limit + at: far below 2**63 for any snapshot size
        pos += at - 1
        if int(pos[-1]) >= limit:
            raise ProtocolError(f"delta: position {int(pos[-1])} is past the snapshot's {limit} words")
        words[pos] = values[lo : lo + _BLOCK]
        at = int(pos[-1]) + 1


def plan_publication(since_anchor: int, anchor_every: int, has_base: bool, delta_bytes: int | None,
                     full_bytes: int) -> str:
    """'full' or 'delta' for the next publication. `since_anchor`: publications since the last full one (0 right
    after it); `anchor_every`: a full snapshot every this many publications (0: only the first and when needed);
    `delta_bytes`: the encoded delta's size (None when none could be made)."""
    if not has_base or delta_bytes is None or delta_bytes >= full_bytes:
        return "full"
    if anchor_every > 0 and since_anchor + 1 >= anchor_every:
        return "full"
    return "delta"


class Anchors:
    """plan_publication with its count: `next` decides the next publication and counts it."""

    def __init__(self, anchor_every: int):
        self.anchor_every, self.since_anchor = anchor_every, 0

    def next(self, has_base: bool, delta_bytes: int | float | None, full_bytes: int | float) -> str:
        kind = plan_publication(self.since_anchor, self.anchor_every, has_base, delta_bytes, full_bytes)
        self.since_anchor = 0 if kind == "full" else self.since_anchor + 1
        return kind
