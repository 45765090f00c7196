"""The flow-level network model of snapshot dissemination (paper §4.2): capped links, the learner
uplink B0 shared max-min fairly, chunked store-and-forward chains and a star push.

Install times per worker for one publication, and T_bcast as the q-quantile of them. Used by the
simulator for every publication and by `echo2 plan` to estimate T_bcast from a snapshot size and B0/Bw.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from echo2sdk.core import capacity, checks
from echo2sdk.core.broadcast.planner import SOURCE, ChainPlan, WorkerScores, plan_chains
from echo2sdk.errors import ConfigError

__all__ = [
    "MBIT",
    "GB",
    "MiB",
    "Network",
    "star_install_times",
    "chain_install_times",
    "install_times",
    "t_bcast_quantile",
    "measure_t_bcast",
]

MBIT = 1e6  # bits/s per Mbit/s
GB = 1e9
MiB = 2**20


# ==================================================================== network model (flow level)


@dataclass(frozen=True)
class Network:
    """Dissemination parameters.

    snapshot_bytes: size of one policy snapshot. B0_mbps: learner uplink in Mbit/s (None: unlimited).
    chunk_bytes: chunk size of the store-and-forward pipeline. install_s: time from the last byte to
    "installed, generating" on a worker. topology: "chain" (ECHO-2: N_ch = floor(B0 / Bw) chains) or
    "star" (push to every worker).

    Delta snapshots (core/delta.py): delta_ratio is the bytes of a delta publication as a fraction of
    snapshot_bytes (measured by bench/delta.py; None: every publication is a full snapshot); a full one (an
    anchor) goes out first, every anchor_every publications (0: only when needed) and to a pool where a worker
    lacks the previous publication (the base a delta needs).
    """

    snapshot_bytes: float
    B0_mbps: float | None = None
    chunk_bytes: float = 64 * MiB
    install_s: float = 0.0
    topology: Literal["chain", "star"] = "chain"
    delta_ratio: float | None = None
    anchor_every: int = 10

    def __post_init__(self) -> None:
        _pos("snapshot_bytes", self.snapshot_bytes)
        if self.B0_mbps is not None:
            _pos("B0_mbps", self.B0_mbps)
        _pos("chunk_bytes", self.chunk_bytes)
        _pos("install_s", self.install_s, zero=True)
        if self.topology not in ("chain", "star"):
            raise ConfigError(f"topology must be 'chain' or 'star', got topology={self.topology!r}")
        if self.delta_ratio is not None:
            checks.real("delta_ratio", self.delta_ratio, lo=0, hi=1, open_lo=True, error=ConfigError)
        checks.integer("anchor_every", self.anchor_every, lo=0, error=ConfigError)

    def sized(self, nbytes: float) -> Network:
        """This network carrying one publication of `nbytes` (its chunks and T_bcast follow the size)."""
        return replace(self, snapshot_bytes=nbytes, delta_ratio=None)

    def publication(self, anchor: bool) -> Network:
        """This network carrying a full snapshot (`anchor`, or no deltas) or a delta."""
        full = anchor or self.delta_ratio is None
        return self.sized(self.snapshot_bytes if full else self.snapshot_bytes * self.delta_ratio)

    def typical(self) -> Network:
        """This network carrying the mean publication over an anchor cycle (one anchor, anchor_every - 1 deltas):
        what provisioning sizes the pool for (T_bcast in mu_min)."""
        if self.delta_ratio is None:
            return self
        k = self.anchor_every
        mean = self.delta_ratio if k == 0 else (1 + (k - 1) * self.delta_ratio) / k
        return self.sized(self.snapshot_bytes * mean)

    @property
    def chunks(self) -> int:
        return max(1, math.ceil(self.snapshot_bytes / self.chunk_bytes))

    @property
    def chunk_bits(self) -> float:
        return self.snapshot_bytes * 8 / self.chunks

    def n_chains(self, links_mbps: Iterable[float], n_workers: int) -> int:
        """N_ch = floor(B0 / Bw) (capacity.num_chains) with Bw the median worker link; one chain per
        worker when the uplink is unlimited."""
        links = list(links_mbps)
        if self.B0_mbps is None or not links:
            return max(1, n_workers)
        bw = statistics.median(links)
        return max(1, min(n_workers, capacity.num_chains(self.B0_mbps, bw))) if self.B0_mbps >= bw else 1


def _pos(name: str, value: object, zero: bool = False) -> float:
    """A finite number > 0 (>= 0 with `zero`) as a float; ConfigError naming it otherwise (also used by
    sim/inputs.py)."""
    return checks.real(name, value, lo=0, open_lo=not zero, error=ConfigError)


def _maxmin(caps: Mapping[str, float], total: float | None) -> dict[str, float]:
    """Max-min fair rates of flows with per-flow caps sharing `total` (None: no shared limit)."""
    if total is None:
        return dict(caps)
    rates: dict[str, float] = {}
    left, todo = total, sorted(caps, key=lambda w: caps[w])
    while todo:
        share = left / len(todo)
        w = todo[0]
        if caps[w] <= share:
            rates[w] = caps[w]
            left -= caps[w]
            todo.pop(0)
        else:
            for w in todo:
                rates[w] = share
            break
    return rates


def star_install_times(
    names: Sequence[str], net: Network, link_mbps: Mapping[str, float], start: float = 0.0
) -> dict[str, float]:
    """Install-complete times when the learner pushes the snapshot to every worker at once; flows
    share B0 max-min fairly and re-share as they finish."""
    size = net.snapshot_bytes * 8
    left = {w: size for w in names}
    caps = {w: link_mbps[w] * MBIT for w in names}
    total = None if net.B0_mbps is None else net.B0_mbps * MBIT
    t, done = start, {}
    while left:
        rates = _maxmin({w: caps[w] for w in left}, total)
        dt = min(left[w] / rates[w] for w in left)
        t += dt
        for w in list(left):
            left[w] -= rates[w] * dt
            if left[w] <= size * 1e-9:
                done[w] = t + net.install_s
                del left[w]
    return done


def _fanout(plan: ChainPlan) -> dict[str, int]:
    """How many children each node serves (its chain successor plus the leaves hanging off it)."""
    out: dict[str, int] = {SOURCE: len(plan.chains)}
    for chain in plan.chains:
        for a, _ in zip(chain, chain[1:]):
            out[a] = out.get(a, 0) + 1
    for _, parent in plan.leaves:
        out[parent] = out.get(parent, 0) + 1
    return out


def chain_install_times(
    plan: ChainPlan,
    net: Network,
    link_mbps: Mapping[str, float],
    start: float = 0.0,
    up_mbps: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Install-complete times along the forwarding chains of `plan` (paper §4.2): each hop moves one
    chunk in s_j = chunk_bits / rate_j, rate_j = min(sender uplink / its fan-out, receiver link); the
    learner uplink B0 is split across the seeds. The last chunk reaches depth d at
    sum_{j<=d} s_j + (K - 1) * max_{j<=d} s_j after publication (pipelined store-and-forward).
    ``up_mbps`` overrides a worker's forwarding rate (default: its link)."""
    fan = _fanout(plan)
    up_of = up_mbps or link_mbps
    K, bits = net.chunks, net.chunk_bits
    src_up = math.inf if net.B0_mbps is None else net.B0_mbps * MBIT
    n_leaves_on_source = sum(1 for _, p in plan.leaves if p == SOURCE)
    seeds = len(plan.chains) + n_leaves_on_source
    path: dict[str, tuple[float, float]] = {}  # node -> (sum s_j, max s_j) of its path

    def hop(sender: str, receiver: str) -> float:
        up = src_up / max(1, seeds) if sender == SOURCE else up_of[sender] * MBIT / fan.get(sender, 1)
        return bits / min(up, link_mbps[receiver] * MBIT)

    for chain in plan.chains:
        acc, peak, prev = 0.0, 0.0, SOURCE
        for w in chain:
            s = hop(prev, w)
            acc, peak, prev = acc + s, max(peak, s), w
            path[w] = (acc, peak)
    for leaf, parent in plan.leaves:
        base = path.get(parent, (0.0, 0.0))
        s = hop(parent, leaf)
        path[leaf] = (base[0] + s, max(base[1], s))
    return {w: start + a + (K - 1) * m + net.install_s for w, (a, m) in path.items()}


def install_times(
    names: Sequence[str],
    net: Network,
    link_mbps: Mapping[str, float],
    *,
    scores: WorkerScores | None = None,
    now: float = 0.0,
    start: float = 0.0,
    up_mbps: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], ChainPlan | None]:
    """Install times of `names` for one publication at `start` and the chain plan used (None for a
    star). Chains come from the real planner: seeds and order by ``scores.rank``, degraded workers
    rollout-only."""
    if not names:
        return {}, None
    if net.topology == "star":
        return star_install_times(names, net, link_mbps, start), None
    scores = scores or WorkerScores()
    ranked = scores.rank(list(names), now)
    n_ch = net.n_chains([link_mbps[w] for w in names], len(names))
    plan = plan_chains(ranked, n_ch, [w for w in names if scores.rollout_only(w, now)])
    return chain_install_times(plan, net, link_mbps, start, up_mbps), plan


def t_bcast_quantile(times: Mapping[str, float], start: float, q: float) -> float:
    """T_bcast: publication -> installed on a fraction q of the workers (paper §5.5.1, q = 1/gamma)."""
    t_q = capacity.t_bcast_quantile([t - start for t in times.values()], len(times), q)
    assert t_q is not None  # every worker of `times` has installed
    return t_q


def measure_t_bcast(
    n_workers: int, net: Network, link_mbps: float = 100.0, q: float = 1 / 1.1
) -> float:
    """T_bcast of one publication to `n_workers` identical workers with link `link_mbps` (the chain
    model used by `echo2 plan` to estimate T_bcast from snapshot size, B0 and Bw)."""
    names = [f"w{i}" for i in range(n_workers)]
    times, _ = install_times(names, net, dict.fromkeys(names, link_mbps))
    return t_bcast_quantile(times, 0.0, q)
