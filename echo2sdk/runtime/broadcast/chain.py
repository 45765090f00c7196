"""Coordinator side of the peer-assisted broadcast: a `SnapshotDelivery` that signs a chunk manifest,
plans the chains (or a star), serves the chain seeds from the learner's own relay node and hands every
worker its fetch order - its upstream list, parent first, the learner last.

Workers report how each fetch went (``received``): who served them at what rate and which parents
failed. Those reports feed the C.3 scores, so the next publication's plan puts fast, reliable relays
first and degrades failing ones seed -> tail -> rollout-only.

A report is a claim by a token holder, so it is taken only as far as the plan backs it: one report per
worker and version, for one of the last KEEP_VERSIONS versions (kept with at most KEEP_REPORT_ENTRIES repairs and
rates); a relay is credited only by a receiver it
was planned to serve (the last chunk's sender among the receiver's planned upstream), and blamed only by
its planned child; speeds are clamped and each receiver has one vote (planner.WorkerScores).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

from echo2sdk.core.broadcast.manifest import DEFAULT_CHUNK_BYTES, Manifest, Signer, build_manifest
from echo2sdk.core.broadcast.planner import SOURCE, ChainPlan, WorkerScores, plan_chains
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.broadcast.delivery import Peer, SnapshotMeta, send_all
from echo2sdk.runtime.protocol.messages import MAX_RELAY_KEYS, BroadcastInfo, Received, SnapshotPlan, WireManifest
from echo2sdk.runtime.broadcast.relay import MIN_RELAY_BPS, RelayNode
from echo2sdk.runtime.trust.tls import Identity

__all__ = ["ChainBroadcast", "Topology", "KEEP_VERSIONS"]

log = logging.getLogger("echo2sdk.broadcast")

Topology = Literal["chain", "star"]
KEEP_VERSIONS = 16  # plans and fetch reports kept, newest versions; reports of older ones are ignored
KEEP_REPORT_ENTRIES = 16  # repairs and rates a kept report holds (a fetch repairs once per upstream node at most)


class ChainBroadcast:
    def __init__(
        self,
        token: str,
        *,
        topology: Topology = "chain",
        n_chains: int = 1,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        host: str = "127.0.0.1",
        uplink_bps: float | None = None,
        per_peer_bps: float | None = None,
        stall_timeout_s: float = 5.0,
        min_relay_bps: float = MIN_RELAY_BPS,
        signer: Signer | None = None,
        tls: bool | Identity = True,
        relay_key_lookahead: int = 1,
        deltas: bool = False,
    ):
        """`tls`: the learner's relay port speaks TLS with a certificate made for it (True), a given `Identity`,
        or plaintext (False, opt-in). Workers pin its fingerprint from the sealed snapshot plan.
        `relay_key_lookahead`: how many versions past each plan's its relay keys cover (kappa, the publication
        period: every node then holds the next publication's key before a child can ask it for it), clamped to
        [1, MAX_RELAY_KEYS - 1]; beyond it a child that asks its parent first may be refused and repair upstream.
        `deltas`: publications may be delta snapshots (broadcast.delta); workers learn it in the welcome and keep
        the snapshot they installed as the next delta's base."""
        self.relay_key_lookahead = min(max(1, relay_key_lookahead), MAX_RELAY_KEYS - 1)
        if topology not in ("chain", "star"):
            raise ValueError(f"broadcast topology must be 'chain' or 'star', got {topology!r}")
        if n_chains < 1:
            raise ValueError(f"n_chains must be >= 1, got {n_chains!r}")
        self.topology, self.n_chains, self.chunk_bytes, self.deltas = topology, n_chains, chunk_bytes, deltas
        self.signer = signer or Signer()
        self.source = RelayNode(
            token, node_id=SOURCE, host=host, uplink_bps=uplink_bps, per_peer_bps=per_peer_bps,
            stall_timeout_s=stall_timeout_s, min_relay_bps=min_relay_bps, tls=tls,
        )
        self._root = session.token_key(token)
        self._newest = 0  # the newest version delivered: the welcome hands out its relay key and the next one's
        self._made: tuple[bytes, Manifest] | None = None  # the newest weights and their manifest, made once
        self.scores = WorkerScores()
        self.plans: dict[int, ChainPlan] = {}
        self.reports: dict[int, dict[str, dict[str, Any]]] = {}  # version -> worker -> its `received`, as a map

    @property
    def public_key(self) -> bytes:
        return self.signer.public_key

    def welcome_info(self) -> BroadcastInfo:
        """What a worker needs at join time: the key that signs every manifest, when to repair, and the relay
        keys of the newest version and the next publication's."""
        return BroadcastInfo(public_key=self.public_key, stall_timeout_s=self.source.stall_timeout_s,
                             min_relay_bps=self.source.min_relay_bps, relay_keys=self.relay_keys(self._newest),
                             deltas=self.deltas)

    def relay_keys(self, version: int) -> tuple[tuple[int, bytes], ...]:
        """(v, K_relay(v)) for `version` and the `relay_key_lookahead` versions after it: a node holds the next
        publication's key before any child can ask it for that version, and a revoked worker gets no key
        beyond (docs/security.md, "Per-worker credentials")."""
        return tuple((v, session.relay_key(self._root, v)) for v in range(version, version + self.relay_key_lookahead + 1))

    async def deliver(self, version: int, weights: bytes, peers: Sequence[Peer], meta: SnapshotMeta | None = None) -> None:
        """`weights`: the payload (`meta`: a full snapshot by default, or a delta) signed and served under `version`."""
        if self._made is not None and self._made[0] is weights and self._made[1].version == version:
            manifest = self._made[1]  # a late joiner: this snapshot is signed and served already
        else:
            manifest = await asyncio.to_thread(build_manifest, weights, version, self.chunk_bytes, self.signer,
                                               **(meta or SnapshotMeta()).fields())
            self._made = (weights, manifest)
            self.source.publish(manifest, weights)
        self._newest = max(self._newest, version)
        now = time.monotonic()
        relay_addr = {p.worker_id: p.relay_addr for p in peers}
        ranked = self.scores.rank([p.worker_id for p in peers], now)
        leaves = {w for w in ranked if relay_addr[w] is None or self.scores.rollout_only(w, now)}
        n = len(ranked) if self.topology == "star" else self.n_chains
        plan = plan_chains(ranked, max(1, n), leaves)
        if version not in self.plans or len(peers) > 1:  # a late joiner's own order is not the version's plan
            self._keep(version, plan)
        addr = {SOURCE: (self.source.host, self.source.port, self.source.fingerprint),
                **{p.worker_id: (*p.relay_addr, p.relay_fingerprint) for p in peers if p.relay_addr is not None}}
        wire_manifest, keys = WireManifest(**manifest.to_wire()), self.relay_keys(version)

        def order(p: Peer) -> SnapshotPlan:
            return SnapshotPlan(manifest=wire_manifest, upstream=[(u, *addr[u]) for u in plan.upstream(p.worker_id)],
                                relay_keys=keys)

        # all at once: a worker that stopped reading delays no other; a dead one is the coordinator's business
        # (its children repair around it)
        await asyncio.gather(*(send_all([p], order(p)) for p in peers))
        log.info("snapshot v%d: %d bytes (%s) in %d chunks to %d worker(s) on %d chain(s)", version,
                 manifest.total_bytes, manifest.kind if manifest.kind == "full" else f"delta on v{manifest.base_version}",
                 manifest.n_chunks, len(peers), plan.n_chains)

    def _keep(self, version: int, plan: ChainPlan) -> None:
        """Record `version`'s plan, forgetting plans and reports beyond the newest KEEP_VERSIONS versions."""
        self.plans[version] = plan
        self.reports.setdefault(version, {})
        for old in sorted(self.plans)[:-KEEP_VERSIONS]:
            self.plans.pop(old, None)
            self.reports.pop(old, None)

    def on_report(self, worker_id: str, report: Received) -> None:
        """A worker's fetch report: score its parents (paper C.3), as far as the version's plan backs it."""
        reports, plan = self.reports.get(report.version), self.plans.get(report.version)
        if reports is None or plan is None or worker_id in reports:
            return  # an unknown or forgotten version, or a second report: nothing more to learn from it
        try:
            upstream = plan.upstream(worker_id)
        except KeyError:
            upstream = None  # a late joiner: its own order named the learner only
        reports[worker_id] = _kept(report, upstream or ())
        if upstream is None:
            return
        now = time.monotonic()
        parent = upstream[0]
        if parent != SOURCE and any(r.parent == parent for r in report.repairs):
            self.scores.record_failure(parent, now, reporter=worker_id)
        if report.ok and report.parent != SOURCE and report.parent in upstream:
            self.scores.record_success(report.parent, report.served_bps.get(report.parent), reporter=worker_id)

    def close(self) -> None:
        self.source.close()


def _kept(report: Received, upstream: Sequence[str]) -> dict[str, Any]:
    """`report` as kept for the run's record: at most KEEP_REPORT_ENTRIES repairs and rates (the planned upstream
    nodes' rates first). A report on the wire may hold 4096 of each (~5 MB); an honest one holds a few."""
    planned = set(upstream)
    rates = sorted(report.served_bps.items(), key=lambda kv: kv[0] not in planned)[:KEEP_REPORT_ENTRIES]
    kept = report.model_dump(exclude_none=True, exclude={"served_bps", "repairs"})
    kept["served_bps"] = dict(rates)
    kept["repairs"] = [r.model_dump(exclude_none=True) for r in report.repairs[:KEEP_REPORT_ENTRIES]]
    return kept
