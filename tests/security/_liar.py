"""A lying rollout worker, for tests/security/test_lying_worker.py and bench/lying_worker.py (never shipped).

    python tests/security/_liar.py --connect HOST:PORT --id liar [--model M] LIE

with the token in $ECHO2_TOKEN and one LIE:

- ``--fabricate X``: every sampler log-prob it reports is X (the responses are real);
- ``--keep-model``: serves the weights of --model throughout; a snapshot only bumps the version it reports
  (a different model's responses, labelled with the learner's current version);
- ``--claim-newest``: installs nothing, reports no install, and labels its records with the newest version
  it has heard of (a version it never installed).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from echo2sdk.runtime.worker.process import RolloutWorker


def peaked_model(folder: Path) -> Path:
    """A tiny Llama of tiny-random's shape and tokenizer whose logits are far from uniform (initializer_range
    0.5, seed 1): tiny-random's are near uniform, so any other near-uniform model's responses would be as
    likely under the learner's policy. Saved to `folder`, which is returned."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from echo2sdk.weights import resolve_model

    tiny = resolve_model("tiny-random")
    config = AutoConfig.from_pretrained(tiny)
    config.initializer_range = 0.5
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    return folder


class FabricatedLogprobs:
    """Wraps a backend: the same samples, every log-prob replaced by `value`."""

    def __init__(self, backend: Any, value: float):
        self._backend, self._value = backend, value

    def generate(self, prompts, params):
        return [replace(s, logprobs=(self._value,) * len(s.token_ids)) for s in self._backend.generate(prompts, params)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class KeepModel:
    """Wraps a backend: `install` takes the version number and leaves the weights as they are."""

    def __init__(self, backend: Any):
        self._backend, self.version = backend, backend.version

    def install(self, version: int, weights: bytes) -> None:
        self.version = version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


class LyingWorker(RolloutWorker):
    def __init__(self, *args: Any, fabricate: float | None, keep_model: bool, claim_newest: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fabricate, self.keep_model, self.claim_newest = fabricate, keep_model, claim_newest

    def _setup(self, cfg: Any) -> None:
        super()._setup(cfg)
        if self.fabricate is not None:
            self.backend = FabricatedLogprobs(self.backend, self.fabricate)
        if self.keep_model:
            self.backend = KeepModel(self.backend)

    async def install_pending(self) -> None:
        if self.claim_newest:
            self.inbox.pending = None  # nothing installed, nothing reported
            return
        await super().install_pending()

    def rollout(self, tasks, n, params):
        groups = super().rollout(tasks, n, params)
        if self.claim_newest:
            groups = [[{**t, "version": self.inbox.newest} for t in g] for g in groups]
        return groups


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--connect", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--model")
    p.add_argument("--fabricate", type=float)
    p.add_argument("--keep-model", action="store_true")
    p.add_argument("--claim-newest", action="store_true")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    worker = LyingWorker(a.connect, os.environ["ECHO2_TOKEN"], worker_id=a.id, model=a.model, reconnect_s=10,
                         fabricate=a.fabricate, keep_model=a.keep_model, claim_newest=a.claim_newest)
    import asyncio

    from echo2sdk.errors import ProtocolError

    try:
        return asyncio.run(worker.run())
    except ProtocolError as e:  # refused: quarantined
        print(f"liar: {e}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
