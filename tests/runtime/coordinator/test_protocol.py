"""Coordinator <-> worker over real TCP on loopback, with real worker processes (MockBackend, no model)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.coordinator import Coordinator
from echo2sdk.runtime.protocol.groups import encode_groups
from echo2sdk.runtime.protocol.messages import Hello, Trajectories, Welcome, parse, to_header
from echo2sdk.runtime.trust.tls import Identity, client_context, server_context
from echo2sdk.runtime.protocol.wire import MAX_HEADER, read_frame, write_frame
from echo2sdk.testing import ToyAdapter, safetensors_blob

pytestmark = pytest.mark.integration

GROUP = 3
_WORKER_CONFIG = {
    "model": "mock",
    "adapter": "echo2sdk.testing:ToyAdapter",
    "adapter_options": {},
    "backend": "echo2sdk.testing:MockBackend",
    "backend_options": {"answer": "echo"},
    "group_size": GROUP,
    "tasks_per_request": 2,
    "sampling": {"max_new_tokens": 16, "temperature": 1.0, "top_p": 1.0},
}


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def coord():
    buf = StalenessBuffer(staleness=2, group_size=GROUP)
    c = Coordinator(
        buffer=buf,
        tasks=ToyAdapter().tasks(0),
        worker_config=_WORKER_CONFIG,
        vocab_size=256,
        max_len=512,
        token="s3cret",
        heartbeat_s=0.2,
        worker_timeout_s=3.0,
    )
    c.start()
    yield c
    c.stop()


def _spawn(port: int, token: str, wid: str) -> subprocess.Popen:
    env = dict(os.environ, ECHO2_TOKEN=token)
    return subprocess.Popen(  # the backend is registered ("mock"); the toy adapter is allowed by its operator
        [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{port}", "--id", wid,
         "--allow-plugin", "echo2sdk.testing:ToyAdapter"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.kill()
    out, _ = p.communicate(timeout=10)
    return out


def test_worker_process_streams_valid_groups_and_installs_snapshots(coord):
    p = _spawn(coord.port, "s3cret", "w-a")
    try:
        assert _wait(lambda: coord.buffer.ready_groups() >= 2), _stop(p)
        groups = coord.buffer.sample(2)
        for g in groups:
            assert len(g) == GROUP and len({t.meta.group_id for t in g}) == 1
            assert all(t.version == 0 and t.meta.worker == "w-a" for t in g)
            assert all(t.reward in (0.0, 1.0) and len(t.meta.logprobs) == len(t.meta.response_ids) for t in g)
        # publish v1: the worker verifies, installs, acknowledges, and tags later records with v1
        coord.buffer.set_version(1)
        coord.publish(1, safetensors_blob())
        assert _wait(lambda: coord.t_bcast(1)[1] is not None), _stop(p)
        t_q, t_all = coord.t_bcast(1)
        assert 0 <= t_q <= t_all < 30
        assert _wait(lambda: coord.workers["w-a"].version == 1)
        coord.buffer.sample(coord.buffer.ready_groups()) if coord.buffer.ready_groups() else None
        assert _wait(lambda: coord.buffer.ready_groups() >= 1)
        assert {t.version for g in coord.buffer.sample(1) for t in g} == {1}
    finally:
        _stop(p)


def test_t_bcast_counts_the_active_pool_not_idle_standby_workers(coord):
    """A deactivated worker stays registered and still gets the snapshot, but T_bcast (paper §4.2) is the
    time to install on the active pool: a frozen standby worker must not hold `t_bcast_all_s` back."""
    a, b = _spawn(coord.port, "s3cret", "w-a"), _spawn(coord.port, "s3cret", "w-b")
    try:
        assert _wait(lambda: {"w-a", "w-b"} <= set(coord.workers)), _stop(a) + _stop(b)
        assert coord.set_active("w-b", False)
        b.send_signal(signal.SIGSTOP)  # it cannot install anything now
        coord.buffer.set_version(1)
        coord.publish(1, safetensors_blob())
        assert _wait(lambda: coord.t_bcast(1)[1] is not None), _stop(a)
        t_q, t_all = coord.t_bcast(1)
        assert 0 <= t_q <= t_all < 30 and coord.workers["w-b"].version == 0
    finally:
        b.send_signal(signal.SIGCONT)
        _stop(a), _stop(b)


def test_wrong_token_is_refused_and_logged(coord, caplog):
    p = _spawn(coord.port, "wrong-token", "intruder")
    out = _stop(p) if p.wait(timeout=60) is not None else ""
    assert p.returncode == 2
    assert "refused" in out and "wrong token" in out
    assert coord.refused == 1 and "intruder" not in coord.workers


class _Client:
    """A hand-driven worker connection: TLS, the token handshake, then sealed frames."""

    def __init__(self, reader, writer, keys, answer):
        self.reader, self.writer, self.keys, self.answer = reader, writer, keys, answer

    @classmethod
    async def join(cls, port: int, token: str = "s3cret", **hello) -> _Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
        fields = {"type": "hello", "nonce": session.new_nonce(), **hello}
        keys, answer, sealed = await session.client_handshake(reader, writer, token, fields)
        client = cls(reader, writer, keys, answer)
        client.sealed = sealed  # whether the answer came sealed (a welcome, or a refusal after a verified hello)
        return client

    async def send(self, header: dict, payload: bytes = b"") -> None:
        await write_frame(self.writer, header, payload, key=self.keys.send)

    async def push(self, groups: list, *, rid: int | None = None, batch: str | None = None) -> None:
        p = encode_groups(groups)
        await self.send(to_header(Trajectories.of(p, rid=rid, batch=batch)), p.payload)

    async def recv(self) -> dict:
        return (await read_frame(self.reader, 0, key=self.keys.recv, max_header=MAX_HEADER))[0]

    async def until(self, kind: str) -> dict:
        while (h := await self.recv())["type"] != kind:
            pass
        return h

    async def close(self) -> None:
        self.writer.close()
        try:  # let the TLS transport finish closing, or its finalizer warns
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        except (OSError, TimeoutError):
            pass


async def _raw_client(port: int, token: str, groups: list) -> dict:
    c = await _Client.join(port, token, worker_id="raw")
    assert c.answer["type"] == "welcome"
    await c.push(groups, rid=7)
    ack = await c.until("ack")
    await c.close()
    return ack


def _record(**over):
    rec = {
        "prompt": "Say echo.",
        "response": "echo",
        "reward": 1.0,
        "version": 0,
        "meta": {"group_id": "g", "prompt_ids": [1, 2], "response_ids": [3, 0], "logprobs": [-0.1, -0.2]},
    }
    meta = over.pop("meta", {})
    rec.update(over)
    rec["meta"] = {**rec["meta"], **meta}
    return rec


def test_bad_trajectories_are_rejected_counted_and_logged(coord, caplog):
    def group(gid, **over):
        return [_record(meta={"group_id": gid, **over.pop("meta", {})}, **over) for _ in range(GROUP)]

    groups = [
        group("nan", reward=math.nan),
        group("mask", meta={"loss_mask": [1, 2]}),
        group("oov", meta={"response_ids": [3, 99999]}),
        group("type", reward="high"),
        group("ok"),
    ]
    ack = asyncio.run(_raw_client(coord.port, "s3cret", groups))
    assert ack["accepted"] == GROUP
    assert list(ack["rejected"]) == ["nan_reward", "out_of_range", "token_out_of_vocab", "schema"]
    assert coord.rejected == {"nan_reward": GROUP, "out_of_range": GROUP, "token_out_of_vocab": GROUP, "schema": GROUP}
    assert coord.buffer.ready_groups() == 1
    text = caplog.text
    assert "field 'reward' = nan" in text and "meta.loss_mask" in text
    assert "field 'meta.response_ids' = 99999" in text and "field 'reward' = 'high'" in text


def test_a_record_claiming_a_version_never_installed_quarantines_its_worker(coord):
    """A version the worker never reported installed is a lie, not bad data (core/audit.py): no ack, the
    connection closes, nothing of it is buffered, and the worker id is refused from then on."""

    async def push_and_rejoin():
        c = await _Client.join(coord.port, "s3cret", worker_id="raw")
        await c.push([[_record(version=5) for _ in range(GROUP)]], rid=7)
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await c.until("ack")
        await c.close()
        again = await _Client.join(coord.port, "s3cret", worker_id="raw")
        await again.close()
        return again.answer, again.sealed

    answer, sealed = asyncio.run(push_and_rejoin())
    assert answer["type"] == "refused" and "quarantined" in answer["reason"] and sealed
    assert "raw" in coord.quarantined and coord.buffer.ready_groups() == 0


def test_records_are_attributed_to_the_authenticated_sender(coord):
    """A record that names no worker is the sender's all the same: quarantine and revocation drop it with the
    sender's own (before, it was filed under the empty name and stayed). One naming another worker is a lie."""
    groups = [[_record(meta={"group_id": "anon"}) for _ in range(GROUP)],
              [_record(meta={"group_id": "own", "worker": "raw"}) for _ in range(GROUP)]]
    ack = asyncio.run(_raw_client(coord.port, "s3cret", groups))
    assert ack["accepted"] == 2 * GROUP and coord.buffer.ready_groups() == 2
    assert coord.buffer.drop_worker("raw") == 2 * GROUP and coord.buffer.ready_groups() == 0

    async def push_as_another():
        c = await _Client.join(coord.port, "s3cret", worker_id="mallory")
        await c.push([[_record(meta={"worker": "raw"})] * GROUP], rid=8)
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await c.until("ack")
        await c.close()

    asyncio.run(push_as_another())
    assert "names worker 'raw'" in coord.quarantined["mallory"] and coord.buffer.ready_groups() == 0


def test_dead_worker_is_dropped_and_others_continue(coord):
    a, b = _spawn(coord.port, "s3cret", "w-a"), _spawn(coord.port, "s3cret", "w-b")
    try:
        assert _wait(lambda: len(coord.alive_workers()) == 2), _stop(a) + _stop(b)
        a.kill()
        assert _wait(lambda: len(coord.alive_workers()) == 1)
        n = coord.workers["w-b"].trajectories
        assert _wait(lambda: coord.workers["w-b"].trajectories > n)
    finally:
        _stop(a), _stop(b)


def test_a_worker_dropped_while_frozen_rejoins_with_its_id_model_and_version(coord):
    """A worker the coordinator dropped as silent (here: SIGSTOP past worker_timeout_s, as on an overloaded
    machine) re-dials when it runs again and re-joins under its id, with its loaded model and installed
    version and its record (counts) carried on; no second worker appears."""
    p = _spawn(coord.port, "s3cret", "w-a")
    out = ""
    try:
        assert _wait(lambda: "w-a" in coord.workers and coord.workers["w-a"].alive), _stop(p)
        coord.buffer.set_version(1)
        coord.publish(1, safetensors_blob())
        assert _wait(lambda: coord.workers["w-a"].version == 1), _stop(p)
        before = coord.workers["w-a"].trajectories
        assert before > 0 or _wait(lambda: coord.workers["w-a"].trajectories > 0)
        p.send_signal(signal.SIGSTOP)
        assert _wait(lambda: not coord.workers["w-a"].alive, timeout=15)
        p.send_signal(signal.SIGCONT)
        assert _wait(lambda: coord.workers["w-a"].alive and coord.workers["w-a"].rejoins == 1), _stop(p)
        assert set(coord.workers) == {"w-a"}
        info = coord.workers["w-a"]
        assert info.version == 1 and info.trajectories >= before
        n = info.trajectories
        assert _wait(lambda: coord.workers["w-a"].trajectories > n)
        coord.buffer.sample(coord.buffer.ready_groups())
        assert _wait(lambda: coord.buffer.ready_groups() >= 1)
        assert {t.version for g in coord.buffer.sample(1) for t in g} == {1}
    finally:
        p.send_signal(signal.SIGCONT)
        out = _stop(p)
    assert "re-joined" in out and "lost the coordinator" in out


async def _hello(port: int, worker_id: str, sess: str) -> tuple[_Client, str]:
    c = await _Client.join(port, worker_id=worker_id, session=sess)
    return c, c.answer["worker_id"]


def test_a_taken_id_is_renamed_unless_the_same_process_rejoins(coord):
    async def scenario():
        c1, id1 = await _hello(coord.port, "gpu-1", "aaaa")
        c2, id2 = await _hello(coord.port, "gpu-1", "bbbb")  # a namesake: another process
        c3, id3 = await _hello(coord.port, "gpu-1", "aaaa")  # the first process again
        try:
            first_closed = await asyncio.wait_for(c1.reader.read(), 5) == b""  # its old connection is dropped
            await asyncio.sleep(0.5)  # the old connection's handler has finished its clean-up by now
            conns = coord.registry.conns.values()
            still_registered = coord.workers["gpu-1"].alive and "gpu-1" in {p.worker_id for p in conns}
        finally:
            for c in (c1, c2, c3):
                await c.close()
        return id1, id2, id3, first_closed, still_registered

    id1, id2, id3, first_closed, still_registered = asyncio.run(scenario())
    assert id1 == "gpu-1" and id2.startswith("gpu-1~") and id3 == "gpu-1"
    assert first_closed and coord.workers["gpu-1"].rejoins == 1
    assert still_registered  # the old connection's clean-up did not unregister the new one


def test_malformed_messages_are_refused_or_counted_never_a_crash(coord, caplog):
    async def scenario():
        odd = await _Client.join(coord.port, worker_id="odd", price_per_hour="cheap")  # the right MAC, a bad field
        refused = odd.answer
        await odd.close()
        bad, _ = await _hello(coord.port, "w-bad", "dddd")
        await bad.send({"type": "get_tasks", "rid": 1, "n": 0})  # out of range, after authentication
        closed = await asyncio.wait_for(bad.reader.read(), 5) == b""
        await bad.close()
        good, _ = await _hello(coord.port, "w-good", "eeee")  # the coordinator serves on
        await good.send({"type": "get_tasks", "rid": 2, "n": 1})
        tasks = await good.until("tasks")
        await good.close()
        return refused, closed, tasks

    refused, closed, tasks = asyncio.run(scenario())
    assert refused == {"type": "refused", "reason": "authentication failed: malformed hello"}
    assert coord.refused == 1 and "odd" not in coord.workers
    assert closed and coord.protocol_errors == 1 and not coord.workers["w-bad"].alive
    assert "get_tasks message: field 'n' = 0" in caplog.text
    assert tasks["type"] == "tasks" and tasks["rid"] == 2 and len(tasks["tasks"]) == 1


def test_a_resent_batch_is_acknowledged_but_admitted_once(coord):
    """A worker that lost its connection before the ack re-sends the batch after re-joining; the coordinator
    knows its id and does not admit the groups twice."""

    async def scenario():
        c, _ = await _hello(coord.port, "w-x", "cccc")
        group = [_record(meta={"group_id": "g1"}) for _ in range(GROUP)]
        acks = []
        for rid in (1, 2):
            await c.push([group], rid=rid, batch="cccc:0")
            acks.append(await c.until("ack"))
        await c.close()
        return acks

    first, second = asyncio.run(scenario())
    assert first["accepted"] == GROUP and not first.get("duplicate")
    assert second["accepted"] == 0 and second["duplicate"] is True
    assert coord.buffer.ready_groups() == 1 and coord.workers["w-x"].trajectories == GROUP


def test_a_batch_whose_push_was_cut_off_is_held_and_pushed_first_after_the_rejoin():
    from echo2sdk.runtime.worker.process import RolloutWorker

    w = RolloutWorker("127.0.0.1:9", "token", worker_id="w-unit")
    sent = []

    async def flaky_request(msg, reply, timeout=60.0, payload=b""):
        sent.append((msg, payload))
        if len(sent) == 1:
            raise ConnectionError("lost")
        return reply(accepted=3)

    w.link.request = flaky_request
    groups = [[_record()] * 3]
    assert asyncio.run(w.loop.push("s:4", groups)) is False and w.loop.held == ("s:4", groups)
    assert asyncio.run(w.loop.push(*w.loop.held)) is True and w.loop.held is None
    assert [m.batch for m, _ in sent] == ["s:4", "s:4"] and sent[1][0].groups == (3,)
    assert sent[0][1] == sent[1][1] and len(sent[1][1]) == sent[1][0].nbytes  # the same payload, re-sent


def test_a_late_joiner_waits_for_the_snapshot_instead_of_generating_stale_records():
    """The learner is at v5 with S = 2: records a new worker generated at its v0 would all be rejected.
    It learns of v5 at join, waits for the snapshot (paced here to ~2 s) and only then generates."""
    import json
    import struct

    from echo2sdk.runtime.broadcast.chain import ChainBroadcast

    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 19], "data_offsets": [0, 2 << 20]}}).encode()
    header += b" " * (-len(header) % 8)
    blob = struct.pack("<Q", len(header)) + header + bytes(2 << 20)
    buf = StalenessBuffer(staleness=2, group_size=GROUP)
    c = Coordinator(buffer=buf, tasks=ToyAdapter().tasks(0), worker_config=_WORKER_CONFIG, vocab_size=256,
                    max_len=512, token="s3cret", heartbeat_s=0.2, worker_timeout_s=10.0,
                    delivery=ChainBroadcast("s3cret", per_peer_bps=1e6))
    c.start()
    c.buffer.set_version(5)
    c.publish(5, blob)
    p = _spawn(c.port, "s3cret", "w-late")
    try:
        assert _wait(lambda: "w-late" in c.workers and c.workers["w-late"].trajectories >= 2 * GROUP), _stop(p)
        assert c.rejected.get("stale", 0) == 0 and c.workers["w-late"].rejected == 0
        assert {t.version for g in c.buffer.sample(c.buffer.ready_groups()) for t in g} == {5}
    finally:
        out = _stop(p)
        c.stop()
    assert "v0 installed, v5 published: waiting for it before generating" in out


def test_a_worker_that_cannot_reach_the_coordinator_says_so_and_exits_1():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{port}", "--connect-timeout-s", "1"],
        env=dict(os.environ, ECHO2_TOKEN="t"), capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert f"cannot reach the coordinator at 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("after", ["nothing listens", "a silent listener took the port"])
def test_a_worker_whose_coordinator_is_gone_for_good_gives_up_after_reconnect_s(after):
    """A coordinator that welcomes the worker, then vanishes (closed connection): the worker re-dials for
    --reconnect-s, says so, and exits 1. Also when something else took the port and accepts without a word
    (CI saw this once: another test's server got the freed port, and the worker sat in a TLS handshake that
    only asyncio's 60 s default ended): no single dial may outlast the re-join window."""

    async def scenario():
        joined = asyncio.Event()
        identity = Identity.generate()

        async def handle(reader, writer):  # knows the token "t": a real coordinator, briefly
            nonce, header, raw, root = await session.server_hello_roots(
                reader, writer, lambda _: [session.token_key("t")], fingerprint=identity.fingerprint)
            hello = parse(header, (Hello,))
            keys = session.derive(root, session.CONTROL, nonce, hello.nonce, identity.fingerprint, raw, server=True)
            welcome = Welcome(worker_id=hello.worker_id, config={"heartbeat_s": 0.2})
            await write_frame(writer, welcome.model_dump(), key=keys.send)
            joined.set()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context(identity))
        port = server.sockets[0].getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{port}", "--relay-only",
            "--reconnect-s", "2", env=dict(os.environ, ECHO2_TOKEN="t"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        await asyncio.wait_for(joined.wait(), 30)
        server.close()
        await server.wait_closed()
        silent, held = None, []
        if after != "nothing listens":
            async def hold(reader, writer):  # accepts, reads, never answers
                held.append(writer)
                await reader.read()

            silent = await asyncio.start_server(hold, "127.0.0.1", port)
        t0 = time.monotonic()
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        waited = time.monotonic() - t0
        if silent is not None:
            assert held, "the worker never dialled the silent listener"
            for w in held:
                w.close()
            silent.close()
        return proc.returncode, out.decode(), waited

    rc, out, waited = asyncio.run(scenario())
    assert rc == 1, out
    assert "lost the coordinator" in out and "could not re-join" in out and "giving up" in out
    assert 1.5 < waited < 15


def test_worker_model_override_serves_its_own_model_not_the_learners_path():
    """`echo2 worker --model`: a worker on another machine serves the folder (or name) it is given, not the
    learner's absolute path or model name from the welcome."""
    from echo2sdk.runtime.protocol.messages import WorkerConfig
    from echo2sdk.runtime.worker.process import RolloutWorker

    cfg = WorkerConfig(model="smollm2-135m", model_path="/nonexistent/learner/path", adapter="toy", backend="mock")
    default = RolloutWorker("127.0.0.1:1", "tok")
    default._setup(cfg)
    assert default.backend.model == "smollm2-135m"  # the learner's path is not a folder here: its model name
    own = RolloutWorker("127.0.0.1:1", "tok", model="my-local-copy")
    own._setup(cfg)
    assert own.backend.model == "my-local-copy"


def test_quarantined_ids_are_bounded_and_all_counted(coord):
    from echo2sdk.core.buffer import MAX_BANNED
    from echo2sdk.runtime.coordinator import KEEP_QUARANTINED

    n = max(KEEP_QUARANTINED, MAX_BANNED) + 10
    for i in range(n):
        coord.quarantine(f"liar-{i}", "test")
    assert coord.quarantines == n == coord.stats()["quarantines"]
    assert len(coord.quarantined) == KEEP_QUARANTINED and f"liar-{n - 1}" in coord.quarantined
    assert "liar-0" not in coord.quarantined and len(coord.buffer._banned) == MAX_BANNED


def test_a_typed_worker_config_is_taken_as_given_when_it_agrees_with_the_coordinator():
    """The trainer's builder hands a complete WorkerConfig: taken as it is, once its S is the buffer's and its
    heartbeat the coordinator's (else a ConfigError naming the field and both values); a plain mapping (hand-built
    coordinators) is validated and completed with them."""
    from echo2sdk.errors import ConfigError
    from echo2sdk.runtime.protocol.messages import WorkerConfig

    def make(config):
        return Coordinator(buffer=StalenessBuffer(staleness=2, group_size=GROUP), tasks=iter(()), worker_config=config,
                           vocab_size=256, max_len=512, token="s3cret", heartbeat_s=0.5, tls=False)

    typed = WorkerConfig.from_mapping(_WORKER_CONFIG, staleness=2, heartbeat_s=0.5)
    assert make(typed).worker_config is typed
    completed = make(_WORKER_CONFIG).worker_config
    assert completed == typed and (completed.staleness, completed.heartbeat_s) == (2, 0.5)
    with pytest.raises(ConfigError, match=r"staleness is 3, but the buffer's S is 2"):
        make(typed.model_copy(update={"staleness": 3}))
    with pytest.raises(ConfigError, match=r"staleness is None, but the buffer's S is 2"):
        make(WorkerConfig.from_mapping(_WORKER_CONFIG, heartbeat_s=0.5))
    with pytest.raises(ConfigError, match=r"heartbeat_s is 1.0, but the coordinator's heartbeat_s is 0.5"):
        make(typed.model_copy(update={"heartbeat_s": 1.0}))
