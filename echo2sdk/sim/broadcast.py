"""A simulated run's publications: install times from the network model over the real chain planner, the
relay scores it learns from, and the repair of a chain whose relay fails mid-broadcast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from echo2sdk.core.broadcast.planner import SOURCE, ChainPlan, WorkerScores
from echo2sdk.core.delta import Anchors
from echo2sdk.sim.clock import EventQueue
from echo2sdk.sim.inputs import SimConfig
from echo2sdk.sim.network import MBIT, Network, _fanout, install_times
from echo2sdk.sim.repair import repaired_install_times
from echo2sdk.sim.workers import WorkerState

__all__ = ["Dissemination"]


class Dissemination:
    """Publishes snapshots to the pool's active workers, scheduling an "installed" event per worker on
    `events`. `published[v]`: {"t0", "expected" (names), "installed" (name -> time, filled by the
    simulation), "plan", "times" (planned installs), "kind" ("full" or "delta"), "net" (the network carrying it:
    its bytes)}; `stalls[name]`: (planned, actual) installs delayed by a relay fault. With net.delta_ratio, a
    publication is a delta or a full anchor as core.delta.plan_publication decides (a full one when a recipient
    lacks the previous publication)."""

    def __init__(self, cfg: SimConfig, workers: Mapping[str, WorkerState], events: EventQueue):
        self.cfg, self.w, self.events = cfg, workers, events
        self.scores = WorkerScores()
        self.published: dict[int, dict[str, Any]] = {}
        self.latest_published = 0
        self.current_plan: ChainPlan | None = None
        self.stalls: dict[str, list[tuple[float, float]]] = {}
        self.anchors = Anchors(cfg.net.anchor_every)  # full or delta, as the learner decides it

    def _link(self, name: str) -> float:
        """What the worker can receive (Mbit/s)."""
        return self.w[name].spec.link_mbps

    def _up(self, name: str) -> float:
        """What the worker forwards at (Mbit/s): its link, times a relay slow-down factor."""
        w = self.w[name]
        return w.spec.link_mbps * w.link_factor

    def publish(self, v: int) -> None:
        """Version `v` to every active worker that lacks it; under "pause" each stops generating until its
        install."""
        now = self.events.now
        names = [n for n, w in self.w.items() if w.state == "active" and w.installed < v]
        links = {n: self._link(n) for n in names}
        ups = {n: self._up(n) for n in names}
        kind, net = self._carrier(names)
        times, plan = install_times(names, net, links, scores=self.scores, now=now, start=now, up_mbps=ups)
        self.current_plan = plan
        self.latest_published = v
        self.published[v] = {"t0": now, "expected": set(names), "installed": {}, "plan": plan, "times": times,
                             "kind": kind, "net": net}
        for n, t in times.items():
            w = self.w[n]
            w.install_token += 1
            self.events.push(t, "installed", n, v, w.install_token, w.epoch)
            if self.cfg.rollout_during_bcast == "pause":
                w.paused_for = v
        if plan is not None:  # relay statistics for the next plan (paper C.3)
            self._score_relays(plan, ups)

    def _carrier(self, names: list[str]) -> tuple[str, Network]:
        """The next publication's kind and the network carrying it: a full snapshot, or a delta when every
        recipient holds the previous publication (its base)."""
        net = self.cfg.net
        if net.delta_ratio is None:
            return "full", net
        has_base = bool(self.published) and all(self.w[n].installed >= self.latest_published for n in names)
        full = net.snapshot_bytes
        kind = self.anchors.next(has_base, full * net.delta_ratio, full)
        return kind, net.publication(anchor=kind == "full")

    def _score_relays(self, plan: ChainPlan, links: Mapping[str, float]) -> None:
        fan = _fanout(plan)
        for chain in plan.chains:
            for w in chain:
                if fan.get(w, 0):
                    self.scores.record_success(w, links[w] * MBIT / 8 / fan[w])

    def reroute(self, relay: str, kind: str, factor: float) -> float | None:
        """A relay died ("drop") or its forwarding slowed by `factor` ("slow") during the current
        broadcast. Its tail keeps receiving from it until the fault (dead) or at the slowed rate (slow);
        after ``relay_timeout_s`` the relay is excised and the tail re-attached to the nearest healthy
        ancestor (``ChainPlan.upstream``), resuming from the chunks it holds (sim/repair.py). Reschedules the
        tail's installs and records each delay as a stall. Returns when the last delayed worker has installed
        (None when the broadcast was not affected)."""
        plan = self.current_plan
        pub = self.published.get(self.latest_published)
        if plan is None or pub is None or pub["plan"] is not plan:
            return None
        chain = next((c for c in plan.chains if relay in c), None)
        if chain is None or chain[-1] == relay:
            return None  # not forwarding to anyone
        if all(self.w[x].installed >= self.latest_published for x in chain[chain.index(relay) + 1 :]):
            return None  # this broadcast is already through
        now = self.events.now
        anchor = next((p for p in plan.upstream(relay) if p == SOURCE or self.w[p].state == "active"), SOURCE)
        links = {n: w.spec.link_mbps for n, w in self.w.items()}
        times = repaired_install_times(plan, chain, relay, anchor, pub["net"], links, t0=pub["t0"], t_fault=now,
                                       t_fix=now + self.cfg.relay_timeout_s, kind=kind, factor=factor)
        resolved = now
        for name, t in times:
            self._delay_install(name, t, pub)
            resolved = max(resolved, t)
        self.scores.record_failure(relay, now)
        return resolved

    def _delay_install(self, name: str, t: float, pub: dict[str, Any]) -> None:
        w = self.w[name]
        if w.installed >= self.latest_published or w.state != "active":
            return
        now = self.events.now
        planned = pub["times"].get(name, t)
        if t > planned:
            self.stalls.setdefault(name, []).append((planned, t))
            if self.cfg.record_timeline:  # sample the pool rate inside the stall and right after it
                self.events.push(max(now, planned), "probe")
                self.events.push(t, "probe")
        w.install_token += 1
        self.events.push(max(now, t), "installed", name, self.latest_published, w.install_token, w.epoch)

    def stalled(self, name: str, now: float) -> bool:
        """Whether `name`'s install is held up behind a failed or slowed relay at `now`."""
        return any(a <= now < b for a, b in self.stalls.get(name, ()))
