"""The flow model of a chain repaired during a broadcast (a relay that died or slowed mid-publication).

The relay's tail keeps receiving from it until the fault (dead) or at the slowed rate (slow); after the relay
timeout the tail is re-attached to the nearest healthy ancestor (``ChainPlan.upstream``) and resumes from the
chunks it holds. Chunk k leaves hop j at max(its arrival at hop j-1, chunk k-1's departure from hop j) + s_j,
s_j = chunk_bits / rate_j with the rates of ``sim.network.chain_install_times``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from echo2sdk.core.broadcast.planner import SOURCE, ChainPlan
from echo2sdk.sim.network import MBIT, Network, _fanout

__all__ = ["repaired_install_times"]


def repaired_install_times(
    plan: ChainPlan,
    chain: Sequence[str],
    relay: str,
    anchor: str,
    net: Network,
    link_mbps: Mapping[str, float],
    *,
    t0: float,
    t_fault: float,
    t_fix: float,
    kind: str,
    factor: float,
) -> list[tuple[str, float]]:
    """Install-complete times, chunk by chunk, of the workers downstream of `relay` (on `chain` of `plan`, the
    publication made at `t0`) when it died ("drop") or its forwarding slowed by `factor` ("slow") at `t_fault`
    and its tail was re-attached to `anchor` at `t_fix`. Returns (worker, time) for the relay's tail in chain
    order, then for the leaves hanging off the relay or its tail, in plan order."""
    K, bits = net.chunks, net.chunk_bits
    rate = _hop_rate(plan, net, link_mbps)
    i = chain.index(relay)
    tail = list(chain[i + 1 :])
    arrivals: dict[str, list[float]] = {SOURCE: [t0] * K}
    prev = SOURCE
    for w in chain[: i + 1]:  # as they happened, up to the relay
        arrivals[w] = _pipelined(arrivals[prev], bits / rate(prev, w))
        prev = w
    s_old = bits / rate(relay, tail[0])
    s_slow = bits / rate(relay, tail[0], factor) if kind == "slow" else math.inf
    s_new = bits / rate(anchor, tail[0])
    out = []
    for j, w in enumerate(tail):
        if j == 0:
            arrivals[w] = _past_the_fault(arrivals[relay], arrivals[anchor], (s_old, s_slow, s_new), t_fault, t_fix, kind)
        else:
            arrivals[w] = _pipelined(arrivals[prev], bits / rate(prev, w))
        prev = w
        out.append((w, arrivals[w][-1] + net.install_s))
    for leaf, parent in plan.leaves:
        if parent in tail or parent == relay:
            src = anchor if parent == relay else parent
            last = _pipelined(arrivals[src], bits / rate(src, leaf), t_fix if parent == relay else -math.inf)[-1]
            out.append((leaf, last + net.install_s))
    return out


def _hop_rate(plan: ChainPlan, net: Network, link_mbps: Mapping[str, float]) -> Callable[..., float]:
    """rate(sender, receiver, up_factor=1.0) in bit/s: min(sender uplink (times up_factor) / its fan-out,
    receiver link); the learner uplink B0 split over the seeds."""
    fan = _fanout(plan)
    src_up = math.inf if net.B0_mbps is None else net.B0_mbps * MBIT
    seeds = max(1, len(plan.chains))

    def rate(sender: str, receiver: str, up_factor: float = 1.0) -> float:
        if sender == SOURCE:
            up = src_up / seeds
        else:
            up = link_mbps[sender] * up_factor * MBIT / fan.get(sender, 1)
        return min(up, link_mbps[receiver] * MBIT)

    return rate


def _pipelined(upstream: Sequence[float], s: float, not_before: float = -math.inf) -> list[float]:
    """Store-and-forward over one hop of `s` seconds per chunk: the chunks' departure times, chunk k leaving at
    max(its arrival `upstream[k]`, chunk k-1's departure, `not_before`) + s."""
    arr, last = [], -math.inf
    for at in upstream:
        last = max(at, last, not_before) + s
        arr.append(last)
    return arr


def _past_the_fault(
    at_relay: Sequence[float], at_anchor: Sequence[float], s: tuple[float, float, float], t_fault: float,
    t_fix: float, kind: str,
) -> list[float]:
    """The relay's first successor: chunk departures (s = its seconds per chunk from the relay, from the slowed
    relay, from the anchor). A chunk that left the relay before the fault keeps its time; a slowed relay moves
    the rest of a chunk at its slowed rate until the timeout; after it, chunks come from the anchor."""
    s_old, s_slow, s_new = s
    arr, last = [], -math.inf
    for k in range(len(at_relay)):
        start = max(at_relay[k], last)
        if start + s_old <= t_fault:
            last = start + s_old  # left the relay before the fault
        elif kind == "slow" and start < t_fix:
            done = max(0.0, t_fault - start) / s_old  # fraction moved at full speed
            last = max(start, t_fault) + (1 - done) * s_slow
        else:
            last = max(at_anchor[k], last, t_fix) + s_new
        arr.append(last)
    return arr
