"""A worker that stops reading (here: SIGSTOP) while a snapshot is pushed to it delays no other worker, and is
dropped and reported at its write deadline."""

from __future__ import annotations

import json
import signal
import struct
import time

import pytest
from _peers import TOKEN, finish, spawn_worker, wait

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.testing import ToyAdapter

pytestmark = pytest.mark.integration

CONFIG = {"model": "mock", "adapter": "echo2sdk.testing:ToyAdapter", "backend": "mock", "group_size": 2,
          "tasks_per_request": 1, "sampling": {"max_new_tokens": 8}}
WRITE_TIMEOUT_S = 10.0  # the healthy workers install the 48 MiB snapshot in ~0.5 s here: a 20x margin


def _blob(mib: int) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [mib << 18], "data_offsets": [0, mib << 20]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes(mib << 20)


def test_a_worker_that_stops_reading_delays_no_other_and_is_dropped(caplog):
    c = Coordinator(buffer=StalenessBuffer(staleness=4, group_size=2), tasks=ToyAdapter().tasks(0),
                    worker_config=CONFIG, vocab_size=256, max_len=512, token=TOKEN, heartbeat_s=0.2,
                    worker_timeout_s=300.0, write_timeout_s=WRITE_TIMEOUT_S)
    c.start()
    allow = ("--allow-plugin", "echo2sdk.testing:ToyAdapter")
    procs = {w: spawn_worker(c.port, TOKEN, *allow, wid=w) for w in ("stuck", "a", "b")}
    try:
        assert wait(lambda: set(c.workers) == set(procs), 60), [finish(p, 1)[1] for p in procs.values()]
        procs["stuck"].send_signal(signal.SIGSTOP)
        c.buffer.set_version(1)
        t0 = time.monotonic()
        c.publish(1, _blob(48))  # far more than the socket buffers hold
        assert wait(lambda: c.workers["a"].version == 1 and c.workers["b"].version == 1, 60)
        healthy_s = time.monotonic() - t0
        assert c.workers["stuck"].alive and c.stats()["write_timeouts"] == 0  # they did not wait for it
        assert wait(lambda: not c.workers["stuck"].alive, WRITE_TIMEOUT_S + 40)
        dropped_s = time.monotonic() - t0
        print(json.dumps({"measure": "stalled_peer", "snapshot_mib": 48, "healthy_installed_s": round(healthy_s, 2),
                          "stalled_dropped_s": round(dropped_s, 2), "write_timeout_s": WRITE_TIMEOUT_S}))
        assert c.stats()["write_timeouts"] == 1 and f"worker stuck took no data for {WRITE_TIMEOUT_S:.0f} s" in caplog.text
        assert c.workers["a"].alive and c.workers["b"].alive
    finally:
        procs["stuck"].send_signal(signal.SIGCONT)
        for p in procs.values():
            p.kill()
            finish(p, 10)
        c.stop()


def test_a_parent_that_only_sends_keep_alives_is_repaired_around_and_blamed():
    """A relay that knows the key but sends `wait` keep-alives forever, never a chunk: its child gives up on it
    after MAX_WAIT_STALLS stall timeouts without a chunk, fetches from the next upstream node and reports why."""
    import threading

    from echo2sdk.core.broadcast.manifest import Signer, build_manifest
    from echo2sdk.core.broadcast.planner import SOURCE
    from echo2sdk.runtime.protocol.messages import Wait, to_header
    from echo2sdk.runtime.broadcast.relay import RelayNode, Upstream
    from echo2sdk.runtime.protocol.wire import send_frame

    class Stalling(RelayNode):
        def _stream(self, conn, asm, start, key):
            while not self._closed:
                send_frame(conn, to_header(Wait()), key=key)
                time.sleep(0.05)

    data = bytes(range(256)) * 1024
    m = build_manifest(data, 1, 64 << 10, Signer())
    src, evil = RelayNode(TOKEN, node_id=SOURCE), Stalling(TOKEN, node_id="evil")
    child = RelayNode(TOKEN, node_id="child", stall_timeout_s=0.3)
    src.publish(m, data)
    evil.publish(m, data)
    result = {}
    t = threading.Thread(target=lambda: result.update(report=child.fetch(
        m, [Upstream("evil", evil.host, evil.port, evil.fingerprint), Upstream(SOURCE, src.host, src.port, src.fingerprint)])),
        daemon=True)
    try:
        t.start()
        t.join(60)  # a liveness bound: without the cap the fetch waits as long as the keep-alives come
        report = result.get("report")
        assert report is not None, "the child is still waiting on keep-alives"
        assert report.ok and report.parent == SOURCE
        assert [r["parent"] for r in report.repairs] == ["evil"] and report.repairs[0]["reason"].startswith("stalled")
        assert bytes(child.assembly(1).view) == data
    finally:
        for node in (child, evil, src):
            node.close()


def test_a_parent_that_trickles_bytes_is_repaired_around_but_a_slow_honest_one_is_not():
    """A relay that knows the key sends a chunk header, then one byte at a time, each inside the stall timeout:
    the fetch used to wait as long as the bytes came (one 4 MiB chunk: months), holding every worker below it
    and never reporting. Now a chunk frame must be done within stall_timeout_s + chunk_bytes / min_relay_bps:
    the child repairs from the next upstream node and says why. A parent paced at 4x that rate is kept, and the
    last resort (the learner) is never dropped for slowness: a slow link delays a snapshot, never locks it out."""
    import threading

    from echo2sdk.core.broadcast.manifest import Signer, build_manifest
    from echo2sdk.core.broadcast.planner import SOURCE
    from echo2sdk.runtime.protocol.messages import Chunk, to_header
    from echo2sdk.runtime.broadcast.relay import RelayNode, Upstream
    from echo2sdk.runtime.protocol.wire import encode_frame

    class Trickling(RelayNode):
        def _stream(self, conn, asm, start, key):
            data = asm.chunk(start)
            conn.sendall(encode_frame(to_header(Chunk(i=start)), data, key))
            for k in range(data.nbytes):
                if self._closed:
                    return
                conn.sendall(data[k : k + 1])
                time.sleep(0.4)  # well inside the child's 1 s stall timeout

    data = bytes(range(256)) * 4096  # 1 MiB: 4 chunks of 256 KiB
    m = build_manifest(data, 1, 256 << 10, Signer())
    rate = 1 << 20  # the child's floor: 1 MiB/s, so a chunk frame gets 1 + 0.25 s
    src, evil = RelayNode(TOKEN, node_id=SOURCE), Trickling(TOKEN, node_id="evil")
    slow = RelayNode(TOKEN, node_id="slow", per_peer_bps=4 * rate)  # honest, paced at 4 MiB/s
    slow_source = RelayNode(TOKEN, node_id=SOURCE, per_peer_bps=rate / 2)  # the learner, at half the floor
    nodes = [src, evil, slow, slow_source]

    def fetch(name, upstream):
        child = RelayNode(TOKEN, node_id=name, stall_timeout_s=1.0, min_relay_bps=rate)
        nodes.append(child)
        result = {}
        up = [Upstream(n.node_id, n.host, n.port, n.fingerprint) for n in upstream]
        t = threading.Thread(target=lambda: result.update(report=child.fetch(m, up)), daemon=True)
        t0 = time.monotonic()
        t.start()
        t.join(60)
        assert "report" in result, f"{name} is still reading"
        assert bytes(child.assembly(1).view) == data
        return result["report"], time.monotonic() - t0

    try:
        for node in nodes:
            node.publish(m, data)
        report, seconds = fetch("child", [evil, src])
        assert report.ok and report.parent == SOURCE and seconds < 10  # one chunk's allowance + a stall timeout
        assert [r["parent"] for r in report.repairs] == ["evil"]
        assert report.repairs[0]["reason"].startswith("too slow") and report.repairs[0]["chunk"] == 0
        report, _ = fetch("child2", [slow, src])
        assert report.ok and report.parent == "slow" and not report.repairs
        report, seconds = fetch("child3", [slow_source])  # under the floor, but the last resort
        assert report.ok and report.parent == SOURCE and not report.repairs and seconds > 1.5
    finally:
        for node in nodes:
            node.close()
