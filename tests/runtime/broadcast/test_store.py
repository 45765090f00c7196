"""Snapshot storage (runtime/broadcast/store.py): anchors and deltas written with signed manifests, read back as a
verified snapshot from the newest anchor or from the snapshot a reader holds; retention by whole chains; every
corrupt, missing or foreign entry refused. On the local filesystem and on a real S3-compatible server (moto's, in
server mode, on loopback)."""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("obstore")

from echo2sdk.core import delta  # noqa: E402
from echo2sdk.core.broadcast.manifest import Signer, build_manifest  # noqa: E402
from echo2sdk.errors import ConfigError, ProtocolError  # noqa: E402
from echo2sdk.runtime.broadcast.store import SnapshotStore, StoreError  # noqa: E402

CHUNK = 4096


def _versions(n: int, size: int = 64 << 10, seed: int = 0) -> list[bytes]:
    """n snapshots of one size, each a few hundred words away from the one before."""
    import numpy as np

    rng = np.random.default_rng(seed)
    snaps = [rng.integers(0, 256, size, dtype=np.uint8).tobytes()]
    for _ in range(n - 1):
        b = bytearray(snaps[-1])
        for i in rng.integers(0, size, 300):
            b[i] = (b[i] + 1) % 256
        snaps.append(bytes(b))
    return snaps


def _publish(store: SnapshotStore, signer: Signer, snaps: list[bytes], kinds: str) -> None:
    """Write snaps[i] as version i + 1, a full anchor ('F') or a delta on the version before ('D')."""
    for i, (data, kind) in enumerate(zip(snaps, kinds)):
        root = delta.snapshot_root(data)
        if kind == "F":
            store.put(build_manifest(data, i + 1, CHUNK, signer, root=root), data, signer.public_key)
        else:
            d = delta.encode(snaps[i - 1], data, root=root)
            store.put(build_manifest(d.payload, i + 1, CHUNK, signer, kind="delta", base_version=i,
                                     base_root=d.base_root, root=root), d.payload, signer.public_key)


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """A store URL and its options: a local folder, or a prefix on the S3 server."""
    if request.param == "local":
        return str(tmp_path / "store"), {}
    s3 = request.getfixturevalue("s3_server")
    return s3.url(f"{request.node.name}-{os.getpid()}"), s3.options


def test_a_joiner_rebuilds_the_newest_snapshot_from_the_newest_anchor_and_a_holder_reads_only_deltas(where):
    url, opts = where
    signer, snaps = Signer(), _versions(6)
    store = SnapshotStore(url, opts)
    _publish(store, signer, snaps, "FDDFDD")  # chains v1-v3 and v4-v6
    got = store.catch_up(signer.public_key)  # a joiner: nothing held
    assert (got.version, got.anchor, got.deltas) == (6, 4, [5, 6]) and bytes(got.data) == snaps[5]
    assert got.root == delta.snapshot_root(snaps[5]) and got.bytes_read > len(snaps[5])
    held = (5, delta.snapshot_root(snaps[4]), snaps[4])  # one version behind: one delta, no anchor
    got = store.catch_up(signer.public_key, held)
    assert (got.version, got.anchor, got.deltas) == (6, None, [6]) and bytes(got.data) == snaps[5]
    assert got.bytes_read < len(snaps[5]) / 4
    old = (2, delta.snapshot_root(snaps[1]), snaps[1])  # on the previous chain: the newest anchor, then deltas
    got = store.catch_up(signer.public_key, old)
    assert (got.anchor, got.deltas) == (4, [5, 6]) and bytes(got.data) == snaps[5]
    tip = (6, got.root, got.data)  # up to date: nothing read
    assert store.catch_up(signer.public_key, tip).bytes_read == 0


def test_retention_keeps_whole_chains(tmp_path):
    signer, snaps = Signer(), _versions(8)
    store = SnapshotStore(str(tmp_path / "s"), keep_chains=2)
    _publish(store, signer, snaps, "FDDFDFDD")  # anchors at v1, v4, v6
    assert store.entries() == [(4, "full"), (5, "delta"), (6, "full"), (7, "delta"), (8, "delta")]
    assert sorted(os.listdir(tmp_path / "s")) == sorted(
        f"v{v:012d}.{k}{ext}" for v, k in store.entries() for ext in ("", ".manifest"))
    one = SnapshotStore(str(tmp_path / "one"), keep_chains=1)
    _publish(one, signer, snaps, "FDDFDFDD")
    assert one.entries() == [(6, "full"), (7, "delta"), (8, "delta")]
    assert bytes(one.catch_up(signer.public_key).data) == snaps[7]
    with pytest.raises(ConfigError, match="keep_chains = 0"):
        SnapshotStore(str(tmp_path / "zero"), keep_chains=0)


def _planted(store: SnapshotStore, m, payload: bytes) -> None:
    """An entry written straight into the bucket (not through the run's writer)."""
    import obstore

    from echo2sdk.core.records import pack

    name = f"v{m.version:012d}.{m.kind}"
    obstore.put(store.store, name, payload)
    obstore.put(store.store, name + ".manifest", pack(m.to_wire()))


def _corrupt(path, offset: int = -1) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x01
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("fault, says", [
    ("corrupted delta chunk", "store entry v3: chunk 0 does not match its signed digest"),
    ("corrupted anchor chunk", "store entry v1: chunk 1 does not match its signed digest"),
    ("missing delta", "store entry v3 is a delta on v2, which the store does not hold"),
    ("another run's key", r"none of the 3 newest entries of .* verifies; the last: manifest v1: bad signature"),
    ("wrong base", "store entry v4 names base v3 and a root that v3's manifest does not"),
    (r"truncated payload", r"store entry v3: (\d+) bytes, the manifest says (\d+)"),
    ("a signed delta that does not rebuild", r"store entry v4 \(a delta on v3\): "),
    # the newest entry does not verify: skipped, never trusted; the newest one that does is rebuilt (a worker
    # told of v3 then refuses an older snapshot and is sent v3 whole: test_store_run.py, worker/inbox.py)
    ("tampered manifest", 2),
    ("manifest under another name", 1),
    ("an unsigned newer entry", 3),
    ("a foreign entry beside each real one", 3),
])
def test_a_store_entry_that_does_not_verify_gives_nothing(tmp_path, fault, says):
    signer, snaps = Signer(), _versions(3)
    d = tmp_path / "s"
    store = SnapshotStore(str(d))
    _publish(store, signer, snaps, "FDD")
    key = signer.public_key
    if fault == "corrupted delta chunk":
        _corrupt(d / f"v{3:012d}.delta", 20)
    elif fault == "corrupted anchor chunk":
        _corrupt(d / f"v{1:012d}.full", 5000)
    elif fault == "missing delta":
        (d / f"v{2:012d}.delta.manifest").unlink()
    elif fault == "tampered manifest":
        _corrupt(d / f"v{3:012d}.delta.manifest", -40)
    elif fault == "another run's key":
        key = Signer().public_key
    elif fault == "manifest under another name":
        os.replace(d / f"v{2:012d}.delta.manifest", d / f"v{3:012d}.delta.manifest")
    elif fault == "wrong base":  # a delta signed by this run, but on a base the chain does not have
        dd = delta.encode(snaps[0], snaps[2])
        m = build_manifest(dd.payload, 4, CHUNK, signer, kind="delta", base_version=3, base_root=dd.base_root,
                           root=dd.root)
        store.put(m, dd.payload, signer.public_key)
    elif fault == "truncated payload":
        p = d / f"v{3:012d}.delta"
        p.write_bytes(p.read_bytes()[:-1])
    elif fault == "a signed delta that does not rebuild":  # the frame is on v1's bytes, the manifest says v3
        dd = delta.encode(snaps[0], snaps[2])
        root3 = delta.snapshot_root(snaps[2])
        store.put(build_manifest(dd.payload, 4, CHUNK, signer, kind="delta", base_version=3, base_root=root3,
                                 root=dd.root), dd.payload, signer.public_key)
    elif fault == "an unsigned newer entry":  # a writable bucket adds a v9 anchor signed by another key
        _planted(store, build_manifest(snaps[0], 9, CHUNK, Signer(), root=delta.snapshot_root(snaps[0])), snaps[0])
    elif fault == "a foreign entry beside each real one":  # v1.delta, v2.full, v3.full, signed by another key
        other = Signer()
        _planted(store, build_manifest(snaps[0], 2, CHUNK, other), snaps[0])
        _planted(store, build_manifest(snaps[0], 3, CHUNK, other), snaps[0])
        d1 = delta.encode(snaps[1], snaps[0])
        _planted(store, build_manifest(d1.payload, 1, CHUNK, other, kind="delta", base_version=0,
                                       base_root=d1.base_root, root=d1.root), d1.payload)
    if isinstance(says, int):
        got = store.catch_up(key)
        assert got.version == says and bytes(got.data) == snaps[says - 1]
        return
    with pytest.raises(ProtocolError) as e:
        store.catch_up(key)
    assert re.search(says, str(e.value)), e.value
    # a holder of v2 is refused as well when the entry it needs is bad (no state is ever half-applied)
    if fault in ("corrupted delta chunk", "truncated payload"):
        with pytest.raises(ProtocolError):
            store.catch_up(key, (2, delta.snapshot_root(snaps[1]), snaps[1]))


def test_retention_counts_only_anchors_this_run_signed_and_runs_keep_their_own_folder(tmp_path):
    """Junk anchors (another key) newer than the run's own do not make retention delete the run's entries (it
    deletes the junk instead); two runs configured with one URL write to two folders (run_url: by their keys)."""
    from echo2sdk.runtime.broadcast.store import run_url

    signer, other, snaps = Signer(), Signer(), _versions(4)
    store = SnapshotStore(str(tmp_path / "s"), keep_chains=1)
    for v in (100, 101):  # two "newer anchors" a writable bucket gained, signed by someone else
        _planted(store, build_manifest(snaps[0], v, CHUNK, other), snaps[0])
    _publish(store, signer, snaps, "FDFD")
    assert store.entries() == [(3, "full"), (4, "delta")]  # kept: v3-v4; the junk deleted
    assert bytes(store.catch_up(signer.public_key).data) == snaps[3]
    a, b = run_url("s3://bucket/runs", signer.public_key), run_url("s3://bucket/runs", other.public_key)
    assert a != b and a.startswith("s3://bucket/runs/run-") and run_url("s3://bucket/runs/", signer.public_key) == a
    assert run_url(str(tmp_path / "rel"), signer.public_key).startswith("file:///")


def _listed(store: SnapshotStore) -> set[str]:
    import obstore

    return {obj["path"] for batch in obstore.list(store.store) for obj in batch}


@pytest.mark.parametrize("junk", [9, 50])
def test_junk_above_the_newest_entry_is_read_past_and_the_next_anchor_deletes_it(where, junk):
    """A writable bucket can add entries, never sign them: `junk` unsigned entries (payload and manifest) above the
    newest real one, and as many manifests without a payload (passed over unread). A joiner still rebuilds the real
    newest; the writer's next anchor deletes all of them, and keeps a payload whose manifest is not written yet."""
    import obstore

    url, opts = where
    signer, other, snaps = Signer(), Signer(), _versions(4)
    store = SnapshotStore(url, opts, keep_chains=1)
    _publish(store, signer, snaps[:3], "FDD")
    small = snaps[0][:CHUNK]
    for v in range(100, 100 + junk):
        _planted(store, build_manifest(small, v, CHUNK, other), small)
        obstore.put(store.store, f"v{v + 1000:012d}.full.manifest", b"not a manifest")
    got = store.catch_up(signer.public_key)
    assert (got.version, got.anchor, got.deltas) == (3, 1, [2, 3]) and bytes(got.data) == snaps[2]
    obstore.put(store.store, f"v{5:012d}.delta", b"a put under way: its manifest comes next")
    root = delta.snapshot_root(snaps[3])
    store.put(build_manifest(snaps[3], 4, CHUNK, signer, root=root), snaps[3], signer.public_key)
    assert store.entries() == [(4, "full")]
    assert _listed(store) == {f"v{4:012d}.full", f"v{4:012d}.full.manifest", f"v{5:012d}.delta"}
    assert bytes(store.catch_up(signer.public_key).data) == snaps[3]


def test_a_reader_reads_past_a_bounded_number_of_entries_that_do_not_verify(tmp_path, monkeypatch):
    """The walk down the store stops with a StoreError once the manifests it read that do not verify reach
    _MAX_SKIPPED (or _MAX_SKIPPED_BYTES): a writable bucket can add entries without end. The writer's retention
    walks under the same bound: its next anchor deletes the junk it read, the anchor after it the rest."""
    from echo2sdk.runtime.broadcast import store as store_mod

    signer, other, snaps = Signer(), Signer(), _versions(3)
    store = SnapshotStore(str(tmp_path / "s"), keep_chains=1)
    _publish(store, signer, snaps[:1], "F")
    small = snaps[0][:CHUNK]
    n = store_mod._MAX_SKIPPED + 1
    for v in range(100, 100 + n):
        _planted(store, build_manifest(small, v, CHUNK, other), small)
    says = (rf"^{n - 1} entries of .* read do not verify \(\d+ bytes of manifests\): a walk down the store reads "
            rf"past at most {n - 1} of them or {store_mod._MAX_SKIPPED_BYTES} bytes")
    with pytest.raises(StoreError, match=says):
        store.catch_up(signer.public_key)
    # each anchor's retention deletes the junk it read under the bound; the old chains go once it reaches an anchor
    for v, left in ((2, [(1, "full"), (2, "full"), (100, "full")]), (3, [(3, "full")])):
        root = delta.snapshot_root(snaps[v - 1])
        store.put(build_manifest(snaps[v - 1], v, CHUNK, signer, root=root), snaps[v - 1], signer.public_key)
        assert store.entries() == left
        assert bytes(store.catch_up(signer.public_key).data) == snaps[v - 1]
    for v in range(100, 103):
        _planted(store, build_manifest(small, v, CHUNK, other), small)
    monkeypatch.setattr(store_mod, "_MAX_SKIPPED_BYTES", 1)  # the bytes bound: one manifest read past, no more
    with pytest.raises(StoreError, match=r"^1 entries of .* read do not verify"):
        store.catch_up(signer.public_key)


def test_an_empty_store_and_a_bad_url_are_clear_errors(tmp_path):
    with pytest.raises(StoreError, match="holds no snapshot"):
        SnapshotStore(str(tmp_path / "empty")).catch_up(Signer().public_key)
    with pytest.raises(ConfigError, match="broadcast.store = 'nope://x'"):
        SnapshotStore("nope://x")


def test_the_store_config_is_checked_where_it_is_written():
    from echo2sdk.config import load_config

    with pytest.raises(ConfigError, match=r"broadcast.store = 's3://b/r' needs broadcast.topology 'chain' or 'star'"):
        load_config(None, ['broadcast.store="s3://b/r"', 'broadcast.topology="direct"'])
    for secret in ("secret_access_key", "account_key", "service_account_key", "sse_customer_key_base64"):
        with pytest.raises(ConfigError, match=rf"broadcast.store_options \['{secret}'\]: these options are sent"):
            load_config(None, ['broadcast.store="s3://b/r"', f'broadcast.store_options={{{secret}="x"}}'])
    for url in ("s3://user:pw@b/r", "s3://b/r?token=x"):
        with pytest.raises(ConfigError, match="no user, password or query in the URL"):
            load_config(None, [f'broadcast.store="{url}"'])
    with pytest.raises(ConfigError, match="store_keep"):
        load_config(None, ["broadcast.store_keep=0"])
    for name, value in (("region", "x@evil.example/"), ("endpoint", "http://h:1/p?q"), ("allow_http", "yes")):
        with pytest.raises(ConfigError, match=rf"broadcast.store_options.{name} = .*: not of the form"):
            load_config(None, ['broadcast.store="s3://b/r"', f'broadcast.store_options={{{name}="{value}"}}'])
    for url in ("http://host/x", "memory://x", "s3a://b/r"):  # schemes a worker would not read (store_policy)
        with pytest.raises(ConfigError, match="expected az, file, gs, s3 URLs"):
            load_config(None, [f'broadcast.store="{url}"'])
    cfg = load_config(None, ['broadcast.store="s3://b/r"', 'broadcast.store_options={region="eu-west-1"}'])
    assert cfg.broadcast.store_options == {"region": "eu-west-1"} and cfg.broadcast.store_keep == 2


# -- the coordinator's routing, on its own (the real path: test_store_run.py) ------------------------------
class _Conn:
    def __init__(self, wid: str, version: int):
        from echo2sdk.runtime.coordinator.worker_info import WorkerInfo

        self.info = WorkerInfo(wid, "127.0.0.1:1", version=version)
        self.sent: list = []

    @property
    def worker_id(self) -> str:
        return self.info.worker_id

    async def send(self, msg, payload: bytes = b"") -> None:
        self.sent.append((msg, len(payload)))


class _Delivery:
    def __init__(self):
        self.signer, self.chunk_bytes, self.delivered = Signer(), CHUNK, []

    async def deliver(self, version, payload, peers, meta=None):
        self.delivered.append((version, meta.kind if meta else "full", sorted(p.worker_id for p in peers)))


def test_a_worker_without_the_deltas_base_is_told_to_take_it_from_the_store_once_written(tmp_path):
    """At a delta publication the holders of the base get the delta over the delivery; a worker on an older
    version gets no full push but SnapshotInStore once the write is done, and what it then reads rebuilds the
    snapshot; a refusal from the store falls back to a push of the snapshot whole, once."""
    import asyncio
    from types import SimpleNamespace

    from echo2sdk.runtime.coordinator.publications import Publications
    from echo2sdk.runtime.protocol.messages import Snapshot, SnapshotInStore, SnapshotRejected

    snaps = _versions(2)
    d = delta.encode(snaps[0], snaps[1])
    holder, behind = _Conn("holder", 1), _Conn("behind", 0)
    registry = SimpleNamespace(conns={"holder": holder, "behind": behind})
    delivery = _Delivery()
    snapshots = Publications(delivery, registry, base=None, q=1.0, store=SnapshotStore(str(tmp_path / "s")))

    async def scenario():
        snapshots.publish(1, snaps[0], d.base_root)
        await asyncio.sleep(0.5)
        holder.info.version = 1
        snapshots.publish(2, snaps[1], d.root, (d, 1))
        for _ in range(100):
            if behind.sent:
                break
            await asyncio.sleep(0.05)
        await snapshots.on_rejected(behind, SnapshotRejected(version=2, reason="store: no credentials",
                                                             from_store=True))
        await snapshots.on_rejected(behind, SnapshotRejected(version=2, reason="again", from_store=True))
        await asyncio.sleep(0.2)

    asyncio.run(scenario())
    assert delivery.delivered == [(1, "full", ["behind", "holder"]), (2, "delta", ["holder"])]
    assert snapshots.stored == 2 and snapshots.store_counts["written"] == 2
    (hint, _), (push, nbytes) = behind.sent
    assert isinstance(hint, SnapshotInStore) and hint.version == 2
    assert isinstance(push, Snapshot) and push.version == 2 and nbytes == len(snaps[1])  # once, not twice
    assert snapshots.sent["full_pushed"] == 1 and snapshots.store_counts["refused"] == 2
    got = snapshots.store.catch_up(delivery.signer.public_key, (1, d.base_root, snaps[0]))
    assert got.deltas == [2] and bytes(got.data) == snaps[1]

    # a holder that refuses the delta itself is told to read the store; when it cannot, it gets the push
    holder.info.version, holder.sent = 1, []

    async def refusals():
        await snapshots.on_rejected(holder, SnapshotRejected(version=2, reason="delta v2 is for base v1 ..."))
        await snapshots.on_rejected(holder, SnapshotRejected(version=2, reason="store: no", from_store=True))

    asyncio.run(refusals())
    assert [type(m).__name__ for m, _ in holder.sent] == ["SnapshotInStore", "Snapshot"]

    # publications that queue behind a write: only the newest is written, whole (its base never reached the store)
    more = _versions(3, seed=1)
    d3, d4 = delta.encode(snaps[1], more[1]), delta.encode(more[1], more[2])

    async def burst():
        snapshots.publish(3, more[1], d3.root, (d3, 2))
        snapshots.publish(4, more[2], d4.root, (d4, 3))
        for _ in range(100):
            if snapshots.stored == 4:
                break
            await asyncio.sleep(0.05)

    asyncio.run(burst())
    snapshots.close()
    assert snapshots.store_counts["skipped"] == 1 and snapshots.stored == 4
    assert snapshots.store.entries()[-1] == (4, "full")
    got = snapshots.store.catch_up(delivery.signer.public_key)
    assert (got.version, got.anchor) == (4, 4) and bytes(got.data) == more[2]
