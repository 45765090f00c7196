"""`MockBackend`: a torch-free inference backend that speaks the InferenceBackend Protocol, so the
coordinator/worker path can be tested without a model (registered as the `mock` backend), and
`safetensors_blob`, a valid snapshot for it built without torch."""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Sequence

from echo2sdk.core.contracts import Sample, SamplingParams
from echo2sdk.errors import BackendError

__all__ = ["MockBackend", "safetensors_blob"]


class MockBackend:
    """Byte-level "model": prompts are UTF-8 bytes, responses are random printable bytes drawn
    uniformly (so every log-prob is exactly -log(V)); token 0 is end-of-sequence. Snapshots must be
    well-formed safetensors files with a strictly newer version."""

    VOCAB = 256

    def __init__(self, model: str = "mock", *, answer: str | None = None, seed: int = 0, **_: object):
        self.model, self.answer, self._seed = model, answer, seed
        self._version = 0
        self.installed_keys: list[str] = []

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self.VOCAB

    @property
    def eos_token_id(self) -> int:
        return 0

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [b or 1 for b in text.encode()]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Sample]:
        rng = random.Random(params.seed if params.seed is not None else self._seed + self._version)
        lp = -math.log(self.VOCAB)
        out = []
        for _ in prompts:
            text = self.answer if self.answer is not None else "".join(chr(rng.randint(97, 122)) for _ in range(8))
            ids = list(text.encode())[: params.max_new_tokens - 1] + [0]
            out.append(Sample(tuple(ids), tuple([lp] * len(ids)), bytes(ids[:-1]).decode(), "stop"))
        return out

    def install(self, version: int, weights: bytes) -> None:
        if version <= self._version:
            raise BackendError(f"snapshot version {version} is not newer than installed version {self._version}")
        try:
            (n,) = struct.unpack("<Q", weights[:8])
            header = json.loads(bytes(weights[8 : 8 + n]))
        except (struct.error, ValueError) as e:
            raise BackendError(f"snapshot v{version} is not a safetensors file: {e}") from None
        self.installed_keys = sorted(k for k in header if k != "__metadata__")
        self._version = version

    def close(self) -> None:
        pass


def safetensors_blob(names: Sequence[str] = ("w",)) -> bytes:
    """A minimal valid safetensors file (one float32 zero per tensor), built without torch."""
    header = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * len(names))
