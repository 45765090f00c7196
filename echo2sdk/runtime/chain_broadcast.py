"""Coordinator side of the peer-assisted broadcast: a `SnapshotDelivery` that signs a chunk manifest,
plans the chains (or a star), serves the chain seeds from the learner's own relay node and hands every
worker its fetch order - its upstream list, parent first, the learner last.

Workers report how each fetch went (``received``): who served them at what rate and which parents
failed. Those reports feed the C.3 scores, so the next publication's plan puts fast, reliable relays
first and degrades failing ones seed -> tail -> rollout-only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

from echo2sdk.core.broadcast.manifest import DEFAULT_CHUNK_BYTES, Signer, build_manifest
from echo2sdk.core.broadcast.planner import SOURCE, ChainPlan, WorkerScores, plan_chains
from echo2sdk.runtime.delivery import Peer, send_all
from echo2sdk.runtime.messages import BroadcastInfo, Received, SnapshotPlan, WireManifest
from echo2sdk.runtime.relay import RelayNode
from echo2sdk.runtime.tls import Identity

__all__ = ["ChainBroadcast", "Topology"]

log = logging.getLogger("echo2sdk.broadcast")

Topology = Literal["chain", "star"]


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
        signer: Signer | None = None,
        tls: bool | Identity = True,
    ):
        """`tls`: the learner's relay port speaks TLS with a certificate made for it (True), a given `Identity`,
        or plaintext (False, opt-in). Workers pin its fingerprint from the sealed snapshot plan."""
        if topology not in ("chain", "star"):
            raise ValueError(f"broadcast topology must be 'chain' or 'star', got {topology!r}")
        if n_chains < 1:
            raise ValueError(f"n_chains must be >= 1, got {n_chains!r}")
        self.topology, self.n_chains, self.chunk_bytes = topology, n_chains, chunk_bytes
        self.signer = signer or Signer()
        self.source = RelayNode(
            token, node_id=SOURCE, host=host, uplink_bps=uplink_bps, per_peer_bps=per_peer_bps,
            stall_timeout_s=stall_timeout_s, tls=tls,
        )
        self.scores = WorkerScores()
        self.plans: dict[int, ChainPlan] = {}
        self.reports: dict[int, dict[str, dict[str, Any]]] = {}  # version -> worker -> its `received`, as a map

    @property
    def public_key(self) -> bytes:
        return self.signer.public_key

    def welcome_info(self) -> BroadcastInfo:
        """What a worker needs at join time: the key that signs every manifest, and when to repair."""
        return BroadcastInfo(public_key=self.public_key, stall_timeout_s=self.source.stall_timeout_s)

    async def deliver(self, version: int, weights: bytes, peers: Sequence[Peer]) -> None:
        manifest = await asyncio.to_thread(build_manifest, weights, version, self.chunk_bytes, self.signer)
        self.source.publish(manifest, weights)
        now = time.monotonic()
        relay_addr = {p.worker_id: p.relay_addr for p in peers}
        ranked = self.scores.rank([p.worker_id for p in peers], now)
        leaves = {w for w in ranked if relay_addr[w] is None or self.scores.rollout_only(w, now)}
        n = len(ranked) if self.topology == "star" else self.n_chains
        plan = plan_chains(ranked, max(1, n), leaves)
        if version not in self.plans or len(peers) > 1:  # a late joiner's own order is not the version's plan
            self.plans[version] = plan
        addr = {SOURCE: (self.source.host, self.source.port, self.source.fingerprint),
                **{p.worker_id: (*p.relay_addr, p.relay_fingerprint) for p in peers if p.relay_addr is not None}}
        wire_manifest = WireManifest(**manifest.to_wire())

        def order(p: Peer) -> SnapshotPlan:
            return SnapshotPlan(manifest=wire_manifest, upstream=[(u, *addr[u]) for u in plan.upstream(p.worker_id)])

        # all at once: a worker that stopped reading delays no other; a dead one is the coordinator's business
        # (its children repair around it)
        await asyncio.gather(*(send_all([p], order(p)) for p in peers))
        log.info("snapshot v%d: %d bytes in %d chunks to %d worker(s) on %d chain(s)", version,
                 manifest.total_bytes, manifest.n_chunks, len(peers), plan.n_chains)

    def on_report(self, worker_id: str, report: Received) -> None:
        """A worker's fetch report: score its parents (paper C.3)."""
        self.reports.setdefault(report.version, {})[worker_id] = report.model_dump(exclude_none=True)
        now = time.monotonic()
        for r in report.repairs:
            if r.parent != SOURCE:
                self.scores.record_failure(r.parent, now)
        if report.ok and report.parent not in ("", SOURCE):
            self.scores.record_success(report.parent, report.served_bps.get(report.parent))

    def close(self) -> None:
        self.source.close()
