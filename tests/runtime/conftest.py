"""Shared fixtures of the runtime tests."""

from __future__ import annotations

import importlib.util
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class TinyRun:
    tr: Any  # the Trainer, closed
    summary: dict
    out: Path  # run.out
    killed_at_step: int  # rows written when local-0 was killed
    token: str  # given in the config: it must appear in no file of the run, config.json holds it redacted
    steps: int  # learner.steps
    R: int  # learner.trajectories_per_step


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """One real run that several tests of test_trainer.py read once it is over: the learner and 2
    local worker processes over TCP, tiny-random on the math task, 8 steps of 8 trajectories, staleness 2; the
    token given in the config; metrics to jsonl and tensorboard, 3 samples logged every 2 steps; local-0 killed
    (SIGKILL) once 2 steps are done, the run going on with local-1."""
    pytest.importorskip("torch")
    pytest.importorskip("echo2_math")
    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer

    out, token, steps, R = tmp_path_factory.mktemp("tiny-run"), "tok-7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e", 8, 8
    sinks = '"jsonl", "tensorboard"' if importlib.util.find_spec("tensorboard") else '"jsonl"'
    cfg = load_config(None, [
        'model.policy="tiny-random"', "rollout.workers=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "rollout.nice=0", f"learner.steps={steps}", f"learner.trajectories_per_step={R}", "learner.staleness=2",
        "learner.lr=1e-4", "learner.data_timeout_s=120", "run.progress=false", "run.heartbeat_s=0.5",
        f'run.token="{token}"', f"run.log_to=[{sinks}]", "run.log_samples_every=2", "run.log_samples=3",
        f'run.out="{out}"',
    ])
    tr = Trainer(cfg)
    t, killed = kill_first_worker_after(tr, rows=2)
    try:
        summary = tr.run()
    finally:
        tr.close()
    t.join(5)
    return TinyRun(tr, summary, out, killed["at_step"], token, steps, R)


def kill_first_worker_after(tr: Any, rows: int) -> tuple[threading.Thread, dict[str, int]]:
    """A started thread that SIGKILLs the run's first local worker once `rows` steps are done; the dict gets the
    steps done at the kill ("at_step")."""
    killed: dict[str, int] = {}

    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(tr.rows) < rows:
            time.sleep(0.1)
        tr.procs[0].kill()
        killed["at_step"] = len(tr.rows)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    return t, killed


@pytest.fixture(scope="session")
def delta_run() -> list[str]:
    """The overrides of a short real run whose weights move at every update (tiny-random's rewards are all 0: no
    policy gradient, but weight decay), a publication every step (S = 2), delta snapshots with an anchor every 3
    publications."""
    return [
        'model.policy="tiny-random"', "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.nice=0",
        "learner.steps=6", "learner.trajectories_per_step=8", "learner.staleness=2", "learner.lr=1e-3",
        "learner.weight_decay=1.0", "learner.filter_zero_variance=false", "run.progress=false",
        "run.heartbeat_s=0.5", "broadcast.delta=true", "broadcast.anchor_every=3",
    ]


@pytest.fixture(scope="session")
def killer() -> Any:
    """kill_first_worker_after, for the test modules."""
    return kill_first_worker_after


@dataclass
class S3Server:
    """A real S3-compatible HTTP server (moto's, in server mode) on loopback, with one bucket."""

    endpoint: str
    bucket: str
    env: dict[str, str]  # what a process needs to reach it (credentials, endpoint, region, plain HTTP)

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    @property
    def options(self) -> dict[str, str]:
        """The same as store options (for this process, which must not change its own environment)."""
        return {"endpoint": self.endpoint, "region": "us-east-1", "access_key_id": "echo2-test",
                "secret_access_key": "echo2-test-secret", "allow_http": "true"}


@pytest.fixture(scope="module")
def s3_server() -> Any:
    pytest.importorskip("moto.server")
    pytest.importorskip("obstore")
    import obstore
    from moto.server import ThreadedMotoServer
    from obstore.store import S3Store

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(f"http://{host}:{port}", "echo2-test", {
            "AWS_ACCESS_KEY_ID": "echo2-test", "AWS_SECRET_ACCESS_KEY": "echo2-test-secret",
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ALLOW_HTTP": "true",
        })
        # the bucket: an S3 CreateBucket request (a PUT on the bucket) signed like any other
        opts = s3.options
        store = S3Store(s3.bucket, endpoint=opts["endpoint"], region=opts["region"],
                        access_key_id=opts["access_key_id"], secret_access_key=opts["secret_access_key"],
                        client_options={"allow_http": True})
        _create_bucket(s3, store, obstore)
        yield s3
    finally:
        server.stop()


def _create_bucket(s3: S3Server, store: Any, obstore: Any) -> None:
    import urllib.request

    # moto's server accepts an unsigned CreateBucket from loopback; obstore has no bucket operations
    req = urllib.request.Request(f"{s3.endpoint}/{s3.bucket}", method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200, r.status
    obstore.put(store, "probe", b"ok")
    assert bytes(obstore.get(store, "probe").bytes()) == b"ok"
    obstore.delete(store, "probe")
