"""The snapshots that reach a worker and their install. A snapshot arrives at any time, pushed whole by the
coordinator (a `Snapshot` frame) or as a signed plan of the chain broadcast (`SnapshotPlan`: the worker verifies
the manifest and pulls the chunks through its relay node, runtime/broadcast/relay.py). Only the newest one not
yet installed is kept; the rollout loop installs it between generation batches, and the worker switches
version the moment its install completes. A relay-only worker installs nothing: it forwards what it fetched
and reports it as installed.

With delta snapshots (the welcome says so: broadcast.delta), the worker keeps the snapshot it installed last, with
its BLAKE3 root, as the base of the next delta. A delta is applied to it (core/delta.py) off the event loop, and
the rebuilt snapshot is queued only when its root is the one in the signed manifest; a delta for another base, or
one that does not rebuild, is refused and reported (the coordinator then sends it again: from the store, or whole).

With a snapshot store (the welcome names it: broadcast.store), the coordinator may say `SnapshotInStore` instead
(this worker just joined, or lacks a delta's base): the worker rebuilds the newest snapshot from the store
(runtime/broadcast/store.py: from the snapshot it holds plus the later deltas, or from the newest anchor), every
manifest, chunk and root verified, with its own credentials; when it cannot, it says so and is sent it whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from echo2sdk.core import delta
from echo2sdk.core.broadcast.manifest import Manifest, verify_manifest
from echo2sdk.core.contracts import InferenceBackend
from echo2sdk.errors import BackendError, Echo2Error, ProtocolError
from echo2sdk.runtime.broadcast.delivery import snapshot_frame_ok
from echo2sdk.runtime.broadcast.relay import Assembly, RelayNode, Upstream
from echo2sdk.runtime.protocol.messages import (
    BroadcastInfo,
    Installed,
    Received,
    Snapshot,
    SnapshotInStore,
    SnapshotPlan,
    SnapshotRejected,
    StoreInfo,
    clip,
    shown,
)
from echo2sdk.runtime.trust.store_policy import store_settings
from echo2sdk.runtime.worker.link import CoordinatorLink

if TYPE_CHECKING:
    from echo2sdk.runtime.broadcast.store import SnapshotStore

__all__ = ["SnapshotInbox"]

log = logging.getLogger("echo2sdk.worker")


class SnapshotInbox:
    """A worker's pending snapshot, its relay node and what it knows of the published versions.

    `pending`: the newest snapshot not yet installed: (version, its bytes (direct push), or its assembly in the
    relay, acquired there so the verified buffer is installed in place (no copy) and never recycled before that).
    `newest`: the newest version this worker has heard of (welcome, plans, pushes). `received`: the newest
    version a relay-only worker fetched. `relay` is set by the worker at its first session."""

    def __init__(self, link: CoordinatorLink, host: str, relay_only: bool, allowed: Collection[str] = ()):
        self.link, self.host, self.relay_only = link, host, relay_only
        self.allowed = frozenset(allowed)  # the operator's --allow-plugin values (the store's: store_policy)
        self.relay: RelayNode | None = None
        self.public_key: bytes | None = None  # the snapshot-signing key, learnt from the sealed welcome
        self.pending: tuple[int, bytes | bytearray | Assembly] | None = None
        self.newest = 0
        self.received = 0
        self.deltas = False  # the run publishes delta snapshots (its welcome said so)
        self.held: tuple[int, bytes, bytes | bytearray] | None = None  # (version, root, bytes) installed: a delta's base
        self.roots: dict[int, bytes] = {}  # signed roots of the snapshots received, by version (pending ones)
        self.applied = 0  # deltas applied and verified
        self.store_info: StoreInfo | None = None  # the run's snapshot store (its welcome said where)
        self._store: SnapshotStore | None = None  # opened at the first SnapshotInStore
        self._store_busy, self._store_again = False, False  # one catch-up at a time; another after it when asked
        self._store_wanted = 0  # the newest version a SnapshotInStore named

    def heard_of(self, version: int) -> None:
        self.newest = max(self.newest, version)

    def on_welcome(self, bcast: BroadcastInfo | None) -> None:
        """The broadcast settings of a (sealed) welcome: the signing key, relay keys and the relay's limits."""
        assert self.relay is not None
        self.public_key = bcast.public_key if bcast is not None else None
        self.relay.add_relay_keys(bcast.relay_keys if bcast is not None else ())
        if bcast is not None and bcast.stall_timeout_s is not None:
            self.relay.stall_timeout_s = bcast.stall_timeout_s
        if bcast is not None and bcast.min_relay_bps is not None:
            self.relay.min_relay_bps = bcast.min_relay_bps
        self.deltas = bcast is not None and bcast.deltas
        self.store_info = bcast.store if bcast is not None else None

    async def on_push(self, msg: Snapshot, payload: bytes) -> None:
        """A snapshot pushed whole: kept as pending when well-formed and newer than the pending one."""
        self.heard_of(msg.version)
        if (why := snapshot_frame_ok(msg, payload)) is not None:
            log.warning("dropping snapshot v%s: %s", msg.version, why)
            await self.link.notify(SnapshotRejected(version=msg.version, reason=why))
        elif self.pending is None or msg.version > self.pending[0]:
            self.set_pending(msg.version, payload)
            if self.relay_only:  # nothing to install: what it got is what it has
                self.received = max(self.received, msg.version)
                await self.link.notify(Installed(version=msg.version))

    def on_plan(self, plan: SnapshotPlan) -> None:
        """A chain-broadcast plan: fetched in the background (`fetch`)."""
        self.heard_of(plan.manifest.version)
        asyncio.get_running_loop().create_task(self.fetch(plan))

    async def fetch(self, plan: SnapshotPlan) -> None:
        """Chain broadcast: verify the signed manifest, pull the chunks from the upstream list (forwarding
        each to our own children as it lands), then queue the snapshot for install."""
        assert self.relay is not None
        try:
            manifest = Manifest.from_wire(plan.manifest.model_dump())
            if self.public_key is None:
                raise ProtocolError("no broadcast public key was given at join time")
            verify_manifest(manifest, self.public_key)
        except ProtocolError as e:
            log.warning("refusing snapshot plan: %s", shown(str(e), 200))
            await self.link.notify(SnapshotRejected(version=plan.manifest.version, reason=clip(str(e))))
            return
        # a learner bound to a wildcard address is reached where we reach the coordinator
        upstream = [Upstream(node, self.host if host in ("0.0.0.0", "::", "") else host, port, fp)
                    for node, host, port, fp in plan.upstream]
        self.relay.add_relay_keys(plan.relay_keys)
        report = await asyncio.to_thread(self.relay.fetch, manifest, upstream)
        await self.link.notify(Received(**report.to_wire()))
        asm = self.relay.acquire(manifest.version) if report.ok else None
        if asm is None:
            log.warning("snapshot v%d: no upstream could serve it (%s)", manifest.version, shown(report.repairs, 300))
            return
        if not self.relay_only and (self.pending is None or manifest.version > self.pending[0]):
            if manifest.kind == "delta":
                await self._apply(manifest, asm)
            else:
                if manifest.root:
                    self.roots[manifest.version] = manifest.root
                self.set_pending(manifest.version, asm)
        else:
            self.relay.release(asm)
        if self.relay_only:
            self.received = max(self.received, manifest.version)
            await self.link.notify(Installed(version=manifest.version))

    async def _apply(self, manifest: Manifest, asm: Assembly) -> None:
        """Rebuild the snapshot a verified delta gives from the held base and queue it; refuse (and report) a delta
        for another base or one whose result is not the signed root. The delta's buffer goes back to the relay."""
        held, v = self.held, manifest.version
        try:
            if held is None or held[0] != manifest.base_version or held[1] != manifest.base_root:
                have = "nothing" if held is None else f"v{held[0]}"
                raise ProtocolError(f"delta v{v} is for base v{manifest.base_version}, this worker holds {have}")
            t0 = time.perf_counter()
            full = await asyncio.to_thread(delta.apply, held[2], asm.view, root=manifest.root, base_root=held[1])
        except ProtocolError as e:
            log.warning("refusing snapshot v%d: %s", v, shown(str(e), 200))
            await self.link.notify(SnapshotRejected(version=v, reason=clip(str(e))))
            return
        finally:
            self.relay.release(asm)  # type: ignore[union-attr]
        self.applied += 1
        log.info("snapshot v%d: delta on v%d (%d bytes) applied and verified in %.2f s", v, held[0],
                 manifest.total_bytes, time.perf_counter() - t0)
        self._queue_rebuilt(v, full, manifest.root)

    def _queue_rebuilt(self, version: int, data: bytes | bytearray, root: bytes) -> None:
        """A verified snapshot rebuilt here (a delta applied, or read from the store), with its signed root: pending
        unless a newer one is."""
        if self.pending is None or version > self.pending[0]:
            self.roots[version] = root
            self.set_pending(version, data)

    def on_store_hint(self, msg: SnapshotInStore) -> None:
        """The coordinator says the snapshot is in the store: rebuild it from there in the background (one
        catch-up at a time: a hint during one starts another after it, which reads the then newest)."""
        self.heard_of(msg.version)
        if self.relay_only:  # installs nothing, needs no base: it has "installed" it, and relays the next delta
            self.received = max(self.received, msg.version)
            asyncio.get_running_loop().create_task(self.link.notify(Installed(version=msg.version)))
            return
        self._store_wanted = max(self._store_wanted, msg.version)
        if self._store_busy:
            self._store_again = True
            return
        asyncio.get_running_loop().create_task(self._catch_up(msg.version))

    async def _catch_up(self, version: int) -> None:
        self._store_busy = True
        try:
            while True:
                self._store_again = False
                await self._from_store(version)
                if not self._store_again:
                    return
                version = self._store_wanted  # the newest version the coordinator said is in the store
        finally:
            self._store_busy = False

    async def _from_store(self, version: int) -> None:
        """Rebuild snapshot `version` (or newer) from the store and queue it; refuse (and report, so that the
        coordinator pushes it whole) when that cannot be done."""
        from echo2sdk.runtime.broadcast.store import SnapshotStore, library_failure

        try:
            if self.store_info is None or self.public_key is None:
                raise ProtocolError("this run's welcome named no snapshot store or no signing key")
            # what this worker's operator allows of the welcome's store settings (ConfigError: a refusal)
            url, options, metadata = store_settings(self.store_info, self.allowed)
            if self._store is None or (self._store.url, self._store.options) != (url, options):
                self._store = await asyncio.to_thread(lambda: SnapshotStore(url, options, metadata=metadata,
                                                                            create=False))
            held = self.held if self.deltas else None
            caught = await asyncio.to_thread(self._store.catch_up, self.public_key, held)
            if caught.version < version:
                raise ProtocolError(f"the store's newest snapshot is v{caught.version}, v{version} was announced")
        except BaseException as e:  # a store error of any kind (a refusal, obstore's own, its panic, a bad entry)
            if not library_failure(e):
                raise  # cancelled, or the process is ending
            log.warning("snapshot v%d: cannot take it from the store: %s", version, shown(str(e), 300))
            # what travels back: our own refusals and checks, never a message of the library (which may quote a
            # server's answer: the coordinator chose the endpoint)
            said = str(e) if isinstance(e, Echo2Error) else f"{type(e).__name__} (this worker's log has the message)"
            await self.link.notify(SnapshotRejected(version=version, reason=clip(f"store: {said}"), from_store=True))
            return
        log.info("snapshot v%d from the store in %.2f s: %s + %d delta(s), %d bytes read", caught.version,
                 caught.seconds, f"anchor v{caught.anchor}" if caught.anchor is not None else f"held v{held[0]}",
                 len(caught.deltas), caught.bytes_read)
        self._queue_rebuilt(caught.version, caught.data, caught.root)

    def set_pending(self, version: int, payload: bytes | bytearray | Assembly) -> None:
        if self.pending is not None and isinstance(self.pending[1], Assembly):
            self.relay.release(self.pending[1])  # type: ignore[union-attr]
        self.pending = (version, payload)

    async def install(self, backend: InferenceBackend | None) -> None:
        """Install the pending snapshot into `backend` when it is newer than the installed version, and report
        it (or the backend's refusal) to the coordinator. The pending snapshot is taken either way."""
        if self.pending is None or backend is None:
            return
        version, payload = self.pending
        self.pending = None
        t0 = time.perf_counter()
        try:
            if version <= backend.version:
                return
            weights = payload.view if isinstance(payload, Assembly) else payload
            await asyncio.to_thread(backend.install, version, weights)
            if self.deltas:  # the next delta's base: the bytes as installed (a copy of a relay buffer)
                root = self.roots.pop(version, None) or await asyncio.to_thread(delta.snapshot_root, weights)
                kept = weights if isinstance(weights, (bytes, bytearray)) else await asyncio.to_thread(bytes, weights)
                self.held = (version, root, kept)
                self.roots = {v: r for v, r in self.roots.items() if v > version}
        except BackendError as e:
            log.warning("snapshot v%s refused by the backend: %s", version, e)
            await self.link.notify(SnapshotRejected(version=version, reason=clip(str(e))))
            return
        finally:
            if isinstance(payload, Assembly):
                self.relay.release(payload)  # type: ignore[union-attr]
        await self.link.notify(Installed(version=backend.version, install_s=time.perf_counter() - t0))
