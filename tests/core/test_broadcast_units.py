"""Chain broadcast building blocks: relay scores and chain assembly (pure), the signed manifest, and the
relay data path between in-process nodes over real loopback sockets."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

from echo2sdk.core.broadcast.manifest import Manifest, Signer, build_manifest, chunk_digest, verify_manifest
from echo2sdk.core.broadcast.planner import (
    DECAY_WINDOW_S,
    FAILURE_THRESHOLD,
    SOURCE,
    WorkerScores,
    plan_chains,
)
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.broadcast.relay import HASH_BLOCK, RelayNode, TokenBucket, Upstream, _recv_hashed
from echo2sdk.runtime.protocol.wire import PREFIX_BYTES, TAG_BYTES, encode_frame, open_frame, recv_frame, send_frame
from echo2sdk.errors import ProtocolError

TOKEN = "relay-secret"
CHUNK = 64 << 10


# -- planner -----------------------------------------------------------------------------------------
def test_score_formula_matches_the_paper_weights():
    s = WorkerScores()
    for _ in range(4):
        s.record_success("fast", 10e6)
    s.record_success("slow", 5e6)
    pool = ["fast", "slow"]
    # fast: Speed 1, Success 4/10, Stability 1, no failure -> 0.5 + 0.35*0.4 + 0.15
    assert s.score("fast", 0.0, pool) == pytest.approx(0.5 + 0.35 * 0.4 + 0.15)
    # slow: Speed 0.5 (EWMA of one sample), Success 0.1
    assert s.score("slow", 0.0, pool) == pytest.approx(0.5 * 0.5 + 0.35 * 0.1 + 0.15)
    # a failure: Stability 2/3 and Decay 0.5 right after it, back to 1 after the window
    s.record_failure("fast", 100.0)
    assert s.score("fast", 100.0, pool) == pytest.approx(0.5 * (0.5 + 0.35 * 0.4 + 0.15 * 2 / 3))
    assert s.score("fast", 100.0 + DECAY_WINDOW_S, pool) == pytest.approx(0.5 + 0.35 * 0.4 + 0.15)


def test_success_saturates_at_ten():
    s = WorkerScores()
    for _ in range(25):
        s.record_success("a", 1e6)
    assert s.score("a", 0.0) == pytest.approx(1.0)


def test_chain_assembly_seeds_are_the_top_ranked_and_the_rest_round_robin():
    plan = plan_chains(["a", "b", "c", "d", "e", "f", "g"], 3)
    assert plan.chains == (("a", "d", "g"), ("b", "e"), ("c", "f"))
    assert plan.upstream("g") == ("d", "a", SOURCE)
    assert plan.upstream("b") == (SOURCE,)
    assert sorted(plan.workers()) == list("abcdefg")


def test_star_is_one_chain_per_worker_and_n_chains_is_capped_by_the_pool():
    star = plan_chains(["a", "b", "c"], 3)
    assert all(star.upstream(w) == (SOURCE,) for w in "abc")
    assert plan_chains(["a", "b"], 8).n_chains == 2


def test_degraded_worker_moves_seed_to_tail_to_rollout_only():
    s = WorkerScores()
    wids = ["w0", "w1", "w2", "w3"]
    for w in wids:
        s.record_success(w, 8e6)
    assert s.rank(wids, 0.0)[0] == "w0"
    s.record_failure("w0", 1.0)  # one failure: no longer a seed
    ranked = s.rank(wids, 1.0)
    assert ranked[-1] == "w0" and not s.rollout_only("w0", 1.0)
    assert plan_chains(ranked, 2).chains[1][-1] == "w0"
    for t in (2.0, 3.0):
        s.record_failure("w0", t)
    assert s.recent_failures("w0", 3.0) == FAILURE_THRESHOLD and s.rollout_only("w0", 3.0)
    plan = plan_chains(s.rank(wids, 3.0), 2, rollout_only={"w0"})
    assert "w0" not in [w for c in plan.chains for w in c]
    assert plan.upstream("w0")[0] in ("w2", "w3")  # hangs off a chain tail: receives, never forwards
    assert not s.rollout_only("w0", 3.0 + DECAY_WINDOW_S)  # the window forgets


def test_plan_rejects_bad_input():
    with pytest.raises(ValueError, match="n_chains"):
        plan_chains(["a"], 0)
    with pytest.raises(ValueError, match="distinct"):
        plan_chains(["a", "a"], 1)
    with pytest.raises(KeyError, match="zz"):
        plan_chains(["a"], 1).upstream("zz")


# -- manifest ------------------------------------------------------------------------------------------
def test_manifest_roundtrip_and_forgeries_are_refused():
    data = os.urandom(5 * CHUNK + 123)
    signer = Signer()
    m = build_manifest(data, 7, CHUNK, signer)
    assert m.n_chunks == 6 and m.span(5) == (5 * CHUNK, len(data))
    back = Manifest.from_wire(m.to_wire())
    verify_manifest(back, signer.public_key)
    with pytest.raises(ProtocolError, match="bad signature"):
        verify_manifest(build_manifest(data, 7, CHUNK, Signer()), signer.public_key)  # someone else's key
    tampered = {**m.to_wire(), "version": 8}
    with pytest.raises(ProtocolError, match="bad signature"):
        verify_manifest(Manifest.from_wire(tampered), signer.public_key)
    swapped = list(m.chunks)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    with pytest.raises(ProtocolError, match="digest"):
        verify_manifest(Manifest.from_wire({**m.to_wire(), "chunks": swapped}), signer.public_key)


def test_a_delta_manifest_signs_its_kind_base_and_root():
    from echo2sdk.runtime.protocol.messages import WireManifest

    data, signer, base, root = os.urandom(2 * CHUNK), Signer(), os.urandom(32), os.urandom(32)
    m = build_manifest(data, 9, CHUNK, signer, kind="delta", base_version=7, base_root=base, root=root)
    back = Manifest.from_wire(WireManifest(**m.to_wire()).model_dump())  # as a worker gets it in a plan
    assert (back.kind, back.base_version, back.base_root, back.root) == ("delta", 7, base, root)
    verify_manifest(back, signer.public_key)
    for field, value in (("kind", "full"), ("base_version", 5), ("base_root", os.urandom(32)), ("root", os.urandom(32))):
        forged = {**m.to_wire(), field: value}
        if field == "kind":
            forged.update(base_version=0, base_root=b"")  # a consistent full manifest, still not the signed one
        with pytest.raises(ProtocolError, match="bad signature"):
            verify_manifest(Manifest.from_wire(forged), signer.public_key)
    full = build_manifest(data, 9, CHUNK, signer, root=root)  # a full snapshot may name its root
    assert Manifest.from_wire(full.to_wire()).root == root and full.kind == "full"


@pytest.mark.parametrize(
    "fields,match",
    [({"kind": "patch"}, "'kind'"), ({"kind": "delta"}, "must name its base's root"),
     ({"kind": "delta", "base_root": b"x" * 32}, "must name its base's root"),
     ({"base_version": 3}, "names no base"), ({"root": b"short"}, "'root'"), ({"base_version": -1}, "'base_version'")],
)
def test_inconsistent_kinds_are_refused_on_the_wire_and_at_build(fields, match):
    m = build_manifest(os.urandom(CHUNK), 1, CHUNK, Signer()).to_wire()
    with pytest.raises(ProtocolError, match=match):
        Manifest.from_wire({**m, **fields})
    with pytest.raises(ValueError, match=match):
        build_manifest(os.urandom(CHUNK), 1, CHUNK, Signer(), **fields)


@pytest.mark.parametrize(
    "field,value,match",
    [("algo", "md5", "'algo'"), ("version", -1, "'version'"), ("chunk_bytes", 16, "chunk_bytes"),
     ("chunks", [b"x"], "'chunks'"), ("total_bytes", 10 * CHUNK, "chunk digests")],
)
def test_malformed_manifest_names_the_field(field, value, match):
    m = build_manifest(os.urandom(2 * CHUNK), 1, CHUNK, Signer()).to_wire()
    with pytest.raises(ProtocolError, match=match):
        Manifest.from_wire({**m, field: value})


# -- relay data path -----------------------------------------------------------------------------------
@pytest.fixture
def nodes():
    made: list[RelayNode] = []

    def make(node_id: str, **kw) -> RelayNode:
        n = RelayNode(TOKEN, node_id=node_id, stall_timeout_s=kw.pop("stall_timeout_s", 2.0), **kw)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()


def _up(n: RelayNode) -> Upstream:
    return Upstream(n.node_id, n.host, n.port, n.fingerprint)


def _fetch_all(chain: list[RelayNode], m: Manifest, upstream_of) -> dict:
    reports: dict = {}
    threads = [
        threading.Thread(target=lambda n=n: reports.__setitem__(n.node_id, n.fetch(m, upstream_of(n))))
        for n in chain
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return reports


@pytest.mark.parametrize("size", [1, HASH_BLOCK - 1, HASH_BLOCK, 3 * HASH_BLOCK + 4097, 1 << 20])
def test_recv_hashed_matches_the_digest_whatever_pieces_tcp_delivers(size):
    """The hasher is fed aligned blocks while TCP hands over odd-sized pieces: same digest as one call."""
    data = os.urandom(size)
    a, b = socket.socketpair()
    rng = random.Random(size)

    def send_in_odd_pieces():
        i = 0
        while i < size:
            n = rng.randint(1, 70_000)
            a.sendall(data[i : i + n])
            i += n

    t = threading.Thread(target=send_in_odd_pieces)
    t.start()
    buf = bytearray(size)
    try:
        assert _recv_hashed(b, memoryview(buf)) == chunk_digest(data)
    finally:
        t.join(10)
        a.close()
        b.close()
    assert bytes(buf) == data


def test_chain_pipelines_identical_bytes(nodes):
    data = os.urandom(40 * CHUNK + 17)
    m = build_manifest(data, 1, CHUNK, Signer())
    src = nodes(SOURCE)
    src.publish(m, data)
    chain = [nodes(f"w{i}") for i in range(4)]
    ups = {n.node_id: [_up(x) for x in reversed([src, *chain[:i]])] for i, n in enumerate(chain)}
    reports = _fetch_all(chain, m, lambda n: ups[n.node_id])
    for i, n in enumerate(chain):
        r = reports[n.node_id]
        assert r.ok and not r.repairs and r.parent == (SOURCE if i == 0 else f"w{i - 1}")
        assert bytes(n.assembly(1).view) == data
    assert src.served_chunks == m.n_chunks  # the learner sent the snapshot once


def test_evicted_buffer_is_reused_by_the_next_version_unless_held(nodes):
    """Snapshots of one run have one size: a node recycles the buffer of an evicted version (already paged
    in) for the next one, but never one a reader still holds."""
    signer, src, node = Signer(), nodes(SOURCE), nodes("w")
    snaps = {v: os.urandom(6 * CHUNK) for v in range(1, 7)}
    manifests = {v: build_manifest(d, v, CHUNK, signer) for v, d in snaps.items()}

    def fetch(v: int):
        src.publish(manifests[v], snaps[v])
        assert node.fetch(manifests[v], [_up(src)]).ok
        asm = node.assembly(v)
        assert bytes(asm.view) == snaps[v]
        return asm

    first, second = fetch(1), fetch(2)
    third = fetch(3)  # keep_versions=2: v1 is evicted and its buffer reused
    assert third.buf is first.buf and node.assembly(1) is None
    with node.hold(3) as held:
        assert held is third
        fourth = fetch(4)
        assert fourth.buf is second.buf
        fifth = fetch(5)  # evicts v3, but a reader holds it: v5 gets a fresh buffer
        assert node.assembly(3) is None and fifth.buf is not third.buf
        assert bytes(held.view) == snaps[3]
    assert third.buf in node._spare  # released: recycled now
    assert fetch(6).buf in (third.buf, fourth.buf)
    with node.hold(99) as missing:
        assert missing is None


def test_an_acquired_snapshot_outlives_eviction_until_released(nodes):
    """A worker acquires its newest snapshot and installs it later, straight from the relay's buffer: newer
    versions may evict it meanwhile, but its bytes stay intact and the buffer is recycled only on release."""
    signer, src, node = Signer(), nodes(SOURCE), nodes("w")
    snaps = {v: os.urandom(5 * CHUNK) for v in range(1, 5)}
    for v in (1, 2):
        m = build_manifest(snaps[v], v, CHUNK, signer)
        src.publish(m, snaps[v])
        assert node.fetch(m, [_up(src)]).ok
    pinned = node.acquire(1)
    assert pinned is not None and node.acquire(99) is None
    for v in (3, 4):  # evicts v1 (and v2)
        m = build_manifest(snaps[v], v, CHUNK, signer)
        src.publish(m, snaps[v])
        assert node.fetch(m, [_up(src)]).ok
        assert node.assembly(v).buf is not pinned.buf
    assert node.assembly(1) is None and bytes(pinned.view) == snaps[1]
    node.release(pinned)
    assert pinned.buf in node._spare


class _CorruptingRelay(RelayNode):
    """A compromised relay: it holds the right bytes but flips one byte of chunk 3 on the wire."""

    def _send_paced(self, conn, data, peer):
        if data.obj is not None and bytes(data[:8]) == bytes(self._bad_prefix):
            data = bytearray(data)
            data[10] ^= 0xFF
            data = memoryview(data)
        super()._send_paced(conn, data, peer)


def test_corrupt_chunk_is_dropped_refetched_reported_and_never_stored(nodes):
    data = os.urandom(8 * CHUNK)
    m = build_manifest(data, 1, CHUNK, Signer())
    src = nodes(SOURCE)
    src.publish(m, data)
    evil = _CorruptingRelay(TOKEN, node_id="evil")
    evil._bad_prefix = data[3 * CHUNK : 3 * CHUNK + 8]
    try:
        evil.publish(m, data)
        child = nodes("child")
        seen: list[int] = []
        r = child.fetch(m, [_up(evil), _up(src)], on_chunk=seen.append)
        assert r.ok and r.bad_chunks == 1
        assert r.repairs[0]["parent"] == "evil" and r.repairs[0]["reason"] == "bad_chunk"
        assert r.repairs[0]["chunk"] == 3 and r.repairs[0]["repair_s"] >= 0
        assert seen == list(range(8))  # chunk 3 became visible once, after the good copy arrived
        assert bytes(child.assembly(1).view) == data
    finally:
        evil.close()


def test_dead_parent_is_repaired_around_from_the_last_verified_chunk(nodes):
    data = os.urandom(32 * CHUNK)
    m = build_manifest(data, 1, CHUNK, Signer())
    src = nodes(SOURCE, per_peer_bps=2e6)  # ~1 s for the whole snapshot, so the kill lands mid-way
    src.publish(m, data)
    mid, tail = nodes("mid"), nodes("tail")
    killer = threading.Thread(target=lambda: (time.sleep(0.4), mid.close()))
    killer.start()
    reports = _fetch_all([mid, tail], m, lambda n: [_up(src)] if n is mid else [_up(mid), _up(src)])
    killer.join()
    r = reports["tail"]
    assert r.ok and r.parent == SOURCE and bytes(tail.assembly(1).view) == data
    (rep,) = r.repairs
    assert rep["parent"] == "mid" and 0 < rep["chunk"] < m.n_chunks and rep["repair_s"] < 2.0
    assert not reports["mid"].ok  # its own copy was abandoned, never complete


def test_stalled_parent_is_detected_and_repaired(nodes):
    data = os.urandom(4 * CHUNK)
    m = build_manifest(data, 1, CHUNK, Signer())
    src = nodes(SOURCE)
    src.publish(m, data)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, then never says a word
    try:
        child = nodes("child", stall_timeout_s=0.5)
        r = child.fetch(m, [Upstream("silent", "127.0.0.1", silent.getsockname()[1]), _up(src)])
        assert r.ok and r.repairs[0]["reason"] == "stalled" and 0.4 < r.repairs[0]["repair_s"] < 3
    finally:
        silent.close()


def test_wrong_token_is_refused_by_a_relay(nodes):
    data = os.urandom(2 * CHUNK)
    m = build_manifest(data, 1, CHUNK, Signer())
    src = nodes(SOURCE)
    src.publish(m, data)
    intruder = RelayNode("wrong-token", node_id="intruder")
    try:
        r = intruder.fetch(m, [_up(src)])
        assert not r.ok and r.repairs[0]["reason"] == "refused" and src.refused == 1
    finally:
        intruder.close()


def test_a_malformed_fetch_is_refused_and_a_parent_speaking_garbage_is_repaired_around(nodes):
    data = os.urandom(2 * CHUNK)
    m = build_manifest(data, 1, CHUNK, Signer())
    src = nodes(SOURCE, tls=False)
    src.publish(m, data)
    with socket.create_connection((src.host, src.port), timeout=5) as s:  # right token, start out of range
        challenge, _ = recv_frame(s, 0)
        key = session.hello_key(TOKEN, session.RELAY, challenge["nonce"], b"")
        fetch = {"type": "fetch", "node_id": "odd", "nonce": os.urandom(32), "version": 1, "start": -1}
        s.sendall(encode_frame(fetch, key=key))
        reply, _ = recv_frame(s, 0)
    assert reply == {"type": "refused", "reason": "authentication failed"} and src.refused == 1

    garbage = socket.create_server(("127.0.0.1", 0))  # authenticates, then sends a chunk header with a bad index

    def serve() -> None:
        conn, _ = garbage.accept()
        with conn:
            keys = _serve_hello(conn)  # the token is known: a compromised relay, not an impostor
            send_frame(conn, {"type": "chunk", "i": "zero"}, key=keys.send)
            conn.recv(1)  # until the child hangs up

    threading.Thread(target=serve, daemon=True).start()
    try:
        r = nodes("child").fetch(m, [Upstream("garbage", "127.0.0.1", garbage.getsockname()[1]), _up(src)])
    finally:
        garbage.close()
    assert r.ok and r.parent == SOURCE and r.repairs[0]["parent"] == "garbage"
    assert r.repairs[0]["reason"] == "protocol"  # its kind only: the details stay in this node's log

    ssh = socket.create_server(("127.0.0.1", 0))  # any service a plan can name: its banner must not travel back

    def banner() -> None:
        conn, _ = ssh.accept()
        with conn:
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            conn.recv(1)

    threading.Thread(target=banner, daemon=True).start()
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        r = nodes("child2").fetch(m, [Upstream("ssh", "127.0.0.1", ssh.getsockname()[1]),
                                      Upstream("closed", "127.0.0.1", closed_port), _up(src)])
    finally:
        ssh.close()
    assert r.ok and [(x["parent"], x["reason"]) for x in r.repairs] == [("ssh", "protocol"), ("closed", "unreachable")]


def _serve_hello(conn: socket.socket) -> session.Session:
    """A relay's side of the handshake on a plaintext socket, done by hand."""
    nonce = os.urandom(32)
    send_frame(conn, {"type": "challenge", "nonce": nonce})
    prefix = conn.recv(PREFIX_BYTES, socket.MSG_WAITALL)
    body = conn.recv(TAG_BYTES + int.from_bytes(prefix[4:8], "big"), socket.MSG_WAITALL)
    header, raw = open_frame(prefix, body, session.hello_key(TOKEN, session.RELAY, nonce, b""))
    return session.derive(TOKEN, session.RELAY, nonce, header["nonce"], b"", raw, server=True)


def test_token_bucket_paces_at_the_set_rate():
    bucket = TokenBucket(4e6, burst=16 << 10)
    t0 = time.monotonic()
    for _ in range(32):
        bucket.take(64 << 10)  # 2 MiB in total -> ~0.52 s at 4 MB/s
    dt = time.monotonic() - t0
    assert 0.45 < dt < 1.5
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(0)


def test_a_relays_own_failures_are_kept_only_for_the_decay_window():
    """One timestamp per failure used to be kept for the whole run (a long run's flaky relay: an unbounded list);
    the ones past DECAY_WINDOW_S count for nothing and are dropped at the next failure."""
    from echo2sdk.core.broadcast.planner import DECAY_WINDOW_S

    s = WorkerScores()
    for k in range(1000):
        s.record_failure("w0", k * DECAY_WINDOW_S / 10)
    assert len(s.stats["w0"].failures) <= 10
    now = 999 * DECAY_WINDOW_S / 10
    assert s.recent_failures("w0", now) == len(s.stats["w0"].failures)
