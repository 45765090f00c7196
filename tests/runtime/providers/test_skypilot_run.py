"""A run whose whole rollout fleet comes from the skypilot provider, end to end on this machine: `echo2 run` with no
local workers launches its warm-up machines through SkyPilot's SDK calls, answered by the recording fake
(fake_sky.py, standing in for the `sky` package in the learner's process), which runs each task's command as a
real process: real `echo2 worker`s join with their own credentials and the learner trains. Then the learner is
SIGKILLed; its ledger still names every machine, `echo2 fleet status` sees them up, `echo2 fleet down` ends them all.
The run token (and each machine's credential) appears in no argv, setup script, ledger, call record or log."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("echo2_math")

sys.path.insert(0, str(Path(__file__).parent))
from fake_sky import FakeSky, shim  # noqa: E402

from echo2sdk.runtime.providers.ledger import read_ledger  # noqa: E402
from echo2sdk.runtime.trust.worker_keys import issue  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmdlines() -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return out


def _steps(out: Path) -> int:
    p = out / "metrics.jsonl"
    return sum(1 for line in p.read_text().splitlines() if '"step"' in line) if p.is_file() else 0


def test_a_skypilot_fleet_trains_survives_a_killed_learner_and_fleet_down_ends_it(tmp_path):
    fake = FakeSky(tmp_path / "fake-sky", launch_s=0.5, exec=True)
    token = secrets.token_hex(24)
    (tmp_path / "token").write_text(token)
    out, port = tmp_path / "run", _free_port()
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f"""
[model]
policy = "tiny-random"
[task]
adapter = "math"
options = {{ difficulty = 1 }}
[rollout]
workers = 0
group_size = 4
tasks_per_request = 2
max_new_tokens = 12
[learner]
steps = 400
trajectories_per_step = 8
staleness = 3
filter_zero_variance = false  # tiny-random's rewards are all 0: with filtering the pool would be sized for f = 0.75
[run]
out = "{out}"
port = {port}
heartbeat_s = 1.0
progress = false
[scheduler]
enabled = true
provider = "skypilot"
initial_machines = 2
provider_options = {{ connect = "127.0.0.1:{port}", setup = "true", relay_port = 0 }}
[[scheduler.machines]]
name = "l4"
count = 3
price_per_hour = 0.5
mu = 1.0
resources = {{ accelerators = "L4:1", use_spot = true }}
""")
    env = dict(os.environ, FAKE_SKY_DIR=str(fake.dir), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(shim(tmp_path / "shim")), os.environ.get("PYTHONPATH", "")]))
    env.pop("ECHO2_TOKEN", None)
    console = open(tmp_path / "learner.out", "w")
    learner = subprocess.Popen([sys.executable, "-m", "echo2sdk.cli", "run", str(cfg), "--token-file",
                                str(tmp_path / "token")], env=env, stdout=console, stderr=subprocess.STDOUT)
    argvs: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while _steps(out) < 2 and time.monotonic() < deadline and learner.poll() is None:
            argvs += [c for c in _cmdlines() if "echo2" in c]
            time.sleep(0.5)
        assert _steps(out) >= 2, (tmp_path / "learner.out").read_text()[-3000:]
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
    finally:
        if learner.poll() is None:
            learner.kill()
        console.close()

    # the ledger outlived the learner: both warm-up machines, recorded before their launch, now up
    machines = read_ledger(out)
    assert sorted(machines) == ["l4-0", "l4-1"] and all(m.state == "up" for m in machines.values())
    launches = {c["cluster"]: c for c in fake.calls("launch")}
    assert sorted(launches) == sorted(m.handle["cluster"] for m in machines.values())
    for name, m in machines.items():
        assert m.handle["cluster"].endswith("-" + name) and m.launched_at <= launches[m.handle["cluster"]]["t"]
        assert m.spec["resources"] == {"accelerators": "L4:1", "use_spot": True, "ports": [0]}
    clusters = fake.clusters()
    pids = [c["pid"] for c in clusters.values()]
    assert len(clusters) == 2 and all(Path(f"/proc/{p}").exists() for p in pids)
    joined = [json.loads(x) for x in (out / "scheduler.jsonl").read_text().splitlines()]
    assert joined[0]["event"] == "provisioned" and set(joined[0]["active"]) <= {"l4-0", "l4-1"}

    fleet = [sys.executable, "-m", "echo2sdk.cli", "fleet"]
    status = subprocess.run(fleet + ["status", str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert re.search(r"l4-0\s+skypilot\s+l4\s+0\.500\s+up\s+UP", status.stdout), status.stdout
    assert "2 of 2 recorded machines still up" in status.stdout
    down = subprocess.run(fleet + ["down", str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and "l4-0: down" in down.stdout and "l4-1: down" in down.stdout, down.stdout + down.stderr
    assert fake.clusters() == {}
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    assert all(m.down for m in read_ledger(out).values())
    again = subprocess.run(fleet + ["down", str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert "every recorded machine is already down" in again.stdout

    # no secret in any argv, setup script, ledger, call record or log
    secret_texts = [token] + [str(issue(token, n)).split(":")[1] for n in ("l4-0", "l4-1")]
    assert argvs and any("echo2 worker" in a or "cli worker" in a for a in argvs)
    for text in secret_texts:
        assert not any(text in a for a in argvs)
        for f in tmp_path.rglob("*"):
            if f.is_file() and f.name != "token" and "shim" not in f.parts:
                assert text not in f.read_text(errors="replace"), f"a secret in {f}"
