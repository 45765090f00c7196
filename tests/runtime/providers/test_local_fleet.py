"""`echo2 fleet down` with the `local` provider signals only a worker this run started, proven by the nonce in its
environment (readable by its owner alone), never a process that merely looks like one (pid, start time, uid and
command line are readable by anyone); and it reports, and records in the ledger, only what it did."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from echo2sdk.cli import main
from echo2sdk.runtime.providers import fleet_down, fleet_status, load_provider
from echo2sdk.runtime.providers.ledger import read_ledger
from echo2sdk.runtime.providers.local import process_started

sys.path.insert(0, str(Path(__file__).parent))
from waiting import eventually  # noqa: E402

pytestmark = pytest.mark.integration

TOKEN = "local-fleet-test-token-" + "x" * 40
NONCE = "ECHO2_LEDGER_NONCE"
# a harmless process whose command line is that of worker "w0": `... echo2sdk.cli worker --id w0`
LOOK_ALIKE = [sys.executable, "-c", "import time; time.sleep(60)", "echo2sdk.cli", "worker", "--id", "w0"]


@pytest.fixture
def procs():
    """Start processes for a test; each is killed (by its own pid) and reaped at the end."""
    started: list[subprocess.Popen] = []

    def start(argv, **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)



def _ledger(run_dir: Path, machines: dict[str, dict | None], state: str = "up") -> None:
    """A ledger as someone could write it by hand: name -> the handle of its `up` line (None: a launch only)."""
    lines = []
    for name, handle in machines.items():
        lines.append({"t": 1, "provider": "local", "event": "launch", "machine": name, "handle": {}, "spec": {}})
        if handle is not None:
            lines.append({"t": 2, "provider": "local", "event": state, "machine": name, "handle": handle})
    path = run_dir / "machines.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    path.chmod(0o600)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.decode().split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)


@pytest.mark.parametrize("recorded", ["no digest (an older ledger)", "a guessed digest"])
def test_fleet_down_never_signals_a_look_alike_process(tmp_path, procs, recorded):
    other = procs(LOOK_ALIKE, env=dict(os.environ, **{NONCE: "the other run's own nonce"}))
    eventually(lambda: b"echo2sdk.cli" in Path(f"/proc/{other.pid}/cmdline").read_bytes(), what="the look-alike up")
    handle = {"pid": other.pid, "started": process_started(other.pid)}  # all of it readable by anyone from /proc
    if recorded == "a guessed digest":
        handle["nonce_sha256"] = hashlib.sha256(b"a guess").hexdigest()
    _ledger(tmp_path, {"w0": handle})

    (row,) = fleet_status(tmp_path)
    assert not row["now"].startswith("running") and row["now"] != "gone"  # it runs, but is not shown as ours
    said = fleet_down(tmp_path)["w0"]
    assert said.startswith("refused") and "not signalled" in said
    if recorded.startswith("no digest"):
        assert "older" in said
    assert other.poll() is None  # never signalled
    assert read_ledger(tmp_path)["w0"].state == "up"  # and not recorded down
    assert main(["fleet", "down", str(tmp_path)]) == 1
    assert other.poll() is None


def _stand_in(tmp_path: Path, ignore_term: bool = False) -> Path:
    """An interpreter for the provider that only sleeps (its argv stays `... -m echo2sdk.cli worker ... --id NAME`)."""
    python = tmp_path / "python"
    if ignore_term:
        python.write_text(f"#!{sys.executable}\nimport signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                          "print('ready', flush=True)\ntime.sleep(60)\n")
    else:
        python.write_text("#!/bin/sh\ntrap 'kill $!; exit 0' TERM\necho ready\nsleep 60 &\nwait\n")
    python.chmod(0o755)
    return python


def _local(tmp_path: Path, python: Path):
    return load_provider("local", run={"connect": "127.0.0.1:9", "token": TOKEN, "run_dir": str(tmp_path),
                                       "log_dir": str(tmp_path / "workers")}, python=str(python))


def test_fleet_down_ends_a_worker_the_provider_started_and_records_it_down(tmp_path, capsys):
    p = _local(tmp_path, _stand_in(tmp_path))
    try:
        p.start("local-0")
        log = tmp_path / "workers" / "local-0.log"
        eventually(lambda: log.is_file() and "ready" in log.read_text(), what="the worker up")
        proc = p.procs["local-0"]
        nonce = _environ(proc.pid)[NONCE]
        assert len(nonce) >= 32
        m = read_ledger(tmp_path)["local-0"]
        assert m.handle["nonce_sha256"] == hashlib.sha256(nonce.encode()).hexdigest()
        # the nonce itself is in no file of the run, nor on the command line anyone may read
        assert all(nonce not in f.read_text() for f in tmp_path.rglob("*") if f.is_file())
        assert nonce.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()

        # the learner is gone without closing anything
        (row,) = fleet_status(tmp_path)
        assert row["now"] == f"running (pid {proc.pid})"
        assert fleet_down(tmp_path) == {"local-0": "down"}
        proc.wait(5)
        assert read_ledger(tmp_path)["local-0"].down
        assert main(["fleet", "down", str(tmp_path)]) == 0
        assert "every recorded machine is already down" in capsys.readouterr().out
    finally:
        p.close()


def test_fleet_down_kills_a_worker_that_ignores_sigterm_and_says_so(tmp_path, monkeypatch):
    from echo2sdk.runtime.providers import local

    monkeypatch.setattr(local, "TERM_S", 0.5)
    p = _local(tmp_path, _stand_in(tmp_path, ignore_term=True))
    try:
        p.start("local-0")
        log = tmp_path / "workers" / "local-0.log"
        eventually(lambda: log.is_file() and "ready" in log.read_text(), what="the worker up, SIGTERM ignored")
        assert fleet_down(tmp_path) == {"local-0": "killed"}
        assert p.procs["local-0"].wait(5) == -9
        assert read_ledger(tmp_path)["local-0"].down
    finally:
        p.close()


def test_fleet_down_reports_what_it_found_for_entries_it_did_not_signal(tmp_path, procs):
    ended = procs([*LOOK_ALIKE[:-1], "ended"])
    handle = {"pid": ended.pid, "started": process_started(ended.pid),
              "nonce_sha256": hashlib.sha256(b"whatever").hexdigest()}
    ended.kill()
    ended.wait(10)
    _ledger(tmp_path, {"ended": handle, "unrecorded": None})
    failed = {"t": 1, "provider": "local", "machine": "failed", "handle": {}}  # a launch that failed: nothing ran
    with (tmp_path / "machines.jsonl").open("a") as fh:
        fh.write(json.dumps({**failed, "event": "launch"}) + "\n" + json.dumps({**failed, "event": "failed"}) + "\n")

    now = {r["machine"]: r["now"] for r in fleet_status(tmp_path)}
    assert now["ended"] == "gone" and now["failed"] == "gone" and now["unrecorded"].startswith("unknown")
    said = fleet_down(tmp_path)
    assert said["ended"] == "gone" and said["failed"] == "gone"  # already ended: nothing signalled
    assert said["unrecorded"].startswith("unknown") and "not signalled" in said["unrecorded"]
    machines = read_ledger(tmp_path)
    assert machines["ended"].down and machines["failed"].down  # they are no longer running
    assert machines["unrecorded"].state == "launch"  # nothing is known of it: not recorded down
    assert main(["fleet", "down", str(tmp_path)]) == 1
