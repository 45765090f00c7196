"""A worker with nothing but the package and the token: it takes the model's files and weights from the
coordinator (runtime/broadcast/bootstrap.py), writes them only where and as allowed, and trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from echo2sdk.errors import ConfigError, ProtocolError
from echo2sdk.runtime.broadcast.bootstrap import BASE_FILES, MAX_FILE_BYTES, WEIGHTS_FILE, ModelFolder, write_base
from echo2sdk.runtime.protocol.messages import BaseFiles, parse
from echo2sdk.runtime.protocol.wire import digest


def _base_files(entries: list[tuple[str, bytes, str | None]]) -> tuple[BaseFiles, bytes]:
    """A BaseFiles message as it comes off the wire (a parsed header) and its payload; a None sha256 is
    the file's own."""
    header = {"type": "base_files", "files": [
        {"name": name, "nbytes": len(data), "sha256": sha or digest(data)} for name, data, sha in entries]}
    return parse(header, (BaseFiles,)), b"".join(data for _, data, _ in entries)


def test_bad_names_sizes_and_digests_are_refused_counted_and_never_written(tmp_path):
    root = tmp_path / "cache"
    good = b'{"model_type": "llama"}'
    msg, payload = _base_files([
        ("../x", b"escape", None),
        (str(tmp_path / "abs"), b"absolute", None),
        ("sub/tokenizer.json", b"nested", None),
        ("..", b"dots", None),
        (WEIGHTS_FILE, b"weights may only come as a snapshot", None),
        ("tokenizer.json", b"t" * (MAX_FILE_BYTES + 1), None),
        ("tokenizer_config.json", b"{}", digest(b"something else")),
        ("config.json", good, None),
        ("config.json", b'{"model_type": "other"}', None),
    ])
    folder, refused = write_base(root, msg, payload, b"snapshot bytes")
    assert refused == {"name not allowed": 5, "too large": 1, "sha256 mismatch": 1, "duplicate name": 1}
    assert folder.parent == root / "bootstrap"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(str((folder / n).relative_to(tmp_path)) for n in ("config.json", WEIGHTS_FILE))
    assert (folder / "config.json").read_bytes() == good
    assert (folder / WEIGHTS_FILE).read_bytes() == b"snapshot bytes"
    assert write_base(root, msg, payload, b"snapshot bytes")[0] == folder  # the same content: the same folder


def test_a_lying_payload_or_no_acceptable_config_writes_nothing(tmp_path):
    msg, payload = _base_files([("config.json", b"{}", None)])
    with pytest.raises(ProtocolError, match="payload of 3 bytes"):
        write_base(tmp_path, msg, payload + b"!", b"w")
    msg, payload = _base_files([("config.json", b"{}", "0" * 64), ("vocab.json", b"{}", None)])
    with pytest.raises(ConfigError, match="no acceptable config.json.*sha256 mismatch"):
        write_base(tmp_path, msg, payload, b"w")
    with pytest.raises(ConfigError, match="serves no base model: 'no folder'"):
        write_base(tmp_path, BaseFiles(reason="no folder"), b"", b"w")
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_the_coordinator_serves_only_allow_listed_files(tmp_path):
    for name, data in [("config.json", b"{}"), ("tokenizer.json", b"tok"), ("notes.txt", b"private"),
                       ("model.safetensors.index.json", b"{}"), ("model.safetensors", b"")]:
        (tmp_path / name).write_bytes(data)
    msg, payload = ModelFolder(tmp_path).message()
    assert [f.name for f in msg.files] == ["config.json", "tokenizer.json"] and payload == b"{}tok"
    (tmp_path / "config.json").unlink()
    msg, payload = ModelFolder(tmp_path).message()
    assert msg.files == () and "lacks config.json" in msg.reason and payload == b""


# -- a real run: the learner's model folder is nowhere the worker can see ------------------------------------
def _learner_model(folder) -> None:
    """A copy of tiny-random with one tensor changed: weights that exist nowhere but on the learner."""
    from safetensors.torch import load_file, save_file

    from echo2sdk.weights import resolve_model

    shutil.copytree(resolve_model("tiny-random"), folder)
    state = load_file(folder / WEIGHTS_FILE)
    state["model.norm.weight"] = state["model.norm.weight"] + 0.25
    save_file(state, folder / WEIGHTS_FILE, metadata={"format": "pt"})


def _empty_machine(tmp_path) -> dict[str, str]:
    """The environment of a worker on a machine with no model: an empty home and caches, the hub offline."""
    home = tmp_path / "home"
    home.mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "ECHO2_", "TRANSFORMERS_", "XDG_"))}
    return {**keep, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "ECHO2_CACHE": str(home / "cache"),
            "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _first_rollout(tr, worker_id: str, t0: float, out: dict) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        info = tr.coordinator.workers.get(worker_id)
        if info is not None and info.trajectories > 0:
            out["s"] = time.monotonic() - t0
            return
        time.sleep(0.05)


@pytest.mark.integration
def test_a_worker_with_only_the_package_and_the_token_gets_every_byte_over_the_wire_and_trains(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("echo2_math")
    from safetensors.torch import load_file

    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer
    from echo2sdk.runtime.providers.local import worker_command

    learner_dir, worker_dir = tmp_path / "learner", tmp_path / "worker"
    learner_dir.mkdir()
    worker_dir.mkdir()
    _learner_model(learner_dir / "tiny")
    monkeypatch.chdir(learner_dir)  # the coordinator names the model "tiny": a relative path, only here
    cfg = load_config(None, [
        'model.policy="tiny"', "rollout.workers=0", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "learner.steps=3", "learner.trajectories_per_step=8", "learner.staleness=2", "learner.data_timeout_s=120",
        "run.progress=false", "run.heartbeat_s=0.5", f'run.out="{tmp_path / "run"}"',
    ])
    tr = Trainer(cfg)
    proc, first = None, {}
    try:
        tr.setup()
        assert tr.coordinator.worker_config.model_path == "tiny" and not (worker_dir / "tiny").exists()
        env = {**_empty_machine(tmp_path), "ECHO2_TOKEN": tr.coordinator.token}
        cmd = [*worker_command(tr.coordinator.host, tr.coordinator.port, "boot", 0), "--bootstrap"]
        with open(tmp_path / "worker.log", "w") as log:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=worker_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        watch = threading.Thread(target=_first_rollout, args=(tr, "boot", t0, first), daemon=True)
        watch.start()
        tr.run()
        watch.join(5)
        boot = tr.coordinator.workers["boot"]
        deadline = time.monotonic() + 60
        while boot.version < tr.version and time.monotonic() < deadline:  # it installs what the learner publishes
            time.sleep(0.1)
    finally:
        tr.close()
        if proc is not None:
            try:
                proc.wait(30)  # the coordinator's shutdown ends it
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print(json.dumps({"test": "bootstrap_tiny_random", "time_to_first_rollout_s": round(first["s"], 2)}))
    assert [r["step"] for r in tr.rows] == [1, 2, 3]  # every trajectory came from the bootstrapped worker
    assert boot.trajectories >= 24 and boot.version == tr.version == 3 and tr.coordinator.bases_served == 1
    assert "bootstrapped from the coordinator" in (tmp_path / "worker.log").read_text()
    [folder] = list((tmp_path / "home" / "cache" / "bootstrap").iterdir())
    sent = {p.name for p in (learner_dir / "tiny").iterdir() if p.name in BASE_FILES}
    assert {p.name for p in folder.iterdir()} == sent | {WEIGHTS_FILE}
    for name in sent:
        assert (folder / name).read_bytes() == (learner_dir / "tiny" / name).read_bytes()
    got, base = load_file(folder / WEIGHTS_FILE), load_file(learner_dir / "tiny" / WEIGHTS_FILE)
    assert set(got) == set(base)  # version 0: the learner's own weights, as the snapshot dtype
    assert all(torch.equal(got[k], base[k].to(torch.bfloat16)) for k in base)
    assert torch.equal(got["model.norm.weight"], torch.full_like(got["model.norm.weight"], 1.25))
