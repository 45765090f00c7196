"""The discrete-event simulator: network model, real buffer/scheduler/planner in the loop, paper shapes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from echo2sdk.sim import paper
from echo2sdk.core import capacity
from echo2sdk.core.broadcast.planner import SOURCE, plan_chains
from echo2sdk.sim import (
    GB,
    MBIT,
    Fault,
    Network,
    SimConfig,
    SimWorker,
    chain_install_times,
    measure_t_bcast,
    provision,
    simulate,
    star_install_times,
)
from echo2sdk.errors import CapacityError, ConfigError

# ---------------------------------------------------------------- network model


def _recursion(path_rates_bps: list[float], K: int, chunk_bits: float) -> float:
    """Oracle: chunk k leaves hop d at max(arrival at hop d-1, previous chunk done on hop d) + s_d."""
    prev = [0.0] * K
    for r in path_rates_bps:
        s, cur, last = chunk_bits / r, [], 0.0
        for k in range(K):
            last = max(prev[k], last) + s
            cur.append(last)
        prev = cur
    return prev[-1]


def test_star_unlimited_and_limited_match_the_flow_formulas():
    net = Network(snapshot_bytes=1 * GB, B0_mbps=None, topology="star")
    names = [f"w{i}" for i in range(10)]
    links = dict.fromkeys(names, 100.0)
    t = star_install_times(names, net, links)
    assert all(v == pytest.approx(8e9 / (100 * MBIT)) for v in t.values())  # 80 s each
    limited = star_install_times(names, replace(net, B0_mbps=300.0), links)
    assert all(v == pytest.approx(10 * 8e9 / (300 * MBIT)) for v in limited.values())  # B0 shared: N*G/B0


def test_star_rates_are_max_min_fair_and_reshared_when_flows_finish():
    net = Network(snapshot_bytes=1 * GB, B0_mbps=150.0, topology="star")
    t = star_install_times(["slow", "fast"], net, {"slow": 50.0, "fast": 200.0})
    assert t["slow"] == pytest.approx(160.0)  # capped at 50 Mbit/s throughout
    # fast: 100 Mbit/s while slow runs (150 - 50) -> 8 Gbit done at 80 s
    assert t["fast"] == pytest.approx(80.0)


def test_chain_closed_form_equals_the_per_chunk_recursion():
    net = Network(snapshot_bytes=2 * GB, B0_mbps=250.0, chunk_bytes=128 * 2**20, install_s=5.0)
    names = [f"w{i}" for i in range(7)]
    links = {n: 100.0 for n in names} | {"w4": 40.0}  # one slow link in the middle of a chain
    plan = plan_chains(names, 2)  # two chains: w0 w2 w4 w6 / w1 w3 w5
    t = chain_install_times(plan, net, links)
    K, bits = net.chunks, net.chunk_bits
    seed = min(250.0 / 2, 100.0) * MBIT
    expected_w6 = _recursion([seed, 100 * MBIT, 40 * MBIT, 40 * MBIT], K, bits)  # w4 receives and sends at 40
    assert t["w6"] == pytest.approx(expected_w6 + 5.0)
    assert t["w5"] == pytest.approx(_recursion([seed, 100 * MBIT, 100 * MBIT], K, bits) + 5.0)


def test_chain_broadcast_stays_flat_while_star_limited_grows_with_n():
    net = Network(snapshot_bytes=16.38 * GB, B0_mbps=300.0)
    chain = [measure_t_bcast(n, net) for n in (8, 32, 64)]
    star = [measure_t_bcast(n, replace(net, topology="star")) for n in (8, 32, 64)]
    unlimited = measure_t_bcast(64, Network(snapshot_bytes=16.38 * GB, B0_mbps=None, topology="star"))
    assert chain[-1] < 1.2 * unlimited  # within a small constant of star-unlimited
    assert star[2] / star[1] == pytest.approx(2.0, rel=0.05)  # N * G / B0
    assert star[-1] > 10 * chain[-1]


def test_bad_network_and_config_values_are_named():
    with pytest.raises(ConfigError, match="B0_mbps.*-1"):
        Network(snapshot_bytes=1e9, B0_mbps=-1)
    with pytest.raises(ConfigError, match="topology.*'ring'"):
        Network(snapshot_bytes=1e9, topology="ring")
    pool = [SimWorker("a", 0.35, 0.3)]
    with pytest.raises(ConfigError, match="R=20 must be a multiple of group_size=16"):
        SimConfig(pool=pool, T_train=10.0, R=20)
    with pytest.raises(CapacityError, match="S must be >= 2"):
        SimConfig(pool=pool, T_train=10.0, R=16, S=1)
    with pytest.raises(CapacityError, match="mu of worker 'a'.*-0.3"):
        SimWorker("a", 0.35, -0.3)
    with pytest.raises(ConfigError, match="active names workers not in the pool: \\['zz'\\]"):
        SimConfig(pool=pool, T_train=10.0, R=16, active=["zz"])
    with pytest.raises(ConfigError, match="solver must be 'exact' or 'greedy', got solver='lp'"):
        SimConfig(pool=pool, T_train=10.0, R=16, solver="lp")


def test_delta_network_values_are_named_and_the_typical_publication_is_the_cycle_mean():
    with pytest.raises(ConfigError, match="delta_ratio"):
        Network(snapshot_bytes=1e9, delta_ratio=0.0)
    with pytest.raises(ConfigError, match="delta_ratio"):
        Network(snapshot_bytes=1e9, delta_ratio=1.5)
    with pytest.raises(ConfigError, match="anchor_every"):
        Network(snapshot_bytes=1e9, delta_ratio=0.05, anchor_every=-1)
    net = Network(snapshot_bytes=1e9, delta_ratio=0.05, anchor_every=10)
    assert net.typical().snapshot_bytes == pytest.approx(1e9 * (1 + 9 * 0.05) / 10)
    assert replace(net, anchor_every=0).typical().snapshot_bytes == pytest.approx(0.05e9)
    assert net.publication(anchor=True).snapshot_bytes == 1e9 and net.publication(anchor=False).snapshot_bytes == 0.05e9
    assert Network(snapshot_bytes=1e9).typical().snapshot_bytes == 1e9


# ---------------------------------------------------------------- the loop with real components


def _small(n=6, S=3, steps=16, **kw):
    return paper.base_config(paper.paper_pool(n), S=S, steps=steps, activation="all", **kw)


def test_buffer_invariants_and_staleness_bound_hold_in_a_run():
    r = simulate(_small(8))
    b = r.buffer
    assert r.steps == 16
    assert b["admitted"] == b["sampled"] + b["evicted"] + b["held"]
    assert b["sampled"] == 16 * paper.PAPER["R"] // paper.PAPER["group_size"]
    assert r.staleness_max <= 3  # S: the real StalenessBuffer never hands out older data
    assert sum(r.staleness_hist.values()) == 16 * paper.PAPER["R"]


def test_bubble_vanishes_within_one_worker_of_the_eq2_threshold_and_S_moves_the_knee_left():
    mu = paper.PAPER["mu_5090"]
    knees = {}
    for S in (3, 6):
        thr = paper._threshold(S, mu)
        n_star = thr["workers"]
        assert n_star == math.ceil(thr["workers_exact"])
        at_plus_1 = simulate(_small(n_star + 1, S=S)).bubble_ratio
        assert at_plus_1 <= 0.02
        below = simulate(_small(n_star - 2, S=S)).bubble_ratio
        assert below > 0.05  # a knee, not a flat line
        knees[S] = next(n for n in range(2, n_star + 2) if simulate(_small(n, S=S)).bubble_ratio <= 0.02)
    assert knees[6] < knees[3]


def test_overlap_semantics_need_fewer_workers_than_the_paper_model():
    # Our worker keeps generating while a snapshot arrives; eq. (1) assumes it does not (Appendix B.1).
    n = 5
    pause = simulate(_small(n, rollout_during_bcast="pause")).bubble_ratio
    overlap = simulate(_small(n, rollout_during_bcast="overlap")).bubble_ratio
    assert overlap < pause


def test_cost_aware_activation_provisions_the_target_and_beats_random_on_a_mixed_pool():
    pool = paper.mixed_pool()
    full = simulate(paper.base_config(pool, steps=12))
    assert full.bubble_ratio <= 0.02
    assert all(n.startswith("rtx5090") for n in full.initial_active)
    assert sum(w.mu for w in pool if w.name in full.initial_active) >= full.mu_target
    rand = [simulate(paper.base_config(pool, steps=12, activation="random", seed=s)) for s in range(3)]
    assert sum(r.cost_per_step_steady for r in rand) / 3 > 1.13 * full.cost_per_step_steady


def test_the_solver_picks_the_initial_pool_exact_by_default():
    # the example: b has the lower rho, d alone reaches mu_target (about 0.18 rollouts/s here)
    pool = [SimWorker("b", 0.55, 4.5), SimWorker("d", 0.12, 0.7)]
    cfg = SimConfig(pool=pool, T_train=100.0, R=16, S=3, steps=3, net=Network(snapshot_bytes=1e6), closed_loop=False)
    assert cfg.solver == "exact"
    assert simulate(cfg).initial_active == ["d"]
    assert simulate(replace(cfg, solver="greedy")).initial_active == ["b"]
    chosen, t_bcast, ok = provision([w.offer for w in pool], T_train=100.0, R=16, kappa=2, gamma=1.1, t_bcast=10.0,
                                    solver="greedy")
    assert [o.name for o in chosen] == ["b"] and t_bcast == 10.0 and ok


def test_a_dropped_worker_is_replaced_from_the_standby_pool():
    cfg = paper.base_config(paper.paper_pool(12, mu=0.29), steps=16, gamma=1.0)  # 8 minimal, 6% headroom
    base = simulate(cfg)
    assert base.machines_initial == 8 and base.actions == []
    r = simulate(replace(cfg, faults=(Fault(8 * cfg.T_train, "rollout", "drop"),)))
    kinds = [(a["kind"], a["worker"]) for a in r.actions]
    dead = r.faults[0]["worker"]
    assert kinds[0] == ("failed", dead) and kinds[1][0] == "activate"
    assert kinds[1][1] not in base.initial_active  # a standby worker
    assert any(w == kinds[1][1] for _, w in r.ready_log)
    assert r.actions[1]["t"] - r.faults[0]["t"] <= cfg.fail_after_s + cfg.heartbeat_s


def test_a_dead_relay_stalls_its_tail_which_is_reattached_and_installs():
    cfg = paper.base_config(paper.paper_pool(12, mu=0.29), steps=16, gamma=1.0, record_timeline=True)
    base = simulate(cfg)
    pub = next(p for p in base.publications if p["t0"] > 5 * cfg.T_train)
    r = simulate(replace(cfg, faults=(Fault(pub["t0"] + 100.0, "forwarder", "drop"),)))
    f = r.faults[0]
    assert f["worker"] is not None and f["chain_resolved_at"] is not None
    delayed = f["chain_resolved_at"] - pub["t0"]
    assert delayed > pub["t_bcast_all_s"]  # the tail waited for the relay timeout
    assert delayed < pub["t_bcast_all_s"] + cfg.relay_timeout_s + 60
    after = next(p for p in r.publications if p["version"] == pub["version"])
    assert after["t_bcast_all_s"] is None or after["workers"] >= 7  # the tail did install


def test_planner_upstream_gives_the_repair_anchor():
    plan = plan_chains(["a", "b", "c", "d"], 2)  # a c / b d
    assert plan.upstream("c") == ("a", SOURCE) and plan.upstream("a") == (SOURCE,)


def test_76_workers_x_100_steps_completes():
    r = paper.scale_run(workers=76, steps=100)
    assert r["steps"] == 100 and r["workers"] == 76
    assert r["groups_admitted"] >= 100 * 256


def test_infeasible_deployment_stops_instead_of_spinning():
    pool = [SimWorker("a", 0.35, 0.01)]
    cfg = SimConfig(pool=pool, T_train=10.0, R=16, S=3, steps=5, net=Network(snapshot_bytes=1e6), activation="all",
                    max_time_s=500.0)
    r = simulate(cfg)
    assert r.steps < 5 and "time limit" in (r.stuck or "")


def test_capacity_threshold_uses_the_real_capacity_rule():
    thr = paper._threshold(3, 0.28)
    assert thr["mu_min"] == pytest.approx(capacity.mu_min(1631.2, thr["t_bcast_s"], 2048, 2))


def test_paper_outputs_json_and_pngs(tmp_path):
    f3 = paper.fig3c(S_values=(3,), Ns=(6, 8), steps=8, overlap_S=())
    t2 = paper.table2(steps=8, random_seeds=(0,))
    results = {
        "fig3c": f3,
        "fig4": paper.fig4(Ns=(1, 8), B0s=(300,)),
        "table2": t2,
        "table4": paper.table4(steps=12),
        "cost": paper.cost_comparison(t2["rows"]["Full"]["cost_per_step"]),
        "scale": paper.scale_run(workers=8, steps=3),
    }
    lines = paper.summary_lines(results)
    assert any(line.startswith("fig3c pause/S=3") for line in lines) and any("cost/step" in x for x in lines)
    paths = paper.plot_paper(results, tmp_path)
    assert {p.name for p in paths} == {
        "fig3c_bubble_vs_pool.png", "fig4_tbcast_vs_n.png", "table2_ablation.png", "table4_faults.png"
    }
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["cost"]["sync_cost_per_step"] == pytest.approx(8 * 3.06 * 1508.2 / 3600)


def test_delta_publications_follow_the_anchor_rule_and_cut_t_bcast():
    net = replace(paper._net(), delta_ratio=0.05, anchor_every=4)
    full = simulate(_small(8, steps=20))
    delta = simulate(_small(8, steps=20, net=net))
    kinds = [p["kind"] for p in delta.publications]
    assert all(p["kind"] == "full" for p in full.publications)
    assert kinds[:5] == ["full", "delta", "delta", "delta", "full"]  # an anchor first, then every 4th
    by_kind = {k: [p["t_bcast_s"] for p in delta.publications if p["kind"] == k and p["t_bcast_s"]] for k in ("full", "delta")}
    assert max(by_kind["delta"]) < 0.2 * min(by_kind["full"])  # 5 % of the bytes, plus the install time
    assert delta.t_bcast_s < full.t_bcast_s and delta.bubble_ratio <= full.bubble_ratio
    assert delta.buffer["sampled"] == full.buffer["sampled"] and delta.staleness_max <= 3


def test_a_worker_without_the_previous_publication_gets_a_full_snapshot():
    from echo2sdk.sim.broadcast import Dissemination
    from echo2sdk.sim.clock import EventQueue
    from echo2sdk.sim.workers import WorkerState

    cfg = _small(4, net=replace(paper._net(), delta_ratio=0.05, anchor_every=0))
    workers = {w.name: WorkerState(w, state="active") for w in cfg.pool}
    d = Dissemination(cfg, workers, EventQueue())

    def publish(v: int) -> str:
        d.publish(v)
        return d.published[v]["kind"]

    def install_all(v: int) -> None:
        for w in workers.values():
            w.installed = v

    assert publish(2) == "full"  # no base yet
    install_all(2)
    assert publish(4) == "delta" and d.published[4]["net"].snapshot_bytes == pytest.approx(0.05 * paper.PAPER["snapshot_bytes"])
    install_all(4)
    workers[cfg.pool[0].name].installed = 2  # missed v4: a delta against v4 is of no use to it
    assert publish(6) == "full"
    install_all(6)
    assert publish(8) == "delta"  # anchor_every = 0: anchors only when needed


def test_delta_snapshots_experiment_lowers_t_bcast_and_mu_min_at_each_S():
    out = paper.delta_snapshots(0.03, S_values=(3, 6), pool_size=14, steps=12)
    for S in (3, 6):
        f, d = out["rows"][f"S={S}/full"], out["rows"][f"S={S}/delta"]
        assert d["t_bcast_eq2_s"] < f["t_bcast_eq2_s"] and d["mu_min"] < f["mu_min"]
        assert d["workers_eq2"] <= f["workers_eq2"] and d["cost_per_step"] <= f["cost_per_step"] + 1e-9
