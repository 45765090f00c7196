"""Before authentication every size is small and bounded: a huge claimed header costs no memory, idle
connections cost no threads and cannot keep a real worker out, failed logins are rate limited."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
from _peers import TOKEN, Client, finish, make_coordinator, spawn_worker, wait

from echo2sdk.core.broadcast.manifest import Signer, build_manifest
from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.errors import AuthError
from echo2sdk.runtime.broadcast.relay import RelayNode, Upstream
from echo2sdk.runtime.trust.tls import client_context

pytestmark = pytest.mark.integration

MiB = 1 << 20

_SERVERS = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from _peers import make_coordinator
from echo2sdk.runtime.broadcast.relay import RelayNode
c = make_coordinator()
r = RelayNode("%s", node_id="relay")
print(json.dumps({"coordinator": c.port, "relay": r.port}), flush=True)
time.sleep(600)
""" % TOKEN


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def _huge_header_attack(port: int, sealed: bool) -> None:
    """TLS, then a frame whose prefix claims a 4 MiB header, and 4 MiB of msgpack empty maps after it."""
    body = b"\xdd" + (4 * MiB - 5).to_bytes(4, "big") + b"\x80" * (4 * MiB - 5)  # an array of 4M empty maps
    prefix = (b"E2S1" if sealed else b"E2F1") + len(body).to_bytes(4, "big") + (0).to_bytes(8, "big")
    try:
        with client_context().wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10)) as s:
            s.sendall(prefix + (b"\0" * 32 if sealed else b"") + body)
            s.recv(1 << 16)
    except (OSError, ssl.SSLError):
        pass  # the server hung up on us, as it should


def test_a_4_mib_preauth_header_grows_neither_the_coordinator_nor_a_relay(tmp_path):
    """The claimed length is checked against the few-KiB pre-auth limit before anything is read or allocated."""
    here = os.path.dirname(__file__)
    p = subprocess.Popen([sys.executable, "-c", _SERVERS, here], stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(p.stdout.readline())
        time.sleep(0.5)
        before = _rss_kib(p.pid)
        for target in ("coordinator", "relay"):
            threads = [threading.Thread(target=_huge_header_attack, args=(ports[target], sealed))
                       for sealed in (False, True) for _ in range(5)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        time.sleep(0.5)
        growth_mib = (_rss_kib(p.pid) - before) / 1024
        print(json.dumps({"measure": "preauth_rss_growth_mib", "attacks": 20, "header_mib": 4,
                          "value": round(growth_mib, 2)}))
        assert growth_mib < 10
        assert p.poll() is None  # still serving
    finally:
        p.kill()
        p.communicate(timeout=10)


def test_1000_bad_logins_are_refused_and_rate_limited():
    coord = make_coordinator()
    outcomes = {"refused": 0, "closed": 0}

    async def attempt():
        try:
            c = await Client.join(coord.port, "a-wrong-token", local="127.0.0.2", worker_id="intruder")
            outcomes["refused" if c.answer["type"] == "refused" else "welcome"] = 1 + outcomes.get(c.answer["type"], 0)
            await c.close()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, AuthError):
            outcomes["closed"] += 1  # closed at accept: rate-limited

    async def attack():  # 50 bursts of 20 concurrent attempts over ~5 s: the sustained rate shows
        for _ in range(50):
            await asyncio.gather(*(attempt() for _ in range(20)))
            await asyncio.sleep(0.1)

    try:
        t0 = time.monotonic()
        asyncio.run(attack())
        elapsed = time.monotonic() - t0
        stats = coord.stats()
        handshakes = coord.refused  # attempts that got as far as a challenge and a checked hello
        print(json.dumps({"measure": "bad_logins", "attempts": 1000, "elapsed_s": round(elapsed, 2),
                          "full_handshakes": handshakes, "rate_limited": stats["rate_limited"],
                          "handshakes_per_s": round(handshakes / elapsed, 2)}))
        assert outcomes.get("welcome", 0) == 0 and not coord.workers
        assert outcomes["refused"] + outcomes["closed"] == 1000
        assert handshakes + stats["rate_limited"] >= 1000 - 20  # every attempt accounted for (bar the last few)
        # the burst (10), what was in flight when it ran out (at most 16 pending per IP), then fail_per_s (1/s)
        assert handshakes <= 10 + 16 + 1.0 * elapsed + 2
        # a real worker elsewhere is not locked out by someone else's failures
        good = asyncio.run(_join_and_close(coord.port))
        assert good == "welcome"
    finally:
        coord.stop()


async def _join_and_close(port: int) -> str:
    c = await Client.join(port, worker_id="good", local="127.0.0.1")
    await c.close()
    return c.answer["type"]


def _idle(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    return out


def test_500_idle_connections_cost_no_threads_and_a_real_worker_still_joins():
    coord = make_coordinator()
    src = RelayNode(TOKEN, node_id=SOURCE)
    data = os.urandom(8 * (64 << 10))
    m = build_manifest(data, 1, 64 << 10, Signer())
    src.publish(m, data)
    idle: list[socket.socket] = []
    p = None
    try:
        time.sleep(0.2)
        threads_before = threading.active_count()
        idle = _idle(coord.port, 500) + _idle(src.port, 500)
        time.sleep(2.0)  # accepted, admitted, evicted by one another
        assert threading.active_count() <= threads_before + 1
        assert coord.admission.pending() <= coord.admission.max_pending and src._gate.pending() <= 128
        t0 = time.monotonic()
        p = spawn_worker(coord.port, TOKEN, "--relay-only")
        assert wait(lambda: "w-real" in coord.workers, 60), finish(p, 1)[1]
        join_s = time.monotonic() - t0
        child = RelayNode(TOKEN, node_id="child")
        try:
            t1 = time.monotonic()
            report = child.fetch(m, [Upstream(SOURCE, src.host, src.port, src.fingerprint)])
            fetch_s = time.monotonic() - t1
            assert report.ok and bytes(child.assembly(1).view) == data
        finally:
            child.close()
        print(json.dumps({"measure": "idle_flood", "idle_connections": 1000, "worker_join_s": round(join_s, 2),
                          "relay_fetch_s": round(fetch_s, 2),
                          "threads_added": threading.active_count() - threads_before,
                          "coordinator_evicted": coord.admission.evicted, "relay_evicted": src.admission.evicted}))
        assert threading.active_count() <= threads_before + 4  # the child's gate, a finished stream, ...
    finally:
        for s in idle:
            s.close()
        if p is not None:
            p.kill()
            finish(p, 10)
        src.close()
        coord.stop()


def test_a_stream_thread_that_cannot_start_costs_one_fetch_not_the_relay(monkeypatch):
    """Out of threads (a container's pids limit) when a child authenticates: that child is closed and repairs
    elsewhere; the relay's handshake thread lives on, its stream count is not leaked, the next child is served."""
    data = os.urandom(4 * (64 << 10))
    m = build_manifest(data, 1, 64 << 10, Signer())
    src = RelayNode(TOKEN, node_id=SOURCE)
    children = [RelayNode(TOKEN, node_id=f"child-{i}", stall_timeout_s=2.0) for i in range(2)]
    real_start, failed = threading.Thread.start, []

    def start(self):
        if self.name.endswith("-stream") and not failed:
            failed.append(self.name)
            raise RuntimeError("can't start new thread")
        return real_start(self)

    try:
        src.publish(m, data)
        up = [Upstream(SOURCE, src.host, src.port, src.fingerprint)]
        monkeypatch.setattr(threading.Thread, "start", start)
        first = children[0].fetch(m, up)
        assert failed and not first.ok
        monkeypatch.setattr(threading.Thread, "start", real_start)
        second = children[1].fetch(m, up)
        assert second.ok and bytes(children[1].assembly(1).view) == data
        assert wait(lambda: src.streams == 0, 10)
    finally:
        for n in (*children, src):
            n.close()


def test_a_handshake_past_its_deadline_is_closed_and_counted_on_the_coordinator_and_a_relay():
    coord = make_coordinator(handshake_s=0.5)
    relay = RelayNode(TOKEN, node_id="relay", handshake_s=0.5)
    socks = []
    try:
        for port in (coord.port, relay.port):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"\x16")  # one byte of a TLS hello, then nothing
            socks.append(s)
        for s in socks:
            assert s.recv(1 << 16) == b""  # closed at the deadline (recv's own timeout is 5 s)
        assert wait(lambda: coord.stats()["handshake_timeouts"] == 1 and
                    relay.admission.stats()["handshake_timeouts"] == 1, 5)
    finally:
        for s in socks:
            s.close()
        relay.close()
        coord.stop()


def test_a_relay_serves_at_most_max_streams_per_ip_to_one_address():
    """One address (a relay-key holder's machine) cannot take every stream: past max_streams_per_ip its next
    fetch is answered `unavailable` (the child repairs elsewhere); another stream ending frees the slot."""
    signer = Signer()
    src = RelayNode(TOKEN, node_id=SOURCE, max_streams_per_ip=1, stall_timeout_s=3.0)
    data1, data2 = os.urandom(4 * (64 << 10)), os.urandom(4 * (64 << 10))
    m1, m2 = build_manifest(data1, 1, 64 << 10, signer), build_manifest(data2, 2, 64 << 10, signer)
    src.publish(m1, data1)  # version 2 is not there yet: a fetch of it holds its stream while it waits
    up = [Upstream(SOURCE, src.host, src.port, src.fingerprint)]
    waiting, second, third = (RelayNode(TOKEN, node_id=f"child{i}") for i in range(3))
    try:
        holder = threading.Thread(target=waiting.fetch, args=(m2, up), daemon=True)
        holder.start()
        assert wait(lambda: src.streams == 1, 5)
        refused = second.fetch(m1, up)
        assert not refused.ok and src.streams == 1
        holder.join(30)
        assert wait(lambda: src.streams == 0, 5)
        served = third.fetch(m1, up)
        assert served.ok and bytes(third.assembly(1).view) == data1
    finally:
        for node in (waiting, second, third, src):
            node.close()


_BARE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from _peers import make_coordinator
c = make_coordinator()
c.server.heap.every_s = 1.0  # trim as soon as a burst is over (the default waits up to 10 s between trims)
print(json.dumps({"coordinator": c.port}), flush=True)
time.sleep(600)
"""


def _settled_growth(pid: int, before: int, bound_mib: float) -> float:
    """RSS growth over `before` (MiB) once it is under `bound_mib`, or after 30 s (a loaded machine, the whole
    suite on 2 cores, handles the closes and the trims later)."""
    deadline = time.monotonic() + 30.0
    time.sleep(3.0)  # closed, counted, trimmed: within 3 s on a quiet machine
    while (growth := (_rss_kib(pid) - before) / 1024) >= bound_mib and time.monotonic() < deadline:
        time.sleep(0.5)
    return growth


def _bursts(port: int, n: int) -> None:
    for _ in range(n // 250):
        idle = _idle(port, 250)
        time.sleep(1.5)  # accepted: each in its TLS handshake
        for s in idle:
            s.close()
        time.sleep(0.5)


def test_1000_idle_connections_opened_and_closed_leave_a_bare_coordinator_as_it_was():
    """Issue 34: a bare coordinator kept ~70 KiB per closed idle connection (+44 to +73 MiB after 1000). Nothing leaked:
    OpenSSL's per-connection buffers were freed, and glibc kept the pages. The coordinator now trims the heap after
    bursts of closed connections (server.HeapTrim). After a warm-up burst, 1000 idle connections (4 bursts of 250)
    leave a high-water mark that the heap's fragmentation keeps, and 1000 more add little to it: memory does not
    grow with connections. Measured (first 1000, next 1000): quiet +3.9/+0.6 and +7.6/-2.5 MiB; under the whole
    suite on 2 cores +8.1/+10.5 (slower handshakes, more of them in flight at once), and in CI +24.9/-11.5 (trimmed
    only after the first 20 s); trim off, quiet +7.8/+6.4. Bursts of 250 after a warm-up do not reach the one-burst
    high-water mark of the original finding, so this guards against a per-connection leak (1000 x ~70 KiB = +68 MiB,
    2000: +137 MiB) more than it measures the trim: the bounds leave room for a loaded machine's late trims."""
    here = os.path.dirname(__file__)
    p = subprocess.Popen([sys.executable, "-c", _BARE, here], stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(p.stdout.readline())["coordinator"]
        _bursts(port, 250)  # warm-up: the first handshakes' one-time allocations, the first trim and its thread
        time.sleep(3.0)
        before = _rss_kib(p.pid)
        _bursts(port, 1000)
        first = _settled_growth(p.pid, before, 16)
        mid = _rss_kib(p.pid)
        _bursts(port, 1000)
        more = _settled_growth(p.pid, mid, 8)
        print(json.dumps({"measure": "idle_connections_rss_growth_mib", "connections": [1000, 1000],
                          "growth_mib": [round(first, 1), round(more, 1)]}))
        assert first < 40, first  # was +44 to +73 MiB, and more with more connections (a leak: +68 MiB)
        assert first + more < 48, (first, more)  # 2000 connections: no per-connection growth (a leak: +137 MiB)
    finally:
        p.kill()
        p.wait(10)
