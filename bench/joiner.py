"""A late joiner: how long a worker that joins a running job takes to its first rollout, taking the current
snapshot from the learner or from the run's snapshot store (an S3 server), and the bytes the learner sends it.

The main job (examples/math_smollm2.toml: SmolLM2-135M, 2 local workers, delta snapshots with an anchor every
`--anchor-every` publications) runs `--steps` steps; once `--join-after` steps are done a third local worker
starts. Per variant, in one process one after the other:

- `push`: no store; the newest publication is a delta, so the joiner gets the full snapshot over its control
  connection from the learner (the baseline);
- `chain`: no store, no deltas; the joiner gets the full snapshot over the chain broadcast, from the learner;
- `s3`: broadcast.store on an S3 server (moto's, in its own process on loopback; credentials in the environment,
  as on a real machine); the joiner rebuilds the snapshot from the newest anchor and the deltas after it.

For each: seconds from the joiner's process start to its welcome, to its first installed version, and to its first
accepted rollout group; the bytes the learner pushed to it; the store read (anchor, deltas, bytes, seconds) from
its log. One JSON line per variant, parameters on every line.

    .venv/bin/python bench/joiner.py [--variants push,chain,s3] [--steps 8] [--join-after 5] [--repeats 1]
                                     [--set broadcast.uplink_mbps=100 --set broadcast.shape_uplink=true]

Time it on a quiet machine: the joiner is a third process beside the learner and two workers on the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CREDS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process, with a bucket; (process, endpoint)."""
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/echo2-bench", method="PUT"), timeout=5):
                return proc, endpoint
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.2)


def one(variant: str, args: argparse.Namespace, endpoint: str | None) -> dict:
    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer

    out = Path(args.out) / f"{variant}-{time.strftime('%H%M%S')}"
    sets = [f"learner.steps={args.steps}", f'run.out="{out}"', "run.progress=false",
            f"broadcast.delta={'false' if variant == 'chain' else 'true'}", f"broadcast.anchor_every={args.anchor_every}"]
    if variant == "s3":
        assert endpoint is not None
        sets += [f'broadcast.store="s3://echo2-bench/{int(time.time())}"',
                 f'broadcast.store_options={{endpoint="{endpoint}", region="us-east-1", allow_http="true"}}']
    cfg = load_config(ROOT / "examples" / "math_smollm2.toml", [*sets, *args.sets])
    tr = Trainer(cfg)
    seen: dict = {}

    def joiner() -> None:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and len(tr.rows) < args.join_after:
            time.sleep(0.1)
        pushed0 = tr.coordinator.publications.sent["full_pushed"]
        t0 = time.monotonic()
        tr.local.start("late")
        seen["version_at_join"] = tr.publication.published[-1] if tr.publication.published else 0
        while time.monotonic() < deadline and "first_rollout_s" not in seen:
            w = tr.coordinator.workers.get("late")
            if w is not None:
                seen.setdefault("welcome_s", time.monotonic() - t0)
                if w.installed and "installed_s" not in seen:
                    seen["installed_s"], seen["installed_version"] = time.monotonic() - t0, min(w.installed)
                if w.trajectories > 0:
                    seen["first_rollout_s"] = time.monotonic() - t0
            time.sleep(0.05)
        seen["pushed_to_joiner"] = tr.coordinator.publications.sent["full_pushed"] - pushed0

    with mock.patch.dict(os.environ, CREDS if variant == "s3" else {}):  # the joiner's process copies them
        t = threading.Thread(target=joiner, daemon=True)
        t.start()
        try:
            summary = tr.run()
        finally:
            t.join(5)
            tr.close()
    log = (out / "workers" / "late.log").read_text()
    m = re.search(r"from the store in ([\d.]+) s: (?:anchor v(\d+)|held v\d+) \+ (\d+) delta\(s\), (\d+) bytes read", log)
    full = max((s["full_bytes"] for s in tr.publication.sent), default=None)
    return {
        "bench": "joiner", "variant": variant, "steps": args.steps, "join_after": args.join_after,
        "anchor_every": args.anchor_every, "model": cfg.model.policy, "snapshot_bytes": full,
        **{k: round(v, 2) if isinstance(v, float) else v for k, v in seen.items()},
        "learner_bytes_to_joiner": seen.get("pushed_to_joiner", 0) * (full or 0) if variant == "push" else None,
        "store_read_s": float(m.group(1)) if m else None, "store_anchor": int(m.group(2)) if m and m.group(2) else None,
        "store_deltas": int(m.group(3)) if m else None, "store_bytes": int(m.group(4)) if m else None,
        "store": summary.get("store"), "wall_s": summary.get("wall_s"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="push,chain,s3")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--join-after", type=int, default=5, help="steps done when the joiner starts (v4, a delta, is out)")
    p.add_argument("--anchor-every", type=int, default=10)
    p.add_argument("--out", default="runs/bench-joiner")
    p.add_argument("--set", action="append", default=[], dest="sets",
                   help="more config overrides, e.g. broadcast.uplink_mbps=100 with broadcast.shape_uplink=true "
                   "(the learner's relay paced at B0: a joiner over the chain waits for it, one from the store not)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each variant, interleaved")
    args = p.parse_args()
    variants = args.variants.split(",")
    server, endpoint = s3_server() if "s3" in variants else (None, None)
    try:
        for i in range(args.repeats):
            for v in variants:
                print(json.dumps({**one(v, args, endpoint), "repeat": i, "overrides": args.sets}), flush=True)
    finally:
        if server is not None:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
