"""A local worker's CPU priority (rollout.nice, `echo2 worker --nice`): "idle" is SCHED_IDLE on every thread, a
niceness lowers every thread, a refused SCHED_IDLE falls back to nice 19, and bad values are refused by value."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from echo2sdk.config import load_config
from echo2sdk.errors import ConfigError
from echo2sdk.runtime.providers.local import LocalProvider, worker_command
from echo2sdk.runtime.worker import priority
from echo2sdk.core.checks import nice as parse_nice
from echo2sdk.runtime.worker.priority import lower_priority

LINUX = sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE")
needs_linux = pytest.mark.skipif(not LINUX, reason="SCHED_IDLE and /proc/self/task are Linux's")


@pytest.mark.parametrize(("given", "want"), [("idle", "idle"), (" IDLE ", "idle"), ("0", 0), (7, 7), ("19", 19)])
def test_nice_takes_idle_or_0_to_19(given, want):
    assert parse_nice(given) == want


@pytest.mark.parametrize("bad", ["low", "20", -1, 1.5, True, None, "1.0", "\u00b2"])
def test_a_bad_nice_is_refused_by_value(bad):
    with pytest.raises(ValueError, match=f"nice must be 'idle' or an integer 0-19, got {bad!r}"):
        parse_nice(bad)


def test_the_config_defaults_to_idle_and_names_a_bad_value():
    assert load_config(None, []).rollout.nice == "idle"
    assert load_config(None, ['rollout.nice="IDLE"']).rollout.nice == "idle"
    assert load_config(None, ["rollout.nice=10"]).rollout.nice == 10
    for bad in ("20", "1.5", '"low"'):
        with pytest.raises(ConfigError, match=r"rollout\.nice must be 'idle' or an integer 0-19, got"):
            load_config(None, [f"rollout.nice={bad}"])


PROBE = """
import json, os, sys, threading
from echo2sdk.runtime.worker.priority import lower_priority
go = threading.Event()
before = threading.Thread(target=go.wait); before.start()   # a thread that runs before the call
said = lower_priority(sys.argv[1])
after = threading.Thread(target=go.wait); after.start()     # one started after it inherits the policy
tids = [int(t) for t in os.listdir("/proc/self/task")]
print(json.dumps({"said": said, "threads": len(tids), "policies": sorted({os.sched_getscheduler(t) for t in tids}),
                  "nice": sorted({os.getpriority(os.PRIO_PROCESS, t) for t in tids})}))
go.set()
"""


def _probe(nice: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, nice], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@needs_linux
def test_idle_moves_every_thread_to_sched_idle():
    got = _probe("idle")
    if got["said"].startswith("nice 19 (SCHED_IDLE refused"):
        pytest.skip(f"this system refuses SCHED_IDLE: {got['said']}")
    assert got["said"] == "SCHED_IDLE" and got["threads"] >= 3 and got["policies"] == [os.SCHED_IDLE]


@needs_linux
def test_a_niceness_lowers_every_thread_and_keeps_the_policy():
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if mine >= 14:
        pytest.skip(f"this test process already runs at nice {mine}: +5 cannot be seen")
    got = _probe("5")
    assert got["said"] == "nice 5" and got["policies"] == [os.sched_getscheduler(0)]
    assert got["nice"] == [max(5, mine)]  # every thread, the one started before the call included
    assert lower_priority(0) == "normal priority"  # 0 changes nothing (in this process)


@needs_linux
def test_a_refused_sched_idle_falls_back_to_nice_19(monkeypatch):
    def refuse(*_):
        raise OSError(22, "Invalid argument")  # what gVisor answers

    niced = []
    monkeypatch.setattr(priority.os, "sched_setscheduler", refuse)
    monkeypatch.setattr(priority, "_renice", niced.append)
    assert lower_priority("idle") == "nice 19 (SCHED_IDLE refused: [Errno 22] Invalid argument)"
    assert niced == [19]


def test_the_worker_command_carries_the_priority_and_the_cli_refuses_a_bad_one():
    assert worker_command("127.0.0.1", 9, "local-0", "idle")[-2:] == ["--nice", "idle"]
    assert LocalProvider("127.0.0.1:9", "t" * 40, nice="idle").command("local-0")[-4:-2] == ["--nice", "idle"]
    with pytest.raises(ValueError, match="got 'high'"):
        LocalProvider("127.0.0.1:9", "t" * 40, nice="high")
    cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", "127.0.0.1:9", "--nice", "high"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, ECHO2_TOKEN="t" * 40))
    assert done.returncode == 2 and "nice must be 'idle' or an integer 0-19, got 'high'" in done.stderr


@needs_linux
def test_echo2_worker_applies_idle_before_it_connects():
    """The real worker process: `--nice idle` is applied (and said) before it reaches for the coordinator; here
    a port nothing listens on, so it gives up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{port}", "--plaintext",
           "--connect-timeout-s", "1", "--nice", "idle"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, ECHO2_TOKEN="t" * 40))
    if "SCHED_IDLE refused" in done.stderr:
        pytest.skip("this system refuses SCHED_IDLE (the worker fell back to nice 19)")
    assert "echo2 worker: CPU priority: SCHED_IDLE" in done.stderr, done.stderr[-2000:]
    assert "cannot reach the coordinator" in done.stderr
