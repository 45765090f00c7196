"""Chain broadcast end to end: the real coordinator plans chains and hands out fetch orders, real worker
processes (`echo2 worker --relay-only`) fetch, verify, forward and acknowledge over loopback TCP - while
a relay is killed, stalled, slowed to 0.5x, corrupts a chunk, or a manifest is forged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from echo2sdk.runtime.broadcast.chain import ChainBroadcast
from echo2sdk.core.broadcast.manifest import Signer
from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.runtime.protocol.messages import BroadcastInfo
from echo2sdk.testing import ToyAdapter

pytestmark = pytest.mark.integration

TOKEN = "chain-secret"
CHUNK = 64 << 10
SIZE = 48 * CHUNK  # 3 MiB
MBPS = 12.0  # each relay's uplink: ~2 s per snapshot, so faults land mid-broadcast


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _coordinator(delivery) -> Coordinator:
    c = Coordinator(
        buffer=StalenessBuffer(staleness=2, group_size=2),
        tasks=ToyAdapter().tasks(0),
        worker_config={},
        vocab_size=256,
        max_len=64,
        token=TOKEN,
        heartbeat_s=0.2,
        worker_timeout_s=5.0,
        delivery=delivery,
    )
    c.start()
    return c


@pytest.fixture
def fleet():
    """Start a coordinator with a delivery and relay-only worker processes; stop everything after."""
    state: dict = {"procs": {}, "coord": None}

    def start(delivery, ids, mbps=None, extra=None):
        state["coord"] = c = _coordinator(delivery)
        for wid in ids:  # one at a time, so join order (the rank of fresh workers) is the given order
            rate = (mbps or {}).get(wid, MBPS)
            cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{c.port}",
                   "--id", wid, "--relay-only", "--relay-uplink-mbps", str(rate), *(extra or {}).get(wid, ())]
            state["procs"][wid] = subprocess.Popen(cmd, env=dict(os.environ, ECHO2_TOKEN=TOKEN),
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert _wait(lambda: wid in c.workers, 20), _logs(state)
        return c

    yield start, state
    for p in state["procs"].values():
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)
    if state["coord"] is not None:
        state["coord"].stop()


def _logs(state) -> str:
    out = []
    for wid, p in state["procs"].items():
        if p.poll() is not None:
            out.append(f"--- {wid} ---\n{p.stdout.read()}")
    return "\n".join(out)


def _chain(**kw) -> ChainBroadcast:
    return ChainBroadcast(TOKEN, chunk_bytes=CHUNK, per_peer_bps=MBPS * 1e6 / 8, stall_timeout_s=1.0, **kw)


def _reports(c: Coordinator, version: int) -> dict:
    return c.delivery.reports.get(version, {})


def test_chain_delivers_to_every_worker_in_plan_order(fleet):
    start, state = fleet
    c = start(_chain(n_chains=2), ["a", "b", "c", "d"])
    c.publish(1, os.urandom(SIZE))
    assert _wait(lambda: c.t_bcast(1)[1] is not None), _logs(state)
    plan = c.delivery.plans[1]
    assert plan.chains == (("a", "c"), ("b", "d"))
    reports = _reports(c, 1)
    assert {w: r["parent"] for w, r in reports.items()} == {"a": SOURCE, "b": SOURCE, "c": "a", "d": "b"}
    assert all(r["ok"] and not r["repairs"] for r in reports.values())
    assert c.delivery.source.served_chunks == 2 * (SIZE // CHUNK)  # the learner fed two seeds, not four workers
    t_q, t_all = c.t_bcast(1)
    assert 0 < t_q <= t_all < 20


def test_relays_with_and_without_tls_mix_in_one_chain(fleet):
    """The learner's relay and c's speak TLS (pinned by their children), a's and b's do not (--relay-plaintext):
    each child learns which from the sealed plan, and every chunk is still verified."""
    start, state = fleet
    c = start(_chain(n_chains=1), ["a", "b", "c", "d"], extra={"a": ["--relay-plaintext"], "b": ["--relay-plaintext"]})
    assert c.workers["a"].relay_fingerprint == b"" and len(c.workers["c"].relay_fingerprint) == 32
    c.publish(1, os.urandom(SIZE))
    assert _wait(lambda: c.t_bcast(1)[1] is not None), _logs(state)
    reports = _reports(c, 1)
    assert {w: r["parent"] for w, r in reports.items()} == {"a": SOURCE, "b": "a", "c": "b", "d": "c"}
    assert all(r["ok"] and not r["repairs"] and not r["bad_chunks"] for r in reports.values())


@pytest.mark.parametrize("fault", ["kill", "stall"])
def test_a_relay_that_dies_or_stalls_mid_broadcast_is_repaired_around(fleet, fault):
    start, state = fleet
    c = start(_chain(n_chains=1), ["a", "b", "c", "d"])
    c.publish(1, os.urandom(SIZE))
    victim = state["procs"]["b"]
    time.sleep(0.8)  # b has relayed part of the snapshot to c
    os.kill(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    try:
        assert _wait(lambda: {"a", "c", "d"} <= set(c.publications.bcast[1]["installed"]), 30), _logs(state)
        reports = _reports(c, 1)
        rep = reports["c"]["repairs"][0]
        assert rep["parent"] == "b" and rep["reason"] == ("stalled" if fault == "stall" else rep["reason"])
        assert 0 < rep["chunk"] < SIZE // CHUNK  # resumed from its last verified chunk, not from zero
        assert rep["repair_s"] < 5.0
        assert reports["c"]["parent"] == "a"  # re-attached to the nearest healthy ancestor
        assert reports["d"]["ok"] and "b" not in c.publications.bcast[1]["installed"]
        assert c.stats()["broadcast_repairs"] >= 1
        assert c.delivery.scores.recent_failures("b", time.monotonic()) >= 1
    finally:
        if fault == "stall":
            os.kill(victim.pid, signal.SIGKILL)


def test_a_relay_slowed_to_half_speed_still_delivers_and_moves_to_the_tail(fleet):
    start, state = fleet
    c = start(_chain(n_chains=1), ["a", "b", "c"], mbps={"b": MBPS / 2})
    c.publish(1, os.urandom(SIZE))
    assert _wait(lambda: c.t_bcast(1)[1] is not None, 30), _logs(state)
    reports = _reports(c, 1)
    assert all(r["ok"] and not r["repairs"] for r in reports.values())
    speed_a, speed_b = reports["b"]["served_bps"]["a"], reports["c"]["served_bps"]["b"]
    assert speed_b < 0.7 * speed_a  # the children measured the slow relay
    c.publish(2, os.urandom(SIZE))
    assert _wait(lambda: c.t_bcast(2)[1] is not None, 30), _logs(state)
    assert c.delivery.plans[2].chains[0][-1] == "b"  # next plan: the slow relay is the tail


class _ForgingBroadcast(ChainBroadcast):
    """Announces one key at join time but signs manifests with another (a forger on the path)."""

    def welcome_info(self):
        return BroadcastInfo(public_key=Signer().public_key)


def test_a_forged_manifest_is_refused_and_nothing_is_installed(fleet, caplog):
    start, state = fleet
    c = start(_ForgingBroadcast(TOKEN, chunk_bytes=CHUNK), ["a", "b"])
    data = os.urandom(SIZE)
    c.publish(1, data)
    # each worker refuses the forged plan (nothing of it is fetched), says so, and is sent the learner's own
    # snapshot whole over its authenticated connection, once (Publications.on_rejected)
    assert _wait(lambda: all(w.version == 1 for w in c.workers.values()), 20)
    assert c.publications.bcast[1]["received"] == {} and set(c.publications.bcast[1]["installed"]) == {"a", "b"}
    assert c.publications.sent["full_pushed"] == 2
    assert "bad signature" in caplog.text  # the coordinator logs every worker's refusal


_EVIL_WORKER = """
import sys
from echo2sdk.runtime.worker import process as worker
from echo2sdk.runtime.broadcast.relay import RelayNode

class Corrupting(RelayNode):  # holds the right bytes, flips the last bit of the 6th chunk it serves
    def _send_paced(self, conn, data, peer):
        if self.served_chunks == 5:
            data = memoryview(bytes(data[:-1]) + bytes([data[-1] ^ 1]))
        super()._send_paced(conn, data, peer)

worker.RelayNode = Corrupting
sys.exit(worker.run_worker(sys.argv[1], sys.argv[2], worker_id="evil", relay_only=True))
"""


def test_a_corrupting_relay_never_gets_its_bytes_installed(fleet):
    """An authenticated but compromised worker serves a bad chunk to its child."""
    start, state = fleet
    c = start(_chain(n_chains=1), [])
    state["procs"]["evil"] = subprocess.Popen(
        [sys.executable, "-c", _EVIL_WORKER, f"127.0.0.1:{c.port}", TOKEN],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert _wait(lambda: "evil" in c.workers, 20), _logs(state)
    cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{c.port}", "--id", "honest",
           "--relay-only"]
    state["procs"]["honest"] = subprocess.Popen(cmd, env=dict(os.environ, ECHO2_TOKEN=TOKEN),
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert _wait(lambda: "honest" in c.workers, 20), _logs(state)
    c.publish(1, os.urandom(SIZE))
    assert _wait(lambda: c.t_bcast(1)[1] is not None, 30), _logs(state)
    assert c.delivery.plans[1].upstream("honest") == ("evil", SOURCE)
    r = _reports(c, 1)["honest"]
    assert r["ok"] and r["bad_chunks"] == 1 and r["parent"] == SOURCE
    rep = r["repairs"][0]
    assert (rep["parent"], rep["reason"], rep["chunk"]) == ("evil", "bad_chunk", 5) and rep["repair_s"] < 5
    c.publish(2, os.urandom(SIZE))  # the next plan no longer trusts the corrupting relay as a seed
    assert _wait(lambda: 2 in c.delivery.plans)
    assert c.delivery.plans[2].chains[0][0] == "honest"
