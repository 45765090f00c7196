"""Bounded intake: every number an authenticated worker sends is finite and bounded before the learner sees it.
Each bad value is rejected, counted by reason and logged with its field; bad heartbeats close the connection."""

from __future__ import annotations

import asyncio
import math

import pytest
from _peers import TOKEN, Client, make_coordinator, wait

from echo2sdk.core.records import Trajectory, pack, unpack
from echo2sdk.errors import TrajectoryRejected
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.protocol.messages import Hello
from echo2sdk.runtime.trust.tls import client_context

pytestmark = pytest.mark.integration

GROUP = 2  # make_coordinator's buffer: group_size=2, vocab 256, max_len 64


def record(**over):
    """A good wire record (version 0: the coordinator's learner is at v_t = 0); `meta` updates the meta map."""
    meta = {"group_id": "g", "prompt_ids": [1, 2], "response_ids": [3, 4], "logprobs": [-0.1, -0.2],
            **over.pop("meta", {})}
    return {"prompt": "Say echo.", "response": "echo", "reward": 1.0, "version": 0, "meta": meta, **over}


def group(gid: str, **over):
    meta = over.pop("meta", {})
    return [record(meta={"group_id": gid, **meta}, **over) for _ in range(GROUP)]


#: (group id, what is wrong, the reason it is counted under, the field the log names)
BAD = [
    ("huge-reward", dict(reward=1e308), "reward_out_of_range", "'reward' = 1e+308"),
    ("str-reward", dict(reward="0.1"), "schema", "'reward' = '0.1'"),
    ("bool-reward", dict(reward=True), "schema", "'reward' = True"),
    ("mask-two", dict(meta={"loss_mask": [2, 0]}), "out_of_range", "'meta.loss_mask.0' = 2"),
    ("extra-nan", dict(meta={"extra": {"score": math.nan}}), "non_finite", "'meta.extra.score' = nan"),
    ("extra-huge", dict(meta={"extra": {"score": 1e308}}), "out_of_range", "'meta.extra.score' = 1e+308"),
    ("extra-long", dict(meta={"extra": {"note": "x" * 5000}}), "out_of_range", "'meta.extra.note'"),
    ("logprob-low", dict(meta={"logprobs": [-1e30, -0.1]}), "out_of_range", "'meta.logprobs.0' = -1e+30"),
    ("logprob-inf", dict(meta={"logprobs": [-math.inf, -0.1]}), "non_finite", "'meta.logprobs.0' = -inf"),
    # max_len 64: text beyond 64 characters per token of it (4096) is no decoded response (issue 34)
    ("text-long", dict(response="x" * 4097), "text_too_long", "'response' = '4097 characters'"),
    ("chat-many", dict(prompt=[{"role": "user", "content": ""}] * 65), "text_too_long", "'prompt' = '65 messages'"),
]


async def _push(port: int, groups: list, wid: str = "bad") -> dict:
    c = await Client.join(port, worker_id=wid)
    try:
        await c.push(groups, rid=1, batch="b1")
        return await c.recv()
    finally:
        await c.close()


def test_every_bad_number_is_rejected_counted_and_named(loop, caplog):
    coord = make_coordinator()
    try:
        ack = loop.run(_push(coord.port, [group(gid, **over) for gid, over, _, _ in BAD] + [group("ok")]))
    finally:
        coord.stop()
    assert ack["accepted"] == GROUP  # the good group, only
    assert list(ack["rejected"]) == [reason for _, _, reason, _ in BAD]
    expected: dict[str, int] = {}
    for _, _, reason, _ in BAD:
        expected[reason] = expected.get(reason, 0) + GROUP
    assert coord.rejected == expected and coord.workers["bad"].rejected == GROUP * len(BAD)
    assert coord.buffer.ready_groups() == 1
    for _, _, _, named in BAD[:8]:  # the first 8 rejections of a push are logged one by one
        assert f"field {named}" in caplog.text, named
    assert f"{len(BAD) - 8} more group(s) of the same push rejected" in caplog.text


def test_the_reward_bound_is_the_buffers_and_0_1_as_a_string_is_no_reward():
    from echo2sdk.core.buffer import StalenessBuffer

    def wire(**over):  # as the coordinator receives it (msgpack arrays decode as tuples)
        return unpack(pack(record(**over)))

    buf = StalenessBuffer(staleness=2, group_size=1, reward_bound=10.0)
    buf.add_group([Trajectory.from_wire(wire(reward=-10.0))], vocab_size=256, max_len=64)
    with pytest.raises(TrajectoryRejected, match=r"reward_out_of_range.*'reward' = 10.5.*learner.reward_bound = 10"):
        buf.add_group([Trajectory.from_wire(wire(reward=10.5, meta={"group_id": "h"}))], vocab_size=256, max_len=64)
    with pytest.raises(TrajectoryRejected, match=r"\(schema\).*'reward' = '0.1'"):
        Trajectory.from_wire(wire(reward="0.1"))
    assert Trajectory.from_wire(wire(reward=3)).reward == 3  # an int is a real number
    assert buf.stats()["rejected"] == {"reward_out_of_range": 1}


@pytest.mark.parametrize("frame, field", [
    ({"type": "heartbeat", "version": 0, "rollouts_per_s": math.nan}, "rollouts_per_s"),
    ({"type": "heartbeat", "version": 0, "rollouts_per_s": -1.0}, "rollouts_per_s"),
    ({"type": "heartbeat", "version": 0, "rollouts_per_s": 1e400}, "rollouts_per_s"),
    ({"type": "heartbeat", "version": 0, "rollouts_per_s": 1e308}, "rollouts_per_s"),  # two of them: fmean overflows
    ({"type": "heartbeat", "version": 0, "failures": {"adapter_nan": -1}}, "failures.adapter_nan"),
    ({"type": "heartbeat", "version": 0, "failures": {f"r{i}": 1 for i in range(65)}}, "failures"),
])
def test_a_bad_heartbeat_is_counted_and_closes_the_connection_without_touching_the_record(loop, caplog, frame, field):
    coord = make_coordinator()

    async def beat():
        c = await Client.join(coord.port, worker_id="liar", price_per_hour=0.5)
        await c.send({"type": "heartbeat", "version": 0, "rollouts_per_s": 2.0})
        await c.send(frame)
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await asyncio.wait_for(c.recv(), 10)
        await c.close()

    try:
        loop.run(beat())
        assert wait(lambda: coord.protocol_errors == 1)
        info = coord.workers["liar"]
        assert info.rollouts_per_s == 2.0 and info.adapter_failures == {} and not info.alive
    finally:
        coord.stop()
    assert f"field '{field}'" in caplog.text


async def _answer(port: int, **fields) -> dict:
    """The coordinator's answer to a hello holding `fields` as they are (not validated on our side)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
    hello = {**Hello(nonce=session.new_nonce()).model_dump(), **fields}
    _, answer, _ = await session.client_handshake(reader, writer, TOKEN, hello)
    writer.close()
    return answer


@pytest.mark.parametrize("price", [math.nan, -1.0, math.inf, "0.1", 1e308])
def test_a_hello_with_a_bad_price_is_refused(loop, price):
    coord = make_coordinator()
    try:
        answer = loop.run(_answer(coord.port, worker_id="cheat", price_per_hour=price))
    finally:
        coord.stop()
    assert answer["type"] == "refused" and "malformed hello" in answer["reason"]
    assert coord.refused == 1 and "cheat" not in coord.workers


def test_intake_runs_off_the_event_loop_and_a_push_of_1000_bad_groups_is_counted(loop, caplog):
    """~1.2 MB of bad groups: validated and buffered on an executor thread, never on the coordinator's loop
    thread (which keeps serving other workers meanwhile); the log gets 8 lines and one summary, not 1000."""
    import threading

    from echo2sdk.core.buffer import StalenessBuffer

    threads: set[threading.Thread] = set()

    class Watched(StalenessBuffer):  # the real buffer, noting which thread admits
        def add_group(self, records, **kw):
            threads.add(threading.current_thread())
            return super().add_group(records, **kw)

    coord = make_coordinator(buffer=Watched(staleness=2, group_size=GROUP))
    big = [group(f"g{i}", reward=1e308, meta={"response_ids": list(range(3, 63)), "logprobs": [-0.5] * 60})
           for i in range(1000)]
    try:
        ack = loop.run(_push(coord.port, big + [group("ok")], wid="bulk"))
    finally:
        coord.stop()
    assert ack["accepted"] == GROUP and len(ack["rejected"]) == 1000
    assert coord.rejected == {"reward_out_of_range": 2000} and coord.workers["bulk"].trajectories == GROUP
    assert threads and coord.server.thread not in threads
    assert caplog.text.count("reward_out_of_range") == 8 + 1


def test_a_push_of_1024_empty_groups_is_refused_and_counted(loop, caplog):
    """Groups of no record teach nothing and cost the coordinator a rejection each: every one is refused before the
    buffer ("empty_group" in the ack) and counted in the coordinator's empty_groups (summary.json's
    coordinator.empty_groups), not as records (records pushed = accepted + rejected), logged in 8 lines and one."""
    coord = make_coordinator()
    try:
        ack = loop.run(_push(coord.port, [[]] * 1024, wid="hollow"))
        assert ack["accepted"] == 0 and list(ack["rejected"]) == ["empty_group"] * 1024
        assert coord.stats()["empty_groups"] == 1024 and coord.stats()["rejected"] == {}
        assert coord.workers["hollow"].rejected == 0  # records
        assert coord.buffer.stats()["rejected"] == {}  # never reached the buffer
    finally:
        coord.stop()
    assert caplog.text.count("empty_group") == 8 + 1


class _SlowBase:
    """A model folder that counts how often it is read (each read holds the files' bytes in memory)."""

    def __init__(self):
        self.reads = 0

    def message(self):
        import hashlib
        import time

        from echo2sdk.runtime.protocol.messages import BaseFile, BaseFiles

        self.reads += 1
        time.sleep(0.2)
        data = b"{}"
        return BaseFiles(files=(BaseFile(name="config.json", nbytes=2, sha256=hashlib.sha256(data).hexdigest()),)), data

    def weights(self) -> bytes:
        return b"\0" * 16


def test_a_flood_of_get_base_reads_the_base_once_at_a_time(loop):
    """Each get_base reads the model's files (up to 256 MiB) into memory before it is sent: a worker asking
    again while its answer is on the way gets no second read, so 50 asks cannot hold 50 copies."""
    base = _SlowBase()
    c = make_coordinator(base=base)

    async def flood() -> dict:
        client = await Client.join(c.port, worker_id="greedy")
        try:
            from echo2sdk.runtime.protocol.wire import MAX_HEADER, read_frame

            for _ in range(50):
                await client.send({"type": "get_base"})
            return (await read_frame(client.reader, 1 << 20, key=client.keys.recv, max_header=MAX_HEADER))[0]
        finally:
            await client.close()

    try:
        assert loop.run(flood())["type"] == "base_files"
        assert wait(lambda: c.bases_served >= 1)
        assert base.reads == 1, base.reads
    finally:
        c.stop()


@pytest.mark.parametrize("wid", ["w\n2026-12-04 12:00:00 WARNING worker honest quarantined", "w\x1b[2J", "w\r", "w\u2028x"])
def test_a_worker_id_that_would_forge_a_log_line_is_refused(loop, caplog, wid):
    """Worker ids reach run.log (joins, drops, rejections), metrics and the relay plans: a line break or a
    terminal escape in one is a malformed hello, so no log line carries it."""
    coord = make_coordinator()
    try:
        answer = loop.run(_answer(coord.port, worker_id=wid))
    finally:
        coord.stop()
    assert answer["type"] == "refused" and "malformed hello" in answer["reason"]
    assert not coord.workers and wid not in caplog.text


def test_the_versions_a_worker_reported_are_forgotten_with_its_record(loop, monkeypatch):
    """What `installed` reports the audit keeps (core/audit.py: a record's version must be one of them) lives on
    the worker's record: bounded with the registry (KEEP_DEPARTED), not one entry per id and session for ever."""
    from echo2sdk.runtime.coordinator import registry

    monkeypatch.setattr(registry, "KEEP_DEPARTED", 2)
    c = make_coordinator(tls=False)
    c.publish(1, b"\0" * 8)
    assert wait(lambda: c.publications.latest is not None)

    async def come_and_go(wid: str, sess: str) -> None:
        client = await Client.join(c.port, tls=False, worker_id=wid, session=sess)
        await client.send({"type": "installed", "version": 1})
        for _ in range(500):  # read by the coordinator before we leave
            if c.workers[wid].installed:
                break
            await asyncio.sleep(0.01)
        await client.close()

    try:
        for i in range(6):
            loop.run(come_and_go(f"w{i}", f"s{i}"))
            assert wait(lambda: not any(w.alive for w in c.workers.values()))
        loop.run(come_and_go("w7", "s7"))  # one more join: the registry forgets the longest gone
        assert wait(lambda: not any(w.alive for w in c.workers.values()))
        assert len(c.workers) <= 3
        assert all(w.installed == {1} for w in c.workers.values())
        assert "installed" not in c.worker_table()[0]  # internal: not in the run's worker table
    finally:
        c.stop()


def test_worker_table_is_safe_while_the_coordinator_loop_mutates_a_worker():
    """The trainer reads worker_table(), alive_workers() and adapter_failures() from its own thread while the
    coordinator's loop appends to a worker's recent batch ids and failure counts and registers workers; dataclasses.asdict deep-copied the deque mid-append ("deque mutated
    during iteration": a CI failure of test_run_writes_metrics_summary_and_checkpoint)."""
    import sys
    import threading

    from echo2sdk.runtime.coordinator import WorkerInfo

    c = make_coordinator(tls=False)
    w, w1 = WorkerInfo("w0", "127.0.0.1:1"), WorkerInfo("w1", "127.0.0.1:2")
    c.workers["w0"], c.workers["w1"] = w, w1
    stop = threading.Event()

    def churn() -> None:  # and workers joining and leaving: alive_workers / adapter_failures iterate the registry
        i = 0
        while not stop.is_set():
            w.batches.append(f"b{i}")
            w.adapter_failures[f"r{i % 97}"] = i
            w1.adapter_failures[f"r{i % 89}"] = i
            if i % 7 == 0:
                c.workers[f"j{i % 5}"] = WorkerInfo(f"j{i % 5}", "127.0.0.1:3")
            elif i % 7 == 3:
                c.workers.pop(f"j{i % 5}", None)
            i += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible: the race shows within a few calls
    t = threading.Thread(target=churn, daemon=True)
    t.start()
    try:
        for _ in range(3000):
            row = c.worker_table()[0]
            assert row["worker_id"] == "w0" and "batches" not in row and "installed" not in row
            assert len(c.alive_workers()) >= 2 and c.adapter_failures()["groups_dropped"] == 0
    finally:
        stop.set()
        t.join(5)
        sys.setswitchinterval(old)
        c.stop()


def test_a_prompt_longer_than_the_text_bound_is_kept_cut_not_refused(loop):
    """A worker keeps a long document's whole prompt text while its prompt_ids were truncated to fit max_len: the
    record is admitted with the end of its prompt (64 characters per token of max_len 64 = 4096), a chat prompt
    with its newest messages."""
    coord = make_coordinator()
    try:
        text = "a" * 3000 + "b" * 3000
        chat = [{"role": "system", "content": "s" * 3000}, {"role": "user", "content": "u" * 3000}]
        ack = loop.run(_push(coord.port, [group("doc", prompt=text), group("chat", prompt=chat)]))
        assert ack["accepted"] == 2 * GROUP and coord.rejected == {}
        held = {g[0].meta.group_id: g[0].prompt for g in coord.buffer.sample(2)}
    finally:
        coord.stop()
    assert held["doc"] == "a" * 1096 + "b" * 3000
    assert [(m.role, len(m.content)) for m in held["chat"]] == [("system", 1096), ("user", 3000)]


def test_a_record_larger_than_any_admissible_one_is_read_past_not_held(loop):
    """A record over groups.record_limit(max_len) is refused from its size alone: the coordinator reads past it in
    64 KiB slices (hashing them for the push's SHA-256) and never holds it; the next group of the push is admitted."""
    from echo2sdk.runtime.coordinator import intake
    from echo2sdk.runtime.protocol.groups import record_limit

    coord = make_coordinator()
    held: list[int] = []
    read = intake.Intake._read

    async def spy(self, conn, msg, sizes):
        blobs = await read(self, conn, msg, sizes)
        held.extend(len(b) if b is not None else -1 for b in blobs)
        return blobs

    intake.Intake._read = spy
    try:
        huge = "x" * (record_limit(64) + 1)
        ack = loop.run(_push(coord.port, [group("huge", response=huge), group("ok")]))
    finally:
        intake.Intake._read = read
        coord.stop()
    assert ack["accepted"] == GROUP and list(ack["rejected"]) == ["too_long"]
    assert coord.rejected == {"too_long": GROUP} and coord.buffer.ready_groups() == 1
    assert held[:GROUP] == [-1] * GROUP and all(0 < n < 1000 for n in held[GROUP:])  # never held, the rest small


def test_a_stale_group_is_routine_and_stays_off_the_console(loop, caplog):
    """A group generated on a snapshot older than v_t - S is dropped by design: logged at INFO (run.log; `echo2 run`'s
    console shows WARNING and above) and counted; any other reason in the same push is a WARNING."""
    import logging

    caplog.set_level(logging.INFO, logger="echo2sdk")
    coord = make_coordinator()
    try:
        coord.buffer.set_version(5)  # v_t = 5, S = 2: version 0 is stale
        ack = loop.run(_push(coord.port, [group("old"), group("nan", reward=math.nan)]))
    finally:
        coord.stop()
    assert list(ack["rejected"]) == ["stale", "nan_reward"] and coord.rejected["stale"] == GROUP
    levels = {r.levelname for r in caplog.records if "(stale)" in r.getMessage()}
    assert levels == {"INFO"}, caplog.text
    assert {r.levelname for r in caplog.records if "(nan_reward)" in r.getMessage()} == {"WARNING"}
    from echo2sdk.runtime.learner.console import refusals_line

    assert refusals_line(dict(coord.rejected)).startswith(f"records refused at intake: {GROUP} nan_reward, {GROUP} stale (")
    assert refusals_line({}) is None
