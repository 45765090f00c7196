"""Fuzz: seeded mutated frames against the coordinator's port and a relay port, before and after authentication,
while a real worker (tiny-random, hf backend) rolls out. Every frame's fate is observed on its connection and
matched against the servers' counters; both servers stay up and the worker is served throughout.

ECHO2_FUZZ_FRAMES (default 4000) and ECHO2_FUZZ_SEED (default 14) set the volume and the seed; the
figures print as one JSON line (`pytest -s`). Frames are built by tests/security/_fuzz.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from _fuzz import Mutator, examples, fit, judge_control, judge_hello, plain, prefix_lie, seal
from _peers import TOKEN, Client, wait

from echo2sdk.core.broadcast.manifest import Signer, build_manifest
from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import pack
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.trust.admission import Admission
from echo2sdk.runtime.coordinator import FROM_WORKER, Coordinator
from echo2sdk.runtime.protocol.groups import MAX_PUSH_BYTES
from echo2sdk.runtime.protocol.messages import Challenge, Fetch, Hello, Trajectories, parse, to_header
from echo2sdk.runtime.broadcast.relay import RelayNode, Upstream
from echo2sdk.runtime.trust.session import FrameKey
from echo2sdk.runtime.trust.tls import client_context, peer_fingerprint
from echo2sdk.runtime.protocol.wire import MAX_WORKER_HEADER, PREAUTH_MAX_HEADER, PREFIX_BYTES, TAG_BYTES, read_frame
from echo2sdk.testing import ToyAdapter

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

FRAMES = int(os.environ.get("ECHO2_FUZZ_FRAMES", "4000"))
SEED = int(os.environ.get("ECHO2_FUZZ_SEED", "14"))
LANES = 8  # concurrent fuzzing connections
GROUP = 2
HELLO_IP, SESSION_IP = "127.0.0.2", "127.0.0.3"  # the real worker and the test's own fetches use 127.0.0.1
REPLIES = {"get_tasks": "tasks", "trajectories": "ack", "get_base": "base_files"}  # the rest get no answer
WORKER_CONFIG = {"model": "tiny-random", "adapter": "toy", "backend": "hf", "backend_options": {"threads": 1},
                 "group_size": GROUP, "tasks_per_request": 2, "sampling": {"max_new_tokens": 8}}
VOCAB = 49152  # tiny-random has SmolLM2's tokenizer

# what each connection or frame gets: before authentication (a hello, a relay fetch), and within a session
PREAUTH_KINDS = {"semantic": 45, "raw": 15, "bad_tag": 8, "wrong_key": 4, "prefix": 12, "plain": 4, "garbage": 4,
                 "cut": 5, "not_tls": 3}
CONTROL_KINDS = {"valid": 88, "semantic": 6, "raw": 2, "bad_tag": 0.6, "replay": 0.6, "reorder": 0.6,
                 "reflect": 0.4, "prefix": 1.2, "plain": 0.3, "cut": 0.3, "payload": 0.6}


@dataclass
class Tally:
    budget: int
    sent: int = 0
    fates: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    pushed: int = 0  # records in acknowledged, non-duplicate pushes
    accepted: int = 0
    unexpected: list[str] = field(default_factory=list)

    def take(self, kind: str) -> bool:
        if self.sent >= self.budget:
            return False
        self.sent += 1
        self.kinds[kind] += 1
        return True

    def wrong(self, detail: str) -> None:
        self.fates["unexpected"] += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(detail)


@dataclass
class Ctx:
    coord: Coordinator
    relay: RelayNode
    examples: dict[str, dict[str, Any]]
    done: bool = False


def pick(mu: Mutator, weights: dict[str, float]) -> str:
    return mu.rng.choices(list(weights), list(weights.values()))[0]


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 5)
    except (OSError, TimeoutError):
        pass


# -- before authentication: one frame per connection ------------------------------------------------------
def preauth_frame(mu: Mutator, kind: str, valid: dict[str, Any], key: FrameKey) -> bytes:
    r = mu.rng
    if kind == "semantic":
        return seal(pack(mu.header(valid) if r.random() < 0.85 else valid), key, 0)
    if kind == "raw":
        return seal(mu.raw(pack(valid)), key, 0)
    if kind == "bad_tag":
        f = bytearray(seal(pack(valid), key, 0))
        f[PREFIX_BYTES + r.randrange(TAG_BYTES)] ^= 1 << r.randrange(8)
        return bytes(f)
    if kind == "wrong_key":
        return seal(pack(valid), FrameKey(r.randbytes(32)), 0)
    if kind == "prefix":
        return prefix_lie(seal(pack(valid), key, 0), r)
    if kind == "plain":
        return plain(pack(valid))
    if kind == "garbage":
        return r.randbytes(r.randint(PREFIX_BYTES, 300))
    return seal(pack(valid), key, 0)  # cut


async def _garbage(mu: Mutator, port: int) -> None:
    """Bytes that are not TLS, to a TLS port, then gone (the server fails the handshake or waits for the rest
    of a record it was promised; either way it sees the connection close)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(HELLO_IP, 0))
    writer.write(mu.rng.randbytes(mu.rng.randint(1, 300)))
    await _close(writer)


async def preauth_job(mu: Mutator, t: Tally, ctx: Ctx, relay: bool) -> None:
    """A hello to the coordinator or a fetch to the relay: refused, or answered as a valid one must be."""
    kind = pick(mu, PREAUTH_KINDS)
    if not t.take(kind):
        return
    port = ctx.relay.port if relay else ctx.coord.port
    where = "relay" if relay else "coordinator"
    if kind == "not_tls":
        await _garbage(mu, port)
        t.fates[f"{where}_not_tls"] += 1
        return
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(), local_addr=(HELLO_IP, 0))
    try:
        fp = peer_fingerprint(writer.get_extra_info("ssl_object"))
        challenge = parse((await read_frame(reader))[0], (Challenge,))
        purpose = session.RELAY if relay else session.CONTROL
        key = session.hello_key(TOKEN, purpose, challenge.nonce, fp)
        r = mu.rng
        valid = to_header(Fetch(node_id=f"fz{r.getrandbits(32):x}", nonce=r.randbytes(32), version=r.choice((1, 1, 2)),
                                start=r.choice((0, 1, 2, 7))) if relay else
                          Hello(nonce=r.randbytes(32), worker_id=f"fzh-{r.getrandbits(48):x}",
                                session=f"{r.getrandbits(40):x}"))
        frame = preauth_frame(mu, kind, valid, key)
        if kind == "cut":
            writer.write(frame[: r.randrange(len(frame))])
            t.fates[f"{where}_cut"] += 1
            return
        frame = fit(frame, max_header=PREAUTH_MAX_HEADER, relay=relay, rng=r)
        msg = judge_hello(frame, key, Fetch if relay else Hello)
        writer.write(frame)
        await writer.drain()
        answer = await _preauth_answer(reader, msg, challenge.nonce, fp, frame, purpose)
        served = ("chunk", "unavailable", "eof")  # a fetch past the last chunk is closed at once
        expected = "refused" if msg is None else "welcome" if not relay else answer if answer in served else served
        if answer != expected:
            t.wrong(f"{where} {kind}: expected {expected}, got {answer} for {frame[:120]!r}")
        else:
            t.fates[f"{where}_{'refused' if msg is None else 'served' if relay else 'welcome'}"] += 1
    finally:
        await _close(writer)


async def _preauth_answer(reader, msg, nonce: bytes, fp: bytes, frame: bytes, purpose: bytes) -> str:
    """The type of the server's first frame (`eof` when it closed without one); a sealed one is checked."""
    try:
        if msg is None:
            return (await asyncio.wait_for(read_frame(reader), 30))[0]["type"]
        keys = session.derive(TOKEN, purpose, nonce, msg.nonce, fp, frame[PREFIX_BYTES + TAG_BYTES:], server=False)
        header, _ = await asyncio.wait_for(read_frame(reader, 1 << 20, key=keys.recv, max_header=1 << 20), 30)
        return header["type"]
    except asyncio.IncompleteReadError as e:
        return "eof" if not e.partial else f"cut answer {e.partial[:40]!r}"


# -- after authentication: a session of frames until one is fatal ------------------------------------------
def valid_header(mu: Mutator, ctx: Ctx, wid: str, batches: list[str]) -> tuple[dict[str, Any], bytes]:
    """A well-formed worker message and its payload (a push's records may still be bad: those are rejected, not
    fatal)."""
    r = mu.rng
    sent_by_workers = {c.model_fields["type"].default for c in FROM_WORKER}
    kinds = [k for k in ("trajectories", "get_tasks", "heartbeat", "installed", "received", "snapshot_rejected",
                         "get_base") if k in ctx.examples and k in sent_by_workers]
    kind = r.choices(kinds, [35, 25, 20, 7, 7, 3, 3][: len(kinds)])[0]
    h, payload = dict(ctx.examples[kind]), b""
    if kind == "get_tasks":
        h.update(n=r.choice((1, 1, 2, 3, 8, 64, 1024)), rid=r.getrandbits(62))
    elif kind == "trajectories":
        batch = r.choice(batches) if batches and r.random() < 0.05 else f"b{r.getrandbits(40):x}"
        batches.append(batch)
        push = mu.groups(GROUP, wid)
        h, payload = to_header(Trajectories.of(push, rid=r.getrandbits(62), batch=batch)), push.payload
    return h, payload


def control_frame(mu: Mutator, kind: str, raw: bytes, payload: bytes, keys: session.Session, seq: int,
                  history: list[bytes]) -> bytes:
    r = mu.rng
    if kind == "bad_tag":
        f = bytearray(seal(raw, keys.send, seq, payload))
        f[PREFIX_BYTES + r.randrange(TAG_BYTES)] ^= 1 << r.randrange(8)
        return bytes(f)
    if kind == "replay":
        return r.choice(history) if history else seal(raw, keys.send, seq + 1, payload)
    if kind == "reorder":
        return seal(raw, keys.send, seq + r.choice((1, 2)), payload)
    if kind == "reflect":  # the server's own direction key: a frame sent back to its sender
        return seal(raw, keys.recv, seq, payload)
    if kind == "prefix":
        return prefix_lie(seal(raw, keys.send, seq, payload), r)
    if kind == "plain":
        return plain(raw, payload)
    if kind == "payload":  # the payload changed after its SHA-256 was sealed in the header
        return seal(raw, keys.send, seq, mu.payload_lie(payload))
    return seal(raw, keys.send, seq, payload)  # valid, semantic, raw, cut


def framed(mu: Mutator, kind: str, raw: bytes, payload: bytes, c: Client, seq: int,
           history: list[bytes]) -> tuple[bytes, Any]:
    """The fitted frame number `seq` of this kind, and the message the coordinator takes from it (None: fatal)."""
    frame = fit(control_frame(mu, kind, raw, payload, c.keys, seq, history), max_header=MAX_WORKER_HEADER,
                max_payload=MAX_PUSH_BYTES, rng=mu.rng)
    return frame, judge_control(frame, c.keys.send, seq, FROM_WORKER)


async def session_job(mu: Mutator, t: Tally, ctx: Ctx) -> None:
    if t.sent >= t.budget:
        return
    wid = f"fzs-{mu.rng.getrandbits(48):x}"
    c = await Client.join(ctx.coord.port, worker_id=wid, session=wid, local=SESSION_IP)
    try:
        if c.answer.get("type") != "welcome":
            t.wrong(f"session join: {c.answer}")
            return
        await _session(mu, t, ctx, c, wid)
    finally:
        await c.close()


async def _session(mu: Mutator, t: Tally, ctx: Ctx, c: Client, wid: str) -> None:
    seq, history, batches, unconfirmed = 0, [], [], 0
    for _ in range(mu.rng.randint(1, 60)):
        kind = pick(mu, CONTROL_KINDS)
        if not t.take(kind):
            break
        valid, payload = valid_header(mu, ctx, wid, batches)
        header = mu.header(ctx.examples[mu.rng.choice(list(ctx.examples))]) if kind == "semantic" else valid
        if kind == "semantic" and mu.rng.random() < 0.5:
            payload = b""  # a mutated header with the push's payload, or with none
        raw = mu.raw(pack(valid)) if kind == "raw" else pack(header)
        if kind == "cut":
            frame = control_frame(mu, kind, raw, payload, c.keys, seq, history)
            c.writer.write(frame[: mu.rng.randrange(len(frame))])
            t.fates["session_cut"] += 1
            return
        frame, msg = framed(mu, kind, raw, payload, c, seq, history)
        if unconfirmed and msg is None:  # the silent frames before a fatal one were taken: confirm them first
            seq, unconfirmed = await _probe(t, c, seq), 0
            frame, msg = framed(mu, kind, raw, payload, c, seq, history)
        c.writer.write(frame)
        if msg is None:
            await _expect_close(t, c, kind, frame)
            return
        seq, history = seq + 1, [*history[-8:], frame]
        if msg.type not in REPLIES:
            t.fates["session_silent"] += 1
            unconfirmed += 1
        elif not await _answered(t, ctx, c, wid, msg):
            return
    if unconfirmed:
        await _probe(t, c, seq)


async def _answered(t: Tally, ctx: Ctx, c: Client, wid: str, msg) -> bool:
    """Read the answer to `msg`; False when the connection ended (a quarantined worker's push)."""
    try:
        reply = await asyncio.wait_for(c.recv(), 30)
    except TimeoutError:
        t.wrong(f"{msg.type}: neither answered nor closed within 30 s ({str(msg)[:300]})")
        return False
    except (asyncio.IncompleteReadError, ConnectionError):
        if msg.type == "trajectories" and wid in ctx.coord.quarantined:
            t.fates["session_quarantined"] += 1
        else:
            t.wrong(f"{msg.type}: the connection ended instead of an answer ({str(msg)[:200]})")
        return False
    if reply["type"] != REPLIES[msg.type] or reply.get("rid", None) != getattr(msg, "rid", None):
        t.wrong(f"{msg.type}: answered {reply['type']} rid {reply.get('rid')}")
    elif msg.type == "trajectories" and not reply["duplicate"]:
        t.pushed += sum(msg.groups)
        t.accepted += reply["accepted"]
    t.fates["session_answered"] += 1
    return True


async def _probe(t: Tally, c: Client, seq: int) -> int:
    """A get_tasks that confirms the frames before it were taken (counted as a frame of its own)."""
    t.sent += 1
    t.kinds["probe"] += 1
    c.writer.write(seal(pack({"type": "get_tasks", "n": 1, "rid": seq}), c.keys.send, seq))
    try:
        reply = await asyncio.wait_for(c.recv(), 30)
        ok = reply["type"] == "tasks" and reply["rid"] == seq
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
        ok, reply = False, repr(e)
    if ok:
        t.fates["session_answered"] += 1
    else:
        t.wrong(f"probe after silent frames: {reply}")
    return seq + 1


async def _expect_close(t: Tally, c: Client, kind: str, frame: bytes) -> None:
    try:
        rest = await asyncio.wait_for(c.reader.read(), 30)
    except ConnectionError:
        rest = b""
    except TimeoutError:
        t.wrong(f"{kind}: a frame that must close the connection left it open for 30 s: {frame[:120]!r}")
        return
    if rest:
        t.wrong(f"{kind}: answered {rest[:60]!r} to a frame that must close the connection: {frame[:120]!r}")
    else:
        t.fates["session_fatal"] += 1


# -- the run ---------------------------------------------------------------------------------------------
async def lane(i: int, t: Tally, ctx: Ctx) -> None:
    mu = Mutator(SEED * 1000 + i)
    while t.sent < t.budget:
        job = mu.rng.choices(("hello", "session", "fetch"), (1, 1, 1))[0]  # a session averages ~8 frames
        coro = session_job(mu, t, ctx) if job == "session" else preauth_job(mu, t, ctx, relay=job == "fetch")
        try:
            await asyncio.wait_for(coro, 60)
        except Exception as e:  # noqa: BLE001 - any failure of the exchange is a finding
            t.wrong(f"lane {i} {job}: {e!r}")


async def fuzz(t: Tally, ctx: Ctx, mark) -> list[dict[str, Any]]:
    marks = [await asyncio.to_thread(mark, t)]
    lanes = asyncio.gather(*(lane(i, t, ctx) for i in range(LANES)))
    for q in (1, 2, 3):
        while t.sent < t.budget * q / 4:
            await asyncio.sleep(0.2)
        marks.append(await asyncio.to_thread(mark, t))
    await lanes
    marks.append(await asyncio.to_thread(mark, t))
    return marks


@pytest.fixture
def quiet():
    """Every refusal and protocol error is logged; at this volume that is noise (counters are checked)."""
    logger = logging.getLogger("echo2sdk")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.mark.slow
def test_fuzzed_frames_are_each_accounted_for_and_a_real_worker_is_served_throughout(tmp_path, quiet):
    generous = dict(fail_burst=10**9)  # no rate limit: every bad frame reaches the checks (test_bounds tests it)
    coord = Coordinator(buffer=StalenessBuffer(staleness=2, group_size=GROUP), tasks=ToyAdapter().tasks(0),
                        worker_config=WORKER_CONFIG, vocab_size=VOCAB, max_len=512, token=TOKEN, heartbeat_s=0.5,
                        worker_timeout_s=60.0, admission=Admission(**generous))
    coord.start()
    loop_errors: list[dict] = []
    coord.server.loop.call_soon_threadsafe(coord.server.loop.set_exception_handler, lambda _, ctx: loop_errors.append(ctx))
    relay = RelayNode(TOKEN, node_id=SOURCE, stall_timeout_s=0.05, admission=Admission(**generous))
    data = os.urandom(2 * 4096)
    manifest = build_manifest(data, 1, 4096, Signer())
    relay.publish(manifest, data)
    refusals: Counter[str] = Counter()  # the relay's reasons by kind, named when a fate was not the expected one
    refuse = relay._gate._refuse
    relay._gate._refuse = lambda e, ip: (refusals.update([f"{type(e).__name__}: {str(e)[:50]}"]), refuse(e, ip))[1]
    child = RelayNode(TOKEN, node_id="child")
    log = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{coord.port}",
                               "--id", "w-real"], env=dict(os.environ, ECHO2_TOKEN=TOKEN), stdout=log,
                              stderr=subprocess.STDOUT)

    def mark(t: Tally) -> dict[str, Any]:
        report = child.fetch(manifest, [Upstream(SOURCE, relay.host, relay.port, relay.fingerprint)])
        w = coord.workers.get("w-real")
        return {"sent": t.sent, "worker_trajectories": w.trajectories if w else 0, "worker_alive": bool(w and w.alive),
                "relay_fetch_ok": report.ok and bytes(child.assembly(1).view) == data}

    try:
        assert wait(lambda: "w-real" in coord.workers and coord.workers["w-real"].trajectories > 0, 240), \
            (tmp_path / "worker.log").read_text()
        before = {"refused": coord.refused, "protocol_errors": coord.protocol_errors,
                  "rejected": sum(coord.rejected.values()), "quarantined": coord.quarantines,
                  "relay_refused": relay.refused, "relay_fetches": relay.fetches}
        t, ctx = Tally(FRAMES), Ctx(coord, relay, examples(GROUP, FROM_WORKER))
        t0 = time.monotonic()
        marks = asyncio.run(fuzz(t, ctx, mark))
        elapsed = time.monotonic() - t0
        settled = wait(lambda: coord.admission.connections() == 1 and relay.admission.connections() == 0, 30)
        real = coord.workers["w-real"]
        got = {"refused": coord.refused - before["refused"],
               "protocol_errors": coord.protocol_errors - before["protocol_errors"],
               "rejected_records": sum(coord.rejected.values()) - before["rejected"] - real.rejected,
               "quarantined": coord.quarantines - before["quarantined"],
               "relay_refused": relay.refused - before["relay_refused"],
               "relay_fetches": relay.fetches - before["relay_fetches"] - len(marks)}  # less the test's own
        print(json.dumps({"measure": "fuzz", "seed": SEED, "lanes": LANES, "frames": t.sent,
                          "elapsed_s": round(elapsed, 1), "loadavg_1m": round(os.getloadavg()[0], 1),
                          "frames_per_s": round(t.sent / elapsed), "fates": dict(t.fates), "kinds": dict(t.kinds),
                          "counters": got, "records_pushed": t.pushed, "records_accepted": t.accepted, "marks": marks}))
        assert t.unexpected == [] and not loop_errors, (t.unexpected, loop_errors[:3], refusals)
        assert t.sent == sum(t.fates.values()) >= FRAMES  # every frame has one observed fate
        f = t.fates
        assert got["refused"] == f["coordinator_refused"]
        assert got["protocol_errors"] == f["session_fatal"]
        assert got["quarantined"] == f["session_quarantined"]
        assert got["rejected_records"] == t.pushed - t.accepted
        assert got["relay_refused"] == f["relay_refused"] and got["relay_fetches"] == f["relay_served"]
        assert coord.server.thread.is_alive() and relay._gate._thread.is_alive() and settled
        # the real worker was served in every quarter of the run, and the relay served a real child
        assert all(b["worker_trajectories"] > a["worker_trajectories"] for a, b in zip(marks, marks[1:])), marks
        assert all(m["worker_alive"] and m["relay_fetch_ok"] for m in marks) and worker.poll() is None
        assert real.rejected == 0 and real.rejoins == 0
    finally:
        worker.kill()
        worker.wait(10)
        log.close()
        child.close()
        relay.close()
        coord.stop()
