"""A token holder's fetch reports (`received`) against the chain broadcast's plans and scores: a lying receiver
cannot demote an honest relay nor put an accomplice first, and what reports leave behind stays bounded."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import pytest
from _peers import TOKEN, Client, make_coordinator, wait

from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.runtime.coordinator import registry as registry_module
from echo2sdk.runtime.broadcast.chain import KEEP_VERSIONS, ChainBroadcast
from echo2sdk.runtime.protocol.messages import Received, Repair

WEIGHTS = os.urandom(16 << 10)


@dataclass
class _Peer:
    """A connected worker as delivery sees it (delivery.Peer): it keeps the plans it is sent."""

    worker_id: str
    relay_addr: tuple[str, int] | None = ("127.0.0.1", 9)
    relay_fingerprint: bytes = b""
    sent: list = field(default_factory=list)

    async def send(self, msg, payload=b"") -> None:
        self.sent.append(msg)


@pytest.fixture
def chain():
    cb = ChainBroadcast(TOKEN, n_chains=1, chunk_bytes=4 << 10, tls=False)
    yield cb
    cb.close()


def _publish(cb: ChainBroadcast, version: int, ids: list[str]) -> None:
    asyncio.run(cb.deliver(version, WEIGHTS, [_Peer(w) for w in ids]))


def _complaint(version: int, against: str, n: int = 1) -> Received:
    repairs = [Repair(parent=against, reason="stall", chunk=0)] * n
    return Received(version=version, ok=True, parent=SOURCE, repairs=repairs)


def test_three_fake_reports_do_not_demote_an_honest_relay(chain):
    _publish(chain, 1, ["honest", "liar", "other"])  # one chain: honest -> liar -> other
    assert chain.plans[1].upstream("liar")[0] == "honest"
    for v in (1, 2, 3):
        if v > 1:
            _publish(chain, v, ["honest", "liar", "other"])
        for _ in range(3):  # the same report again, and a report naming honest three times
            chain.on_report("liar", _complaint(v, "honest", n=3))
        chain.on_report("other", _complaint(v, "honest"))  # honest is not other's planned parent
    now = time.monotonic()
    assert chain.scores.recent_failures("honest", now) == 1 and not chain.scores.rollout_only("honest", now)
    _publish(chain, 4, ["honest", "liar", "other"])
    assert "honest" in chain.plans[4].chains[0]  # still a relay


def test_a_claimed_speed_of_1e300_does_not_put_an_accomplice_first():
    cb = ChainBroadcast(TOKEN, n_chains=3, chunk_bytes=4 << 10, tls=False)
    try:
        ids = ["acc", "h1", "h2", "liar", "c1", "c2"]
        _publish(cb, 1, ids)  # three chains: acc -> liar, h1 -> c1, h2 -> c2
        assert [c[0] for c in cb.plans[1].chains] == ["acc", "h1", "h2"] and cb.plans[1].parent("liar") == "acc"
        cb.on_report("liar", Received(version=1, ok=True, parent="acc", served_bps={"acc": 1e300, "h1": 0.0}))
        cb.on_report("c1", Received(version=1, ok=True, parent="h1", served_bps={"h1": 1e8}))
        cb.on_report("c2", Received(version=1, ok=True, parent="h2", served_bps={"h2": 2e8}))
        cb.on_report("liar", Received(version=1, ok=True, parent="h2", served_bps={"h2": 1.0}))  # a second report
        _publish(cb, 2, ids)
        assert cb.plans[2].chains[0][0] == "h2", cb.plans[2]
        assert cb.scores.stats["acc"].speeds == {"liar": 12.5e9} and cb.scores.stats["h2"].speeds == {"c2": 2e8}
    finally:
        cb.close()


def test_plans_and_reports_keep_the_last_versions_only(chain):
    for v in range(1, 41):
        _publish(chain, v, ["a", "b"])
        chain.on_report("b", _complaint(v, "a"))
    chain.on_report("b", _complaint(10**12, "a"))  # a version never published
    assert sorted(chain.plans) == sorted(chain.reports) == list(range(41 - KEEP_VERSIONS, 41))


def test_the_registry_keeps_a_bounded_number_of_departed_workers(loop, monkeypatch):
    monkeypatch.setattr(registry_module, "KEEP_DEPARTED", 3)
    c = make_coordinator()
    try:
        for i in range(8):
            client = loop.run(Client.join(c.port, worker_id=f"gone-{i}"))
            assert client.answer["type"] == "welcome"
            loop.run(client.close())
            assert wait(lambda: not c.workers[f"gone-{i}"].alive, 10)
        live = loop.run(Client.join(c.port, worker_id="live"))
        assert sorted(c.workers) == ["gone-5", "gone-6", "gone-7", "live"]
        loop.run(live.close())
    finally:
        c.stop()


def test_late_joiners_reuse_the_versions_manifest(chain, monkeypatch):
    """Every join after a publication delivers the newest snapshot to the joiner; hashing and signing the whole
    snapshot again for each (0.1 s per 256 MiB here, seconds for a large model) let a token holder that
    re-joins in a loop keep the learner's cores busy. The version's manifest is made once."""
    from echo2sdk.runtime.broadcast import chain as chain_broadcast

    built = []
    real = chain_broadcast.build_manifest
    monkeypatch.setattr(chain_broadcast, "build_manifest", lambda *a, **kw: built.append(a[1]) or real(*a, **kw))
    _publish(chain, 1, ["a", "b"])
    for i in range(5):
        late = _Peer(f"late-{i}")
        asyncio.run(chain.deliver(1, WEIGHTS, [late]))
        assert late.sent[-1].manifest.version == 1 and late.sent[-1].upstream[-1][0] == SOURCE
    _publish(chain, 2, ["a", "b"])
    assert built == [1, 2]
    assert chain.source.assembly(2) is not None and chain.source.assembly(2).complete


def test_a_direct_push_hashes_each_snapshot_once(monkeypatch):
    """DirectPush: the snapshot's SHA-256 (in its MACed header) is computed once per published snapshot, on a
    thread, not again on the coordinator's event loop for every late joiner."""
    from echo2sdk.runtime.broadcast import delivery

    hashed = []
    real = delivery.digest
    monkeypatch.setattr(delivery, "digest", lambda data: hashed.append(len(data)) or real(data))
    push, peers = delivery.DirectPush(), [_Peer(f"w{i}") for i in range(6)]
    asyncio.run(push.deliver(1, WEIGHTS, peers[:2]))
    for p in peers[2:]:
        asyncio.run(push.deliver(1, WEIGHTS, [p]))
    assert {p.sent[-1].sha256 for p in peers} == {real(WEIGHTS)} and len(hashed) == 1
    other = os.urandom(len(WEIGHTS))
    asyncio.run(push.deliver(2, other, peers[:1]))
    assert peers[0].sent[-1].sha256 == real(other) and len(hashed) == 2


def test_a_stored_report_is_bounded_whatever_its_size_on_the_wire(chain):
    """A `received` may carry MAX_REPORT repairs with 1 KiB reasons and MAX_REPORT rates (it carried 4096 of each,
    ~5 MB, before a worker's header was capped at 1 MiB): kept whole for each worker and each of the last
    KEEP_VERSIONS versions, a token holder's connections could hold a lot. The report kept for the run's record
    holds at most KEEP_REPORT_ENTRIES repairs and rates; scoring is unchanged."""
    from echo2sdk.runtime.broadcast.chain import KEEP_REPORT_ENTRIES
    from echo2sdk.runtime.protocol.messages import MAX_REPORT

    _publish(chain, 1, ["a", "b"])
    with pytest.raises(ValueError, match="repairs"):
        Received(version=1, repairs=[Repair(parent="a", reason="r", chunk=i) for i in range(MAX_REPORT + 1)])
    huge = Received(version=1, ok=True, parent="a",
                    served_bps={f"n{i:04d}" + "x" * 120: 1e6 for i in range(MAX_REPORT - 1)} | {"a": 5e6},
                    repairs=[Repair(parent="a", reason="r" * 1024, chunk=i) for i in range(MAX_REPORT)])
    chain.on_report("b", huge)
    kept = chain.reports[1]["b"]
    assert len(kept["repairs"]) == KEEP_REPORT_ENTRIES and len(kept["served_bps"]) <= KEEP_REPORT_ENTRIES
    assert kept["served_bps"]["a"] == 5e6  # the planned parent's rate is the one kept first
    assert chain.scores.recent_failures("a", time.monotonic()) == 1  # its complaint still counts, once
