"""Checkpoints and resume: the folder format (atomic, last K kept, secrets 0600), learner state that
continues exactly, and a real `echo2 run` killed with SIGKILL and resumed with --resume."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from echo2sdk.core.learner import Learner  # noqa: E402
from echo2sdk.core.records import Meta, Trajectory  # noqa: E402
from echo2sdk.runtime.learner import checkpoint  # noqa: E402
from echo2sdk.weights import resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny-random")


def _batch(seed: int, groups: int = 2, n: int = 4) -> list[list[Trajectory]]:
    import random

    rnd = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rnd.randrange(10, 2000) for _ in range(6 + g))
        group = []
        for _ in range(n):
            resp = tuple(rnd.randrange(10, 2000) for _ in range(1 + rnd.randrange(5)))
            meta = Meta(group_id=f"{seed}-{g}", prompt_ids=prompt, response_ids=resp, logprobs=(-4.0,) * len(resp))
            group.append(Trajectory(prompt="p", response="y", reward=rnd.random(), version=0, meta=meta))
        out.append(group)
    return out


def _save(learner: Learner, root: Path, step: int, tiny: str, **kw) -> Path:
    return checkpoint.save(root, step, write_model=lambda d: learner.save(str(d), tokenizer_from=tiny),
                           optimizer=learner.optimizer_state(), state={"version": step, **kw.pop("state", {})}, **kw)


KW = dict(lr=1e-2, precision="fp32", beta=0.1, threads=1)


def test_resumed_learner_takes_the_same_step_as_an_uninterrupted_one(tiny, tmp_path):
    """Model, optimizer moments and step count come back: the next update is the same update. The KL
    reference stays the initial policy, not the checkpoint."""
    a = Learner(tiny, **KW)
    a.step(_batch(1))
    a.step(_batch(2))
    ckpt = checkpoint.load(_save(a, tmp_path / "checkpoints", 2, tiny))
    want = a.step(_batch(3))

    b = Learner(tiny, weights_from=str(ckpt.path), **KW)
    b.load_optimizer_state(ckpt.optimizer())
    got = b.step(_batch(3))
    assert got.loss == pytest.approx(want.loss, abs=1e-7) and got.kl == pytest.approx(want.kl, abs=1e-7)
    assert got.kl > 0  # measured against the initial policy
    diff = max((x - y).abs().max().item() for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert diff < 1e-6

    fresh = Learner(tiny, weights_from=str(ckpt.path), **KW)  # same weights, optimizer state lost
    fresh.step(_batch(3))
    assert max((x - y).abs().max().item() for x, y in zip(a.model.parameters(), fresh.model.parameters())) > 1e-4


def test_save_is_atomic_keeps_the_last_k_and_guards_its_secrets(tiny, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from transformers import AutoModelForCausalLM, AutoTokenizer

    learner = Learner(tiny, lr=1e-3, precision="fp32", threads=1)
    root = tmp_path / "checkpoints"
    key = Ed25519PrivateKey.generate()
    for step in (1, 2, 3):
        _save(learner, root, step, tiny, keep=2, secrets={"signing.key": key.private_bytes_raw(), "token": b"t0k"})
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000003"]
    last = checkpoint.latest(root)
    assert last is not None and last.step == 3 and last.version == 3
    # the policy folder is plain Hugging Face
    AutoModelForCausalLM.from_pretrained(last.path)
    AutoTokenizer.from_pretrained(last.path)
    # ... whose index names model.safetensors as the only weight file: vLLM, SGLang and the snapshot layout
    # otherwise load optimizer.safetensors and rng.safetensors as weights ('embed_tokens.weight/exp_avg')
    from safetensors import safe_open

    from echo2sdk.backends._common import Layout

    index = json.loads((last.path / "model.safetensors.index.json").read_text())
    with safe_open(str(last.path / "model.safetensors"), "pt") as fh:
        stored = set(fh.keys())
    assert set(index["weight_map"]) == stored and set(index["weight_map"].values()) == {"model.safetensors"}
    assert {"optimizer.safetensors", "rng.safetensors"} <= {p.name for p in last.path.glob("*.safetensors")}
    layout = Layout.from_folder(last.path)
    assert set(layout.shapes) == stored and all(not k.endswith("exp_avg") for k in layout.shapes)
    # secrets: a 0700 folder of 0600 files; the signing key signs as before
    assert stat.S_IMODE((last.path / "secrets").stat().st_mode) == 0o700
    for f in (last.path / "secrets").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    kept = Ed25519PrivateKey.from_private_bytes(last.secrets()["signing.key"])
    assert kept.public_key().public_bytes_raw() == key.public_key().public_bytes_raw()

    # a save that fails half-way leaves no step folder; its debris goes with the next save
    def broken(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise OSError("disk full")

    with pytest.raises(OSError):
        checkpoint.save(root, 4, write_model=broken, optimizer=learner.optimizer_state(), state={"version": 4})
    (root / ".step-000005.tmp-999").mkdir()  # as a SIGKILL in the middle of a save leaves it
    assert checkpoint.latest(root).step == 3
    _save(learner, root, 6, tiny, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["step-000003", "step-000006"]
    assert checkpoint.run_folder(root / "step-000006") == tmp_path and checkpoint.load(tmp_path).step == 6


def test_rng_states_round_trip():
    import random

    import numpy as np

    plain, tensors = checkpoint.rng_state()
    plain = json.loads(json.dumps(plain))  # what state.json holds
    want = (random.random(), float(np.random.rand()), torch.rand(3).tolist())
    checkpoint.set_rng_state(plain, tensors)
    assert (random.random(), float(np.random.rand()), torch.rand(3).tolist()) == want


def test_version_high_water_mark(tmp_path):
    assert checkpoint.published_mark(tmp_path) == 0
    checkpoint.record_published(tmp_path, 7)
    assert checkpoint.published_mark(tmp_path) == 7 and not list(tmp_path.glob(".*tmp*"))
    assert checkpoint.resume_version(5, 7) == 8  # 6 and 7 left the learner: the resumed weights get 8
    assert checkpoint.resume_version(6, 6) == 6  # v6 was these very weights
    assert checkpoint.resume_version(6, 4) == 6  # never published: the number is free


# -- a real run, killed and resumed -----------------------------------------------------------------------
CONFIG = """
[model]
policy = "tiny-random"
[rollout]
workers = 1
group_size = 4
tasks_per_request = 2
max_new_tokens = 8
nice = 0
[learner]
steps = {steps}
trajectories_per_step = 8
staleness = 2
lr = 1e-3
lr_scheduler = "linear"
precision = "fp32"
data_timeout_s = 120
[run]
progress = false
heartbeat_s = 0.5
save_every = 2
keep_checkpoints = 2
"""


STEPS = 5  # of the killed and resumed run: killed after step 3 (checkpoint at 2), resumed for the rest


def _echo2(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    # a session of its own: one killpg stops the learner and the local workers it started, and nothing else
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "echo2sdk.cli", *args], cwd=cwd, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _stop_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.integration
def test_sigkill_then_resume_finishes_the_run_with_increasing_versions(tmp_path):
    """The learner alone is killed (its local worker lives on, re-dialling); the resumed run binds the same
    port with the checkpoint's token, the orphan re-joins it beside the new run's own worker, and the run
    ends with the planned steps, versions strictly increasing."""
    cfg, out, log = tmp_path / "tiny.toml", tmp_path / "run", tmp_path / "echo2.log"
    cfg.write_text(CONFIG.format(steps=STEPS) + f"port = {_free_port()}\n")
    first = _echo2(["run", str(cfg), "--out", str(out)], tmp_path, log)
    metrics = out / "metrics.jsonl"
    try:  # kill one update after the step-2 checkpoint: version 3 has left the learner, the checkpoint is at 2
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "3 steps took too long"
            time.sleep(0.05)
        first.kill()  # SIGKILL to the learner only: no handler runs, nothing is flushed
        first.wait(30)
        before = [json.loads(line) for line in metrics.read_text().splitlines()]
        ckpt, published = checkpoint.latest(out / "checkpoints"), checkpoint.published_mark(out)
        assert ckpt is not None and ckpt.step in (2, 4) and published >= 3

        second = _echo2(["run", str(cfg), "--resume", str(out)], tmp_path, log)
        try:
            assert second.wait(240) == 0, log.read_text()[-3000:]
        finally:
            _stop_group(second)
    finally:
        _stop_group(first)  # the orphaned worker, if it is still there
    orphan = (out / "workers" / "local-0.log").read_text()
    assert "lost the coordinator" in orphan and "re-joined" in orphan
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    versions = [r["version"] for r in rows]
    assert all(a < b for a, b in zip(versions, versions[1:])), versions
    k = ckpt.step
    assert rows[:k] == before[:k]  # appended after the checkpoint's row, not rewritten
    if published > ckpt.version:
        assert versions[k] > published  # numbers that left the learner are never reused for other weights
    assert json.loads((out / "summary.json").read_text())["steps"] == STEPS
    assert ckpt.state["lr_schedule"]["steps_done"] == ckpt.step
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * (STEPS - s) / STEPS for s in range(STEPS)])  # resumed in place
    assert "resumed from" in (out / "run.log").read_text()
    lost = (out / "metrics.discarded.jsonl")
    assert len(before) == k + (len(lost.read_text().splitlines()) if lost.exists() else 0)


@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_writes_a_checkpoint_and_a_fresh_run_refuses_the_folder(tmp_path):
    cfg, out, log = tmp_path / "tiny.toml", tmp_path / "run", tmp_path / "echo2.log"
    cfg.write_text(CONFIG.format(steps=50).replace("save_every = 2", "save_every = 0"))
    proc = _echo2(["run", str(cfg), "--out", str(out)], tmp_path, log)
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)  # the learner only; it stops its own workers
        assert proc.wait(120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    finally:
        _stop_group(proc)
    ckpt = checkpoint.latest(out / "checkpoints")
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert ckpt is not None and ckpt.step == len(rows) >= 1 and ckpt.state["steps_planned"] == 50
    assert json.loads((out / "summary.json").read_text())["stopped"] == "SIGTERM"
    fresh = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "run", str(cfg), "--out", str(out)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 2 and "--resume" in fresh.stderr


def test_resumed_learner_continues_its_lr_schedule(tiny, tmp_path):
    """The schedule's position is saved in state.json: a resumed learner takes the next step at the next rate."""
    kw = dict(KW, lr_scheduler="cosine", warmup_steps=1, total_steps=5, updates_per_step=2)
    a = Learner(tiny, **kw)
    a.step(_batch(1))
    a.step(_batch(2))
    ckpt = checkpoint.load(_save(a, tmp_path / "checkpoints", 2, tiny, state={"lr_schedule": a.schedule_state()}))
    want = a.step(_batch(3))
    b = Learner(tiny, weights_from=str(ckpt.path), **kw)
    b.load_optimizer_state(ckpt.optimizer())
    b.load_schedule_state(ckpt.state["lr_schedule"])
    got = b.step(_batch(3))
    assert got.lr == pytest.approx(want.lr) == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert got.loss == pytest.approx(want.loss, abs=1e-7)


#: echo2 with every file it (and every process it starts) writes limited to 8 MiB: a disk that fills up at the end
_LIMITED = """import os, resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))
os.execv(sys.executable, [sys.executable, "-m", "echo2sdk.cli", *sys.argv[1:]])
"""


@pytest.mark.integration
def test_a_run_whose_last_writes_fail_keeps_its_metrics_and_summary_and_exits_1(tmp_path):
    """Session eighteen lost a run's metrics to a full disk: its final checkpoint failed after all its steps and
    the traceback ended the run before summary.json (and a bench's temporary folder went with it). With files
    limited to 8 MiB (RLIMIT_FSIZE: a write past it fails with EFBIG; the tiny model's weights are 12.9 MB), every
    step trains, the last checkpoint and the final policy fail, and the run still writes summary.json naming both,
    removes the final policy's partial folder and exits 1 with the error on stderr."""
    resolve_model("tiny-random")  # converted into the cache before the limit applies
    cfg, out = tmp_path / "tiny.toml", tmp_path / "run"
    cfg.write_text(CONFIG.format(steps=2).replace("save_every = 2", "save_every = 0"))
    proc = subprocess.Popen([sys.executable, "-c", _LIMITED, "run", str(cfg), "--out", str(out)], cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        _stop_group(proc)  # the learner and its local worker, on a timeout
    assert proc.returncode == 1, stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and len((out / "metrics.jsonl").read_text().splitlines()) == 2
    errors = summary["save_errors"]
    assert [e.split(":")[0] for e in errors] == ["the last checkpoint", "the final policy"], errors
    assert all("File too large" in e for e in errors), errors
    assert summary["checkpoint"] is None and summary["last_checkpoint"] is None
    assert not (out / "checkpoint").exists() and not list((out / "checkpoints").glob("*"))  # no partial folder
    assert "echo2 run: error: the final policy" in stderr and str(out) in stderr
    assert "could not be written" in (out / "run.log").read_text()
