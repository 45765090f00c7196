"""Launch latency, spot preemptions and early activation on the simulator (`echo2 simulate launch`)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from echo2sdk.core.scheduler import Action
from echo2sdk.errors import ConfigError
from echo2sdk.sim import MBIT, SimConfig, Simulation, SimWorker, paper, simulate
from echo2sdk.sim import launch as launch_mod


def _cfg(**kw):
    return paper.base_config(paper.mixed_pool(), steps=kw.pop("steps", 12), gamma=kw.pop("gamma", 1.0), **kw)


def test_launch_latency_is_a_value_a_uniform_or_a_triangular_spread_and_boot_s_still_works():
    pool = [SimWorker("a", 0.35, 0.3)]
    rng = random.Random(0)
    assert SimConfig(pool=pool, T_train=10.0, R=16, boot_s=45.0).launch_range == (45.0, 45.0, 45.0)
    assert SimConfig(pool=pool, T_train=10.0, R=16, launch_s=0.0).draw_launch(rng) == 0.0
    uni = SimConfig(pool=pool, T_train=10.0, R=16, launch_s=(120.0, 360.0))
    tri = SimConfig(pool=pool, T_train=10.0, R=16, launch_s=(120.0, 180.0, 360.0))
    assert uni.launch_range == (120.0, 240.0, 360.0) and tri.launch_range == (120.0, 220.0, 360.0)
    draws = [tri.draw_launch(rng) for _ in range(2000)]
    assert 120.0 <= min(draws) and max(draws) <= 360.0 and sum(draws) / len(draws) == pytest.approx(220.0, rel=0.03)
    with pytest.raises(ConfigError, match=r"launch_s must be ordered.*\(360.0, 120.0\)"):
        SimConfig(pool=pool, T_train=10.0, R=16, launch_s=(360.0, 120.0))
    with pytest.raises(ConfigError, match="launch_s must be seconds"):
        SimConfig(pool=pool, T_train=10.0, R=16, launch_s=(1.0, 2.0, 3.0, 4.0))
    with pytest.raises(ConfigError, match="preempt_per_hour"):
        SimConfig(pool=pool, T_train=10.0, R=16, preempt_per_hour=-0.1)
    with pytest.raises(ConfigError, match="kind of worker 'a'"):
        SimWorker("a", 0.35, 0.3, kind="")
    # boot_s keeps working: launch_s=None draws it, the same run as launch_s = boot_s
    a, b = simulate(_cfg(steps=6, boot_s=90.0)), simulate(_cfg(steps=6, launch_s=90.0))
    assert (a.cost_per_step, a.bubble_ratio, a.actions) == (b.cost_per_step, b.bubble_ratio, b.actions)


def test_a_launch_is_billed_from_its_activation_and_ready_after_launch_fetch_and_install():
    cfg = _cfg(launch_s=(200.0, 200.0), closed_loop=False)
    sim = Simulation(cfg)
    w = sim.w["a100-00"]
    sim._apply(Action("activate", "a100-00", 0.0, "test"))
    assert w.state == "booting" and w.billed_since == 0.0  # billed while it launches
    while w.state == "booting":
        kind, data = sim.events.pop()
        getattr(sim, "_on_" + kind)(*data)
    fetch = cfg.net.snapshot_bytes * 8 / (cfg.storage_mbps * MBIT)
    assert w.state == "active" and sim.now == pytest.approx(200.0 + fetch + cfg.net.install_s)


def test_preempted_machines_die_silently_are_replaced_and_their_slot_returns_to_the_pool():
    cfg = _cfg(steps=16, launch_s=(120.0, 180.0, 360.0), preempt_per_hour=1.0)
    r = simulate(cfg)
    pre = [f for f in r.faults if f["kind"] == "preempt"]
    assert len(pre) >= 10 and r.steps == 16
    for f in pre[:5]:  # noticed by silence only: declared failed after fail_after_s, replaced at once
        failed = next(a for a in r.actions if a["kind"] == "failed" and a["worker"] == f["worker"] and a["t"] >= f["t"])
        assert cfg.fail_after_s <= failed["t"] - f["t"] <= cfg.fail_after_s + 2 * cfg.heartbeat_s
        assert "silent" in failed["reason"]
        assert any(a["kind"] == "activate" and a["t"] == failed["t"] for a in r.actions)
    again = {a["worker"] for a in r.actions if a["kind"] == "activate"} & {f["worker"] for f in pre}
    assert again  # a preempted slot was rented again later
    none = simulate(replace(cfg, preempt_per_hour=0.0))
    assert not [f for f in none.faults if f["kind"] == "preempt"]


def test_early_activation_lowers_the_bubble_at_a_cost_and_changes_nothing_without_lead_or_preemptions():
    out = launch_mod.launch_grid(rates=(0.0, 1.0), seeds=(0, 1), steps=40)
    rows = {(r["launch"], r["preempt_per_hour"], r["anticipate"]): r for r in out["rows"]}
    assert len(rows) == 8
    off, on = rows[("2-6 min", 1.0, False)], rows[("2-6 min", 1.0, True)]
    assert off["preemptions"] >= 50
    assert on["bubble_ratio"] < off["bubble_ratio"] and off["bubble_ratio"] > 0.002
    assert on["cost_per_step"] > off["cost_per_step"] and on["machines_mean"] > off["machines_mean"]
    assert on["releases"] == 0  # the anticipated spare is kept, not released and launched again
    for launch in ("0 s", "2-6 min"):  # no preemptions: nothing to anticipate, the same runs
        a, b = rows[(launch, 0.0, False)], rows[(launch, 0.0, True)]
        assert a["per_seed"] == b["per_seed"]
    # instant launches: no bubble to remove (a replacement still fetches the snapshot: L ~ 3 min)
    assert rows[("0 s", 1.0, False)]["bubble_ratio"] == rows[("0 s", 1.0, True)]["bubble_ratio"] == 0.0
    lines = launch_mod.launch_lines(out)
    assert lines[2].startswith("| launch |") and len(lines) == 4 + 8


def test_echo2_simulate_launch_prints_the_table_and_writes_json(tmp_path, monkeypatch, capsys):
    from echo2sdk.cli import main

    real = launch_mod.launch_grid
    monkeypatch.setattr(launch_mod, "launch_grid", lambda **kw: real(rates=(0.3,), seeds=(0,), steps=4))
    assert main(["simulate", "launch", "--quick", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| 2-6 min | 0.3 | on |" in printed and "| 0 s | 0.3 | off |" in printed
    saved = json.loads((tmp_path / "launch.json").read_text())
    assert len(saved["rows"]) == 4 and saved["rows"][0]["launch_s"] == 0.0
