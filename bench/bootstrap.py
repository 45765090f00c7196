"""Time from worker start to its first accepted rollout: a worker that bootstraps (no model on its machine: an
empty home and cache, the hub offline; it takes the model's files and the version-0 weights from the
coordinator) against the baseline, a worker with a local copy of the model (`--model FOLDER`).

A coordinator with the model (no training: the first rollout needs none) takes the workers one at a time,
alternating local and bootstrap, `--repeats` times each. The first bootstrap also pays the coordinator's
one read of the base weights (later ones reuse it until the first publication).

    .venv/bin/python bench/bootstrap.py [--model smollm2-135m] [--repeats 2] [--topology chain]

Prints one JSON line per worker start, with its parameters and the seconds; for a bootstrap also the bytes
it received and the seconds of the bootstrap itself (get_base to the folder written, from the worker's log).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def _empty_machine(env: dict[str, str], home: Path) -> dict[str, str]:
    """`env` (the token, thread counts) on a machine with no model: an empty home and caches, the hub offline."""
    keep = {k: v for k, v in env.items() if not k.startswith(("HF_", "TRANSFORMERS_", "XDG_")) and k != "ECHO2_CACHE"}
    return {**keep, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "ECHO2_CACHE": str(home / "cache"),
            "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1"}


def _time_to_first_rollout(coordinator, cmd: list[str], env: dict[str, str], cwd: Path, worker_id: str,
                           log: Path, timeout_s: float = 600.0) -> float | None:
    """Seconds from the worker's start to its first accepted trajectory; the worker is stopped then."""
    with open(log, "w") as fh:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        while time.monotonic() - t0 < timeout_s and proc.poll() is None:
            info = coordinator.workers.get(worker_id)
            if info is not None and info.trajectories > 0:
                return time.monotonic() - t0
            time.sleep(0.05)
        return None
    finally:
        proc.terminate()
        proc.wait(30)


def _received(home: Path, log: Path) -> dict[str, float | None]:
    """Bytes the bootstrapped worker wrote (its base files and weights: what it received, unframed), and the
    seconds from its get_base to the folder written, as it logged them."""
    [folder] = list((home / "cache" / "bootstrap").iterdir())
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    weights = sizes.pop("model.safetensors")
    found = re.search(r"bootstrapped from the coordinator in ([0-9.]+) s", log.read_text())
    return {"files": len(sizes), "file_bytes": sum(sizes.values()), "weight_bytes": weights,
            "bootstrap_s": float(found[1]) if found else None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--topology", default="chain", choices=["chain", "star", "direct"])
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args()

    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer
    from echo2sdk.runtime.providers.local import worker_command, worker_env

    work = Path(tempfile.mkdtemp(prefix="echo2-bootstrap-"))
    cfg = load_config(None, [
        f'model.policy="{args.model}"', "rollout.workers=0", f"rollout.max_new_tokens={args.max_new_tokens}",
        f'broadcast.topology="{args.topology}"', "run.progress=false", f'run.out="{work / "run"}"',
    ])
    params = {"model": args.model, "topology": args.topology, "max_new_tokens": args.max_new_tokens,
              "group_size": cfg.rollout.group_size, "tasks_per_request": cfg.rollout.tasks_per_request,
              "threads": cfg.rollout.threads, "snapshot_dtype": cfg.learner.snapshot_dtype}
    tr = Trainer(cfg)
    try:
        tr.setup()
        c = tr.coordinator
        base_env = worker_env(c.token, cfg.rollout.threads)
        for i in range(args.repeats):
            for mode in ("local", "bootstrap"):
                wid, home = f"{mode}-{i}", work / f"home-{mode}-{i}"
                home.mkdir()
                cmd = worker_command(c.host, c.port, wid, 0)
                cmd += ["--model", tr.model_path] if mode == "local" else ["--bootstrap"]
                env = base_env if mode == "local" else _empty_machine(base_env, home)
                seconds = _time_to_first_rollout(c, cmd, env, home, wid, work / f"{wid}.log")
                row = {"bench": "bootstrap", **params, "mode": mode, "repeat": i,
                       "seconds_to_first_rollout": round(seconds, 2) if seconds is not None else None}
                if mode == "bootstrap" and seconds is not None:
                    row.update(_received(home, work / f"{wid}.log"))
                print(json.dumps(row), flush=True)
    finally:
        tr.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
