"""Runs the vllm backend in a process of its own and writes what test_vllm.py checks (JSON + snapshot files).

vLLM changes its process for good (it pins OpenMP threads, patches torch.set_num_threads, binds memory
to a NUMA node), so the tests never start an engine inside pytest's own process.

    python tests/backends/vllm_probe.py MODEL_DIR OUT_DIR [UNSUPPORTED_MODEL_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    folder, out = sys.argv[1], Path(sys.argv[2])
    import safetensors.torch
    import torch

    from echo2sdk.backends.vllm import VLLMBackend
    from echo2sdk.core.contracts import SamplingParams
    from echo2sdk.core.snapshot import snapshot_bytes
    from echo2sdk.errors import Echo2Error
    from echo2sdk.testing import check_backend

    report: dict = {}
    results = check_backend(
        "vllm",
        folder,
        options={"dtype": "float32", "threads": 1},
        logprob_tolerance=1e-3,  # fp32 engine against fp32 transformers
        raise_on_failure=False,
        report=lambda r: print("check", json.dumps(r.to_json()), flush=True),
    )
    report["checks"] = [r.to_json() for r in results]

    be = VLLMBackend(folder, dtype="float32", threads=1)
    prompts = [
        be.encode_chat([{"role": "user", "content": "hi"}]),
        be.encode_chat([{"role": "user", "content": "What is the sum of seventeen and twenty-five, in words?"}]),
        [5, 6, 7],
    ] * 4
    report["prompts"] = prompts

    def dump(samples) -> list:
        return [{"ids": list(s.token_ids), "logprobs": list(s.logprobs), "text": s.text, "reason": s.finish_reason} for s in samples]

    # Weights under which the model says end-of-sequence often: both finish reasons appear.
    base = safetensors.torch.load_file(str(Path(folder) / "model.safetensors"))
    eos_state = {k: v.clone() for k, v in base.items()}
    emb = eos_state["model.embed_tokens.weight"]
    direction = torch.zeros(emb.shape[1])
    direction[0] = 1.0
    emb += direction
    emb[be.eos_token_id] = 1.95 * direction
    eos_bytes = snapshot_bytes(eos_state, dtype="float32")
    (out / "eos.safetensors").write_bytes(eos_bytes)
    be.install(1, eos_bytes)
    report["eos"] = dump(be.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.8, seed=0)))
    report["eos_top_p"] = dump(be.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.5, seed=0)))

    # The tied output head: installing new embeddings without re-packing it (what vLLM's reload alone does on
    # CPU) leaves stale logits; the backend re-packs it.
    gen = torch.Generator().manual_seed(1)
    moved = {k: (v + 0.05 * torch.randn(v.shape, generator=gen)) if v.dim() == 2 else v for k, v in base.items()}
    moved_bytes = snapshot_bytes(moved, dtype="float32")
    (out / "moved.safetensors").write_bytes(moved_bytes)
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=5)
    tensors = list(safetensors.torch.load(moved_bytes).items())
    be._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors, "is_checkpoint_format": True})
    be._llm.reset_prefix_cache()  # vLLM's own reload, without the re-pack
    report["moved_without_repack"] = dump(be.generate(prompts[:3], params))
    be.install(3, moved_bytes)
    report["moved"] = dump(be.generate(prompts[:3], params))

    # More prompt tokens than one engine step takes (8192): a seeded batch must not hit vLLM CPU's
    # partial-prefill generator rewind ("CPU Generator does not use offset").
    big = be.generate([[5 + i % 7] * 100 for i in range(128)], SamplingParams(max_new_tokens=2, seed=3))
    report["big_batch"] = len(big)
    try:
        be.generate([[1] * 1020], SamplingParams(max_new_tokens=8))
    except Echo2Error as exc:
        report["too_long"] = f"{type(exc).__name__}: {exc}"
    be.close()
    if len(sys.argv) > 3:  # a model whose head size the CPU attention kernels do not take: refused at start
        try:
            VLLMBackend(sys.argv[3], dtype="float32", threads=1).close()
            report["unsupported"] = "started"
        except Echo2Error as exc:
            report["unsupported"] = f"{type(exc).__name__}: {exc}"
    (out / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
