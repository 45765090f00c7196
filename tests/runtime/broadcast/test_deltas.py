"""Delta snapshots over the real chain broadcast: the learner publishes deltas between anchors, the workers apply
them to the snapshot they hold and install only what rebuilds to the signed root; a worker without the base gets
the full snapshot."""

from __future__ import annotations

import re
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("echo2_math")

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.runtime.learner.recipe import Trainer  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory, delta_run):
    """2 local workers, a publication every step (S = 2), an anchor every 3, 6 steps (the last publication is a
    delta); weight decay moves the weights at every update (tiny-random's rewards are all 0: no policy gradient).
    After the last step, with the coordinator still up, a third worker joins and installs the newest version."""
    out = tmp_path_factory.mktemp("deltas")
    cfg = load_config(None, [*delta_run, "rollout.workers=2", "learner.data_timeout_s=120", f'run.out="{out}"'])
    tr = Trainer(cfg)
    try:
        summary = tr.run()
        tr.local.start("late")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            late = tr.coordinator.workers.get("late")
            if late is not None and late.version == tr.version:
                break
            time.sleep(0.1)
    finally:
        tr.close()
    logs = {p.stem: p.read_text() for p in (out / "workers").glob("*.log")}
    return tr, summary, logs


def test_deltas_go_out_between_anchors_and_are_a_fraction_of_the_snapshot(run):
    tr, _, _ = run
    sent = tr.publication.sent
    assert [s["kind"] for s in sent] == ["full", "delta", "delta", "full", "delta", "delta"]
    for s in sent:
        if s["kind"] == "delta":
            assert 0 < s["changed_fraction"] < 1 and s["bytes"] < s["full_bytes"] / 2, s
        assert s["encode_s"] >= 0
    snaps = tr.coordinator.publications
    assert snaps.sent["delta"] == 4 and snaps.sent["full"] == 2
    summary = run[1]["deltas"]  # summary.json
    assert (summary["full"], summary["delta"]) == (2, 4) and summary["bytes_sent"] < summary["bytes_full"]
    assert summary["coordinator"]["delta"] == 4 and len(summary["publications"]) == 6


def test_every_delta_a_worker_installs_was_applied_and_verified_and_none_refused(run):
    tr, _, logs = run
    applied = {w: len(re.findall(r"delta on v\d+ \(\d+ bytes\) applied and verified", text)) for w, text in logs.items()}
    assert applied["local-0"] >= 1 and applied["local-1"] >= 1, applied
    assert not any("refusing snapshot" in text for text in logs.values()), logs
    # every delta publication reached both original workers: installed (or superseded by a newer install)
    bcast = tr.coordinator.publications.bcast
    last = max(bcast)
    for w in ("local-0", "local-1"):
        assert w in bcast[last]["installed"] or tr.coordinator.workers[w].version >= last - 1, (w, bcast[last])


def test_a_late_joiner_after_a_delta_gets_the_full_snapshot(run):
    tr, _, logs = run
    assert tr.coordinator.publications.latest_kind == "delta" and tr.coordinator.publications.sent["full_pushed"] >= 1
    late = tr.coordinator.workers["late"]
    assert late.version == tr.version == 6 and 6 in late.installed  # the newest version, whole, over its connection
    assert "refusing snapshot" not in logs["late"] and "applied and verified" not in logs["late"]


# -- the worker's side, on its own (the real path is the run above) -----------------------------------------
class _Link:
    def __init__(self):
        self.sent = []

    async def notify(self, msg):
        self.sent.append(msg)


class _Relay:
    def __init__(self):
        self.released = []

    def release(self, asm):
        self.released.append(asm)


def _inbox_with(base: bytes, version: int):
    from echo2sdk.core import delta
    from echo2sdk.runtime.worker.inbox import SnapshotInbox

    inbox = SnapshotInbox(_Link(), "127.0.0.1", relay_only=False)
    inbox.relay, inbox.deltas = _Relay(), True
    inbox.held = (version, delta.snapshot_root(base), base)
    return inbox


@pytest.mark.parametrize("case", ["wrong base version", "wrong base root", "tampered value"])
def test_a_delta_the_worker_cannot_verify_is_refused_and_nothing_is_queued(case):
    import asyncio
    import os

    from echo2sdk.core import delta
    from echo2sdk.core.broadcast.manifest import Signer, build_manifest
    from echo2sdk.runtime.broadcast.relay import Assembly
    from echo2sdk.runtime.protocol.messages import SnapshotRejected

    base = os.urandom(64 << 10)
    new = bytearray(base)
    new[100:110] = os.urandom(10)
    d = delta.encode(base, bytes(new))
    payload, base_root, base_version = d.payload, d.base_root, 4
    if case == "wrong base version":
        base_version = 3
    elif case == "wrong base root":
        base_root = os.urandom(32)
    else:  # a learner-signed manifest over a frame whose value was changed: the result root cannot match
        import zstandard

        frame = bytearray(zstandard.ZstdDecompressor().decompress(payload))
        frame[-1] ^= 0xFF
        payload = zstandard.ZstdCompressor().compress(bytes(frame))
    m = build_manifest(payload, 5, 4096, Signer(), kind="delta", base_version=base_version, base_root=base_root,
                       root=d.root)
    inbox = _inbox_with(base, 4)
    asm = Assembly(m, payload)
    asyncio.run(inbox._apply(m, asm))
    assert inbox.pending is None and inbox.applied == 0 and inbox.relay.released == [asm]
    (msg,) = inbox.link.sent
    assert isinstance(msg, SnapshotRejected) and msg.version == 5, msg
    # and the same delta against the right base goes through
    if case == "wrong base version":
        good = build_manifest(d.payload, 5, 4096, Signer(), kind="delta", base_version=4, base_root=d.base_root,
                              root=d.root)
        inbox2 = _inbox_with(base, 4)
        asyncio.run(inbox2._apply(good, Assembly(good, d.payload)))
        assert inbox2.applied == 1 and inbox2.pending[0] == 5 and bytes(inbox2.pending[1]) == bytes(new)
