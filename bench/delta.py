"""Delta snapshots on real updates: how many bf16 words one publication of the main job changes, and the bytes a
delta (core/delta.py) sends instead of the full snapshot.

For each learning rate, the main job (examples/math_smollm2.toml: SmolLM2-135M, 2 local workers, R = 16,
updates_per_step 2, S = 3 so kappa = 2) runs `--steps` steps; every snapshot the learner publishes is kept as the
exact bytes handed to the coordinator, with the version-0 weights the workers start from. Then, per publication:
the changed fraction against the previous one, the bytes of the full snapshot, of the same snapshot zstd-compressed
(the baseline: compression alone), of the delta frame and of the delta zstd-compressed, the encode time and the
apply time (verified rebuild). For a worker `--behind` publications back: one delta straight from its version, and
the chain of deltas it would otherwise apply, with their bytes.

    .venv/bin/python bench/delta.py [--lrs 1e-6,3e-6,1e-5] [--steps 10] [--behind 2,4] [--out runs/bench-delta]
                                    [--save runs/bench-delta/update]   # the last update, for bench/broadcast.py

One JSON line per publication (`"kind": "publication"`) and per worker behind (`"kind": "behind"`), then a summary
line per learning rate (medians). Parameters on every line. Encode/apply run here after training (one core busy),
as they would on the learner's publisher thread and the worker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _publications(lr: float, steps: int, out: Path, sets: list[str]) -> tuple[dict, list[tuple[int, bytes]]]:
    """The run's parameters, and (version, snapshot bytes) of version 0 and of every publication of a real run of
    the main job at `lr`."""
    from echo2sdk.config import load_config
    from echo2sdk.core.snapshot import serialize_state
    from echo2sdk.runtime.learner.recipe import Trainer

    cfg = load_config(ROOT / "examples" / "math_smollm2.toml", [
        f"learner.lr={lr}", f"learner.steps={steps}", f'run.out="{out}"', "run.progress=false", *sets])
    tr = Trainer(cfg)
    kept: list[tuple[int, bytes]] = []
    try:
        tr.setup()
        kept.append((0, serialize_state(tr.ops.snapshot_state(cfg.learner.snapshot_dtype))))
        publish = tr.coordinator.publish

        def keep(version: int, weights: bytes) -> None:  # observe what the learner publishes, then publish it
            kept.append((version, bytes(weights)))
            publish(version, weights)

        tr.coordinator.publish = keep  # type: ignore[method-assign]
        tr.run()
    finally:
        tr.close()
    params = {"model": cfg.model.policy, "updates_per_step": cfg.learner.updates_per_step, "kappa": cfg.kappa,
              "R": cfg.learner.trajectories_per_step, "snapshot_dtype": cfg.learner.snapshot_dtype}
    return params, sorted(kept)


def _measure(base: bytes, new: bytes) -> dict:
    from echo2sdk.core import delta

    t0 = time.perf_counter()
    d = delta.encode(base, new)
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    rebuilt = delta.apply(base, d.payload, root=d.root)
    t_apply = time.perf_counter() - t0
    assert rebuilt == new, "the rebuilt snapshot differs"  # apply verified the root; this re-checks every byte
    return {"changed_fraction": round(d.changed_fraction, 6), "delta_bytes": d.raw_bytes,
            "delta_zstd_bytes": len(d.payload), "gap_bytes": d.gap_bytes, "encode_s": round(t_enc, 3),
            "apply_s": round(t_apply, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lrs", default="1e-6,3e-6,1e-5")
    ap.add_argument("--steps", type=int, default=10, help="learner steps per run (kappa = 2: a publication every 2)")
    ap.add_argument("--behind", default="2,4", help="publications a late worker missed")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-delta")
    ap.add_argument("--set", action="append", default=[], dest="sets", help="more config overrides (KEY=VALUE)")
    ap.add_argument("--save", type=Path, default=None,
                    help="write the last two publications of the first lr there (base.bin, new.bin): the real "
                    "update bench/broadcast.py --snapshots broadcasts full and as a delta")
    args = ap.parse_args()
    import zstandard

    from echo2sdk.core import delta

    behind = [int(b) for b in args.behind.split(",") if b]
    for lr in [float(x) for x in args.lrs.split(",")]:
        run, pubs = _publications(lr, args.steps, args.out / f"lr{lr:g}", args.sets)
        params = {"lr": lr, "steps": args.steps, **run, "zstd_level": delta.ZSTD_LEVEL, "overrides": args.sets}
        if args.save is not None and len(pubs) >= 2:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / "base.bin").write_bytes(pubs[-2][1])
            (args.save / "new.bin").write_bytes(pubs[-1][1])
            (args.save / "params.json").write_text(json.dumps({**params, "base_version": pubs[-2][0],
                                                               "version": pubs[-1][0]}))
            args.save = None
        rows = []
        for (v0, a), (v1, b) in zip(pubs, pubs[1:]):
            t0 = time.perf_counter()
            full_zstd = len(zstandard.ZstdCompressor(level=delta.ZSTD_LEVEL).compress(b))
            row = {"kind": "publication", **params, "base_version": v0, "version": v1, "full_bytes": len(b),
                   "full_zstd_bytes": full_zstd, "full_zstd_s": round(time.perf_counter() - t0, 3), **_measure(a, b)}
            row["delta_zstd_over_full"] = round(row["delta_zstd_bytes"] / len(b), 5)
            rows.append(row)
            print(json.dumps(row), flush=True)
        for k in behind:
            for i in range(k, len(pubs)):
                (va, a), (vb, b) = pubs[i - k], pubs[i]
                direct = _measure(a, b)
                chain = sum(r["delta_zstd_bytes"] for r in rows[i - k : i])
                print(json.dumps({"kind": "behind", **params, "behind": k, "base_version": va, "version": vb,
                                  "full_bytes": len(b), **direct, "chain_zstd_bytes": chain,
                                  "direct_zstd_over_full": round(direct["delta_zstd_bytes"] / len(b), 5)}), flush=True)
        if rows:
            med = {key: round(statistics.median(r[key] for r in rows), 6) for key in
                   ("changed_fraction", "full_bytes", "full_zstd_bytes", "delta_bytes", "delta_zstd_bytes",
                    "encode_s", "apply_s", "delta_zstd_over_full")}
            print(json.dumps({"kind": "summary", **params, "publications": len(rows), **med,
                              "goal_delta_zstd_le_tenth_of_full": med["delta_zstd_over_full"] <= 0.1}), flush=True)


if __name__ == "__main__":
    main()
