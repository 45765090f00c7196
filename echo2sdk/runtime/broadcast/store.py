"""Snapshot storage: the learner's publications in an object store, where a joining or lagging worker takes them
instead of from the learner (the paper, App. C: a replacement worker fetches the current snapshot from cloud
storage).

The coordinator writes every publication it makes (a full snapshot, an anchor, or a delta against the previous
publication) with a manifest signed by the run's key (core/broadcast/manifest.py, the chain broadcast's):

    v000000000012.full              the payload (snapshot bytes, or a core.delta frame)
    v000000000012.full.manifest     its signed manifest, written after the payload: present means complete

A reader (`SnapshotStore.catch_up`) follows the newest manifest's base back to an anchor, or to the snapshot it
already holds, checks every manifest's signature and that each delta names the version and BLAKE3 root of the
one before it, checks each payload chunk against its signed digest, applies the deltas in order and returns the
rebuilt snapshot only when its root is the signed one. Nothing unverified leaves this module.

Anyone who can write to the bucket can add entries, never sign them. A reader walks down from the newest entry
and reads past those that do not verify, up to a bound (`_MAX_SKIPPED` manifests or `_MAX_SKIPPED_BYTES`: each
reader would read them all); an entry whose listing already says it cannot be read (no payload, a manifest
larger than its payload's can be) is passed over without a request.

Retention keeps whole chains: after an anchor is written, the entries older than the `keep_chains`-th newest
anchor go, and so do the entries that do not verify at any version, above the newest anchor too (manifest first,
so a reader never sees a manifest without its payload). A reader racing a deletion reads the listing again.

The store is `s3://bucket/prefix` (credentials from the AWS_* environment; endpoint and region from it or from
`options`), `gs://`, `az://`, `file:///path`, or a plain local path (the embedded default: no server). Without
credentials in the environment a store is read unsigned, and the instance-metadata service is asked only when
`metadata` says so (runtime/trust/store_policy.py: what a worker takes from a welcome). obstore is imported on
first use only; its panics become StoreError or ConfigError like its errors.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from echo2sdk.core import delta
from echo2sdk.core.broadcast.manifest import MIN_CHUNK_BYTES, Manifest, chunk_digest, verify_manifest
from echo2sdk.core.records import pack, unpack
from echo2sdk.errors import ConfigError, ProtocolError
from echo2sdk.runtime.trust.store_policy import scheme_of, signs

__all__ = ["SnapshotStore", "Caught", "StoreError", "open_object_store", "library_failure", "run_url", "KEEP_CHAINS",
           "MAX_MANIFEST_BYTES"]

log = logging.getLogger("echo2sdk.store")

KEEP_CHAINS = 2  # the current anchor-to-tip chain, and the one before it (a reader may still be on it)
MAX_MANIFEST_BYTES = 64 << 20  # MAX_CHUNKS 32-byte digests and change
_ENTRY = re.compile(r"^v(\d{12})\.(full|delta)(\.manifest)?$")  # directly under the prefix, nothing nested
# A walk down the store (a reader's, retention's) reads past at most this many manifests that do not verify, or this
# many bytes of them, then stops with a StoreError. An honest store holds none (the run's writer signs every
# manifest and writes it whole, after its payload), so any number is an attacker's; each costs a request (tens of
# ms on S3) and a signature check, and every joiner would pay it again: 128 is a few seconds at worst, beside a
# catch-up that reads an anchor of gigabytes. Bytes: four of the largest manifests `manifest` reads.
_MAX_SKIPPED = 128
_MAX_SKIPPED_BYTES = 4 * MAX_MANIFEST_BYTES
_MANIFEST_FIELDS_BYTES = 1024  # a packed manifest without its chunk digests: keys, ints, digest, signature, roots
_DIGEST_BYTES = 34  # a packed 32-byte chunk digest (msgpack bin 8: 2 bytes of head)
RETRY_S = 60.0  # the longest a remote store request is retried before the reader falls back (a full push)
REQUEST_S = 1800.0  # one request, body included (obstore's default of 30 s cannot carry a large anchor)
_READ_TRIES = 3  # listings read again when retention removed an entry under a reader


class StoreError(ProtocolError):
    """The store cannot give a verified snapshot: unreachable, empty, a broken chain, or a bad entry."""


def open_object_store(url: str, options: dict[str, str] | None = None, *, metadata: bool = False,
                      create: bool = True) -> Any:
    """An obstore store for `url` (a plain path is a local folder, made if missing when `create`). `options`:
    obstore's config keys (endpoint, region, ...; `allow_http` goes to the HTTP client). Credentials come from
    this machine's environment; without them requests go unsigned unless `metadata` lets obstore ask the cloud's
    instance-metadata service for them (runtime/trust/store_policy.py). ConfigError naming the URL when obstore
    refuses it."""
    from obstore.store import from_url

    opts: dict[str, Any] = dict(options or {})
    url = local_url(url) if create else url
    if url.startswith("file://"):
        opts["mkdir"] = create
    else:  # a remote store: its HTTP client's options, and a bound on retries (obstore's default retries for 3 min)
        client = {k: opts.pop(k) for k in ("allow_http", "timeout", "connect_timeout", "read_timeout") if k in opts}
        # obstore's timeout covers a whole request, body included (30 s by default): an 8B model's 16 GB anchor
        # would need 530 MB/s
        client.setdefault("timeout", timedelta(seconds=REQUEST_S))
        client.setdefault("connect_timeout", timedelta(seconds=10))
        client.setdefault("read_timeout", timedelta(seconds=60))  # a download that stalls ends here, not at 30 min
        opts["client_options"] = client
        opts["retry_config"] = {"max_retries": 4, "retry_timeout": timedelta(seconds=RETRY_S)}
        if not signs(scheme_of(url), metadata, options=options or {}):  # no credentials: never ask for some
            opts["skip_signature"] = True
    try:
        return from_url(url, **opts)
    except BaseException as e:  # obstore's own error types for a bad URL or option, and its panics
        if not library_failure(e):
            raise
        raise ConfigError(f"broadcast.store = {url!r}: {type(e).__name__}: {e}") from None


def library_failure(e: BaseException) -> bool:
    """Whether `e` is the storage library failing: an Exception, or a panic of the Rust code under it (pyo3's
    PanicException derives from BaseException, so `except Exception` lets it through and it ends the thread)."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def local_url(url: str) -> str:
    """A plain path as an absolute file:// URL (made if missing): workers on this machine read the same folder
    whatever their working directory. Other URLs as they are."""
    if "://" in url:
        return url
    from pathlib import Path

    p = Path(url).expanduser().resolve()
    p.mkdir(parents=True, exist_ok=True)
    return "file://" + str(p)


def run_url(url: str, public_key: bytes) -> str:
    """The run's own folder under the configured store URL, named by its signing key: runs that share a bucket
    prefix never see (or delete) each other's entries, and a resumed run (same key) finds its own."""
    import hashlib

    return f"{local_url(url).rstrip('/')}/run-{hashlib.sha256(public_key).hexdigest()[:16]}"


def _key(version: int, kind: str) -> str:
    return f"v{version:012d}.{kind}"


def _entries(keys: list[tuple[str, int, int]]) -> list[tuple[int, str]]:
    """(version, kind) of the keys that are manifests, oldest first."""
    return sorted({(v, key.split(".")[1]) for key, v, _ in keys if key.endswith(".manifest")})


def _unreadable(manifest_bytes: int, payload_bytes: int | None) -> str | None:
    """Why an entry cannot verify, from its listing alone (no request), or None: its payload is missing (the writer
    writes it first), or its manifest is larger than any manifest of that payload (a digest per chunk of at least
    MIN_CHUNK_BYTES, and its other fields)."""
    if payload_bytes is None:
        return "its payload is missing"
    cap = min(MAX_MANIFEST_BYTES, _MANIFEST_FIELDS_BYTES + _DIGEST_BYTES * -(-payload_bytes // MIN_CHUNK_BYTES))
    if manifest_bytes > cap:
        return f"a {manifest_bytes}-byte manifest for a {payload_bytes}-byte payload (at most {cap})"
    return None


@dataclass
class Caught:
    """What `catch_up` rebuilt: the snapshot `version` (bytes `data`, BLAKE3 root `root`) and how: `anchor` (the
    full snapshot it started from, None when it started from the held one), the deltas applied, the bytes
    read from the store and the seconds it took."""

    version: int
    root: bytes
    data: bytes | bytearray
    anchor: int | None
    deltas: list[int] = field(default_factory=list)
    bytes_read: int = 0
    seconds: float = 0.0


class SnapshotStore:
    """Anchors and deltas under one store prefix. `put` (the coordinator's writer thread) and `catch_up` (a
    worker) are blocking: run them off an event loop."""

    def __init__(self, url: str, options: dict[str, str] | None = None, *, keep_chains: int = KEEP_CHAINS,
                 metadata: bool = False, create: bool = True):
        """`metadata`: credentials may come from the instance-metadata service; `create`: make a local folder
        that is missing (the writer; a worker only reads)."""
        if keep_chains < 1:
            raise ConfigError(f"keep_chains = {keep_chains} must be at least 1")
        self.url = local_url(url) if create else url
        self.options, self.keep_chains = dict(options or {}), keep_chains
        self.store = open_object_store(self.url, options, metadata=metadata, create=create)

    # -- the writer ----------------------------------------------------------------------------------------
    def put(self, manifest: Manifest, payload: bytes | bytearray | memoryview, public_key: bytes) -> None:
        """Write one publication (payload, then its signed manifest), then apply retention after an anchor."""
        import obstore

        key = _key(manifest.version, manifest.kind)
        try:
            obstore.put(self.store, key, memoryview(payload))
            obstore.put(self.store, key + ".manifest", pack(manifest.to_wire()))
            if manifest.kind == "full":
                self._retain(public_key)
        except BaseException as e:
            if isinstance(e, Exception) or not library_failure(e):
                raise
            raise StoreError(f"the store {self.url}: {type(e).__name__}: {e}") from None

    def _retain(self, public_key: bytes) -> None:
        """Delete the entries that do not verify, from the newest down (above the newest anchor too: readers would
        read past them), and what is older than the keep_chains-th newest anchor this run signed (an entry that
        does not verify is never counted as an anchor); manifests first; payloads left without a manifest go with
        the old chains. The walk is `_walk`'s, under its bound: past it, the rest goes at the next anchor.

        It never deletes a real entry. The run's folder has one legitimate writer (named by its key: run_url), and
        it runs this in its writer thread after `put` returned, so each entry it wrote has its payload and then
        its manifest, whole, and verifies. Above the kept chains only an entry with a manifest is touched: a
        payload whose manifest is not written yet (a put under way, by a resumed writer's predecessor say) is no
        entry and stays; a manifest goes only when it was read and did not verify, or when the listing says it
        cannot (its payload missing, or larger than its payload's manifest can be)."""
        import obstore

        keys = self._keys()  # one listing for both: what to keep and what to delete
        anchors: list[int] = []
        bad: list[str] = []
        try:
            for v, kind, m, _ in self._walk(keys, public_key):
                if m is None:
                    bad.append(_key(v, kind))
                elif kind == "full":
                    anchors.append(v)
                    if len(anchors) == self.keep_chains:
                        break
        except StoreError as e:
            log.warning("store: retention read no further (%s); the rest goes at the next anchor", e)
        doomed = {k for name in bad for k in (name, name + ".manifest")}
        if len(anchors) == self.keep_chains:
            doomed.update(key for key, v, _ in keys if v < anchors[-1])
        for key in sorted(doomed, key=lambda k: not k.endswith(".manifest")):  # manifests first: never half an entry
            try:
                obstore.delete(self.store, key)
            except FileNotFoundError:
                pass
        if bad:
            log.warning("store: deleted %d entries that do not verify (not this run's writes)", len(bad))
        if len(anchors) == self.keep_chains:
            log.info("store: kept the %d newest chain(s) from v%d (%d objects deleted)", self.keep_chains,
                     anchors[-1], len(doomed))

    # -- the reader ----------------------------------------------------------------------------------------
    def _keys(self) -> list[tuple[str, int, int]]:
        """(key, version, bytes) of every object named like an entry's payload or manifest, directly under the
        prefix."""
        import obstore

        out = []
        for batch in obstore.list(self.store):
            for obj in batch:
                if m := _ENTRY.match(obj["path"]):
                    out.append((obj["path"], int(m.group(1)), int(obj["size"])))
        return out

    def _walk(self, keys: list[tuple[str, int, int]],
              public_key: bytes) -> Iterator[tuple[int, str, Manifest | None, str]]:
        """(version, kind, manifest, why) of every entry of the listing `keys`, newest first: its manifest when it
        verifies, else None and why not (naming the entry). Cheap first: an entry `_unreadable` from the listing
        is passed over without a request. StoreError once the manifests read that did not verify reach _MAX_SKIPPED, or
        _MAX_SKIPPED_BYTES (so a walk reads at most that, plus one manifest). An entry gone since the listing
        (retention) is passed over: nothing there to take or to delete."""
        sizes = {key: size for key, _, size in keys}
        skipped = skipped_bytes = 0
        for v, kind in reversed(_entries(keys)):
            name = _key(v, kind)
            size = sizes[name + ".manifest"]
            if (why := _unreadable(size, sizes.get(name))) is not None:
                yield v, kind, None, f"store entry v{v}.{kind}: {why}"
                continue
            if skipped >= _MAX_SKIPPED or skipped_bytes >= _MAX_SKIPPED_BYTES:
                raise StoreError(f"{skipped} entries of {self.url} read do not verify ({skipped_bytes} bytes of "
                                 f"manifests): a walk down the store reads past at most {_MAX_SKIPPED} of them or "
                                 f"{_MAX_SKIPPED_BYTES} bytes (they were written without the run's key; its writer "
                                 "deletes them at its next anchor)")
            try:
                m = self.manifest(v, kind, public_key, limit=size)  # the bytes charged below, not more
            except FileNotFoundError:
                continue
            except ProtocolError as e:
                skipped, skipped_bytes = skipped + 1, skipped_bytes + size
                yield v, kind, None, str(e)
                continue
            yield v, kind, m, ""

    def entries(self) -> list[tuple[int, str]]:
        """(version, kind) of every complete entry (its manifest is there), oldest first. Not yet verified."""
        return _entries(self._keys())

    def manifest(self, version: int, kind: str, public_key: bytes, limit: int = MAX_MANIFEST_BYTES) -> Manifest:
        """The signed manifest of entry (version, kind), verified against `public_key`; one over `limit` bytes
        (at most MAX_MANIFEST_BYTES) is refused before it is read."""
        import obstore

        raw = obstore.get(self.store, _key(version, kind) + ".manifest")
        if raw.meta["size"] > (limit := min(limit, MAX_MANIFEST_BYTES)):
            raise StoreError(f"store entry v{version}: a {raw.meta['size']}-byte manifest (at most {limit})")
        try:
            wire = unpack(bytes(raw.bytes()))
        except Exception as e:  # noqa: BLE001 - msgpack's errors: whatever is there is not a manifest
            raise StoreError(f"store entry v{version}: the manifest does not decode ({e})") from None
        m = Manifest.from_wire(wire)
        verify_manifest(m, public_key)
        if (m.version, m.kind) != (version, kind):
            raise StoreError(f"store entry v{version}.{kind} holds the manifest of v{m.version}.{m.kind}")
        return m

    def payload(self, m: Manifest) -> bytes:
        """The payload of `m`, every chunk checked against its signed digest."""
        import obstore

        got = obstore.get(self.store, _key(m.version, m.kind))
        if got.meta["size"] != m.total_bytes:  # before reading it: a store cannot make a reader hold more
            raise StoreError(f"store entry v{m.version}: {got.meta['size']} bytes, the manifest says {m.total_bytes}")
        data = bytes(got.bytes())
        if len(data) != m.total_bytes:
            raise StoreError(f"store entry v{m.version}: {len(data)} bytes, the manifest says {m.total_bytes}")
        view = memoryview(data)
        for i, want in enumerate(m.chunks):
            start, end = m.span(i)
            if chunk_digest(view[start:end]) != want:
                raise StoreError(f"store entry v{m.version}: chunk {i} does not match its signed digest")
        return data

    def chain(self, public_key: bytes, held: tuple[int, bytes] | None = None) -> list[Manifest]:
        """The manifests from the newest entry back to an anchor, or to the first delta whose base is `held`
        (version, root), oldest first; every one verified, each delta naming the version before it."""
        keys = self._keys()
        entries: dict[int, list[str]] = {}
        for v, kind in _entries(keys):  # a version may show under both kinds when someone else wrote one of them
            entries.setdefault(v, []).append(kind)
        if not entries:
            raise StoreError(f"the store {self.url} holds no snapshot")
        newest = self._newest(keys, public_key)
        if held is not None and newest.version <= held[0]:
            return []  # nothing newer than what the reader holds
        out: list[Manifest] = []
        m = newest
        while True:
            out.append(m)
            if m.kind == "full" or (held is not None and (m.base_version, m.base_root) == held):
                break
            if m.base_version not in entries:
                raise StoreError(f"store entry v{m.version} is a delta on v{m.base_version}, which the store "
                                 "does not hold")
            m = self._verified(m.base_version, entries[m.base_version], public_key)
        out.reverse()
        for prev, m in zip(out, out[1:]):
            if m.base_version != prev.version or (prev.root and m.base_root != prev.root):
                raise StoreError(f"store entry v{m.version} names base v{m.base_version} and a root that "
                                 f"v{prev.version}'s manifest does not")
        return out

    def _verified(self, version: int, kinds: list[str], public_key: bytes) -> Manifest:
        """The manifest of entry `version` that verifies, of the kinds listed (ProtocolError: none does)."""
        for kind in kinds[:-1]:
            try:
                return self.manifest(version, kind, public_key)
            except ProtocolError as e:
                log.warning("store: entry v%d.%s does not verify, skipped: %s", version, kind, e)
        return self.manifest(version, kinds[-1], public_key)

    def _newest(self, keys: list[tuple[str, int, int]], public_key: bytes) -> Manifest:
        """The manifest of the newest entry of the listing `keys` that verifies (a writable bucket can add entries,
        never sign them: those above it are read past, under `_walk`'s bound, with one warning)."""
        passed, first, last = 0, "", ""
        for v, kind, m, why in self._walk(keys, public_key):
            if m is not None:
                if passed:
                    log.warning("store: %d newer entries do not verify, read past (the newest, %s)", passed, first)
                return m
            passed, first, last = passed + 1, first or why, why
        raise StoreError(f"none of the {passed} newest entries of {self.url} verifies; the last: {last}")

    def catch_up(self, public_key: bytes, held: tuple[int, bytes, bytes | bytearray] | None = None) -> Caught:
        """The newest snapshot in the store, rebuilt and verified: from `held` (version, root, bytes) plus the
        deltas after it when the store's chain passes through it, else from the newest anchor."""
        t0 = time.perf_counter()
        for attempt in range(_READ_TRIES):
            try:
                return self._catch_up(public_key, held, t0)
            except FileNotFoundError as e:  # retention removed an entry under us: read the listing again
                if attempt == _READ_TRIES - 1:
                    raise StoreError(f"the store {self.url} changed under {_READ_TRIES} reads: {e}") from None
            except StoreError:
                raise
            except BaseException as e:
                if not library_failure(e):
                    raise
                # the library's message may quote what a server answered (a body of the coordinator's choosing, or
                # of any address the endpoint names): it stays in this machine's log; the error names its kind only
                log.warning("store %s: %s: %s", self.url, type(e).__name__, e)
                raise StoreError(f"the store {self.url}: the storage library failed ({type(e).__name__}; this "
                                 "machine's log has its message)") from None
        raise AssertionError("unreachable")

    def _catch_up(self, public_key: bytes, held: tuple[int, bytes, bytes | bytearray] | None, t0: float) -> Caught:
        chain = self.chain(public_key, held[:2] if held is not None else None)
        if not chain:
            assert held is not None
            return Caught(held[0], held[1], held[2], anchor=None, seconds=time.perf_counter() - t0)
        first = chain[0]
        if first.kind == "full":
            data: bytes | bytearray = self.payload(first)
            root = delta.snapshot_root(data)
            if first.root and root != first.root:
                raise StoreError(f"store entry v{first.version}: the snapshot's root is not the signed one")
            caught = Caught(first.version, root, data, anchor=first.version, bytes_read=len(data))
            rest = chain[1:]
        else:
            assert held is not None  # chain() stops at a delta only on the held base
            caught = Caught(held[0], held[1], held[2], anchor=None)
            rest = chain
        for m in rest:
            payload = self.payload(m)
            try:
                caught.data = delta.apply(caught.data, payload, root=m.root, base_root=caught.root)
            except ProtocolError as e:
                raise StoreError(f"store entry v{m.version} (a delta on v{m.base_version}): {e}") from None
            caught.version, caught.root = m.version, m.root
            caught.deltas.append(m.version)
            caught.bytes_read += len(payload)
        caught.seconds = time.perf_counter() - t0
        return caught
