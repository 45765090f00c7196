"""Dynamic sampling against the capacity rule (issue 35): the predicted filter rate, the rule in useful rollouts,
and the simulator's learner starving on a pool sized on raw rollouts but not on one sized on useful ones; the
learner's pre-rollout prompt skipping priced on the simulator (issue 44)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from echo2sdk.core import capacity
from echo2sdk.errors import CapacityError, ConfigError
from echo2sdk.sim import filtering, simulate
from echo2sdk.sim.paper import base_config, paper_pool


def test_filter_rate_of_binary_rewards():
    assert capacity.filter_rate(0.10, 4) == pytest.approx(0.6562)
    assert capacity.filter_rate(0.96, 4) == pytest.approx(0.8493, abs=1e-4)
    assert capacity.filter_rate(0.5, 16) == pytest.approx(2 * 0.5**16)
    assert capacity.filter_rate(0.3, 1) == 1.0  # one sample has no variance
    assert capacity.useful_rate(10.0, 0.75) == pytest.approx(2.5)
    assert capacity.raw_rate(2.5, 0.75) == pytest.approx(10.0)
    with pytest.raises(CapacityError, match="f must be < 1"):
        capacity.raw_rate(1.0, 1.0)
    with pytest.raises(CapacityError, match="p"):
        capacity.filter_rate(1.5, 4)
    with pytest.raises(CapacityError, match="G"):
        capacity.filter_rate(0.5, 0)


def _prompts_and_groups(p: float, nu: float, G: int, n: int, seed: int) -> list[int]:
    """n groups of G binary samples, each of a prompt whose success rate is drawn from Beta(p nu, (1 - p) nu):
    their correct counts k."""
    rng = random.Random(seed)
    return [sum(rng.random() < q for _ in range(G)) for q in (rng.betavariate(p * nu, (1 - p) * nu) for _ in range(n))]


@pytest.mark.parametrize("p,nu,G", [(0.3, 3.0, 4), (0.3, 0.3, 4), (0.8, 1.0, 8), (0.5, 20.0, 4)])
def test_prompts_not_alike_filter_more_groups_and_the_beta_binomial_predicts_how_many(p, nu, G):
    """Level-2 math measured f 0.75-0.93 where p^G + (1 - p)^G said 0.13-0.27: some prompts are always solved,
    some never. With the prompts' rates spread as a Beta, the closed form matches 20000 simulated groups, and the
    concentration nu estimated from their correct counts alone (as the buffer counts them: sum k (k - 1)) gives back
    the same f."""
    ks = _prompts_and_groups(p, nu, G, 20000, seed=7)
    measured = sum(k in (0, G) for k in ks) / len(ks)
    f = capacity.filter_rate(p, G, nu)
    assert f == pytest.approx(measured, abs=0.015)
    assert f >= capacity.filter_rate(p, G) - 1e-12  # a spread never filters fewer than alike prompts
    p_hat = sum(ks) / (G * len(ks))
    nu_hat = capacity.prompt_concentration(len(ks), G, sum(ks), sum(k * (k - 1) for k in ks))
    assert nu_hat == pytest.approx(nu, rel=0.25)
    assert capacity.filter_rate(p_hat, G, nu_hat) == pytest.approx(measured, abs=0.015)


def test_the_beta_binomial_limits():
    assert capacity.filter_rate(0.3, 4, 1e9) == pytest.approx(capacity.filter_rate(0.3, 4))  # nu -> inf: alike
    assert capacity.filter_rate(0.3, 4, capacity.NU_FLOOR) > 0.999  # every prompt always or never solved
    assert capacity.filter_rate(0.0, 4, 2.0) == capacity.filter_rate(1.0, 4, 2.0) == 1.0
    assert capacity.filter_rate(0.4, 1, 2.0) == pytest.approx(1.0)
    # p = 0.5, nu = 1 (a = b = 1/2): 2 * (1/2 * 3/2 * 5/2 * 7/2) / 4! = 0.546875
    assert capacity.filter_rate(0.5, 4, 1.0) == pytest.approx(0.546875)
    pc = capacity.prompt_concentration  # (m groups, G, sum k, sum k (k - 1))
    assert pc(2, 4, 4, 12) == capacity.NU_FLOOR  # one prompt always solved, one never: the widest spread
    assert pc(2, 4, 0, 0) is None and pc(2, 4, 8, 24) is None  # none or all solved: nothing to tell apart
    assert pc(1, 4, 2, 2) is None and pc(5, 1, 2, 0) is None  # one group, or one sample a group
    # groups of k = 1 and 3 (as prompts each solved half the time spread them): only the sampling noise of the
    # mean is left, a large nu (alike, all but)
    assert pc(20, 4, 40, 60) > 50 and capacity.filter_rate(0.5, 4, pc(20, 4, 40, 60)) == pytest.approx(0.125, abs=0.01)
    assert pc(20, 4, 40, 40) is None  # every group k = 2: narrower than a binomial, no spread at all
    with pytest.raises(CapacityError, match="nu"):
        capacity.filter_rate(0.5, 4, 0.0)
    with pytest.raises(CapacityError, match="pairs"):
        capacity.prompt_concentration(2, 4, 4, 13)  # more pairs than 4 correct answers allow
    with pytest.raises(CapacityError, match="pairs = 0 is too few for correct = 7"):
        capacity.prompt_concentration(2, 4, 7, 0)  # 7 right in 2 groups of 4: one has 4, the other 3


def _dirichlet_groups(q: tuple, nu: float, G: int, n: int, seed: int) -> list[list[int]]:
    """n groups of G rewards, each of a prompt whose shares of the values are drawn from Dirichlet(nu * q): each
    group's count of every value."""
    rng = random.Random(seed)
    groups = []
    for _ in range(n):
        g = [rng.gammavariate(nu * v, 1.0) for v in q]
        shares = [x / sum(g) for x in g]
        draws = rng.choices(range(len(q)), weights=shares, k=G)
        groups.append([draws.count(v) for v in range(len(q))])
    return groups


@pytest.mark.parametrize("q,nu,G", [((0.6, 0.3, 0.1), 2.0, 4), ((0.45, 0.45, 0.1), 0.5, 4), ((0.2, 0.5, 0.3), 10.0, 8)])
def test_a_reward_of_a_few_values_is_predicted_from_their_shares_and_spread(q, nu, G):
    """math's reward takes three values (0 unformatted, 0.1 boxed but wrong, 1.1 right): its filter drops a group
    whose rewards are all one of them. With the prompts' shares spread as a Dirichlet the closed form matches
    20000 simulated groups, and nu and the shares estimated from the values' counts and pairs (as the buffer
    tallies them) give back the same f."""
    groups = _dirichlet_groups(q, nu, G, 20000, seed=11)
    measured = sum(max(g) == G for g in groups) / len(groups)
    assert capacity.value_filter_rate(q, G, nu) == pytest.approx(measured, abs=0.015)
    counts = [sum(g[v] for g in groups) for v in range(len(q))]
    pairs = [sum(g[v] * (g[v] - 1) for g in groups) for v in range(len(q))]
    nu_hat = capacity.value_concentration(len(groups), G, counts, pairs)
    assert nu_hat == pytest.approx(nu, rel=0.25)
    shares = [c / (G * len(groups)) for c in counts]
    assert capacity.value_filter_rate(shares, G, nu_hat) == pytest.approx(measured, abs=0.015)


def test_two_values_are_the_binary_prediction():
    for p, G, nu in ((0.3, 4, 3.0), (0.9, 8, 0.4), (0.5, 4, None)):
        assert capacity.value_filter_rate((p, 1 - p), G, nu) == pytest.approx(capacity.filter_rate(p, G, nu))
    # groups of 4 with k right of 0, 4, 1 and 3: as right/wrong counts, the same nu as prompt_concentration's
    ks = [0, 4, 1, 3, 2]
    counts = [sum(ks), 4 * len(ks) - sum(ks)]
    pairs = [sum(k * (k - 1) for k in ks), sum((4 - k) * (3 - k) for k in ks)]
    assert capacity.value_concentration(len(ks), 4, counts, pairs) == pytest.approx(
        capacity.prompt_concentration(len(ks), 4, counts[0], pairs[0]))
    assert capacity.value_filter_rate((0.2, 0.3, 0.5), 4) == pytest.approx(0.2**4 + 0.3**4 + 0.5**4)  # alike
    assert capacity.value_concentration(3, 4, [12, 0], [36, 0]) is None  # one value only: nothing to tell
    with pytest.raises(CapacityError, match="shares must sum to 1"):
        capacity.value_filter_rate((0.5, 0.4), 4)
    with pytest.raises(CapacityError, match=r"shares\[1\]"):
        capacity.value_filter_rate((1.0, -0.5), 4)
    with pytest.raises(CapacityError, match="one entry per value"):
        capacity.value_concentration(2, 4, [4, 4], [0])
    with pytest.raises(CapacityError, match="m \\* G = 8"):
        capacity.value_concentration(2, 4, [4, 3], [0, 0])
    with pytest.raises(CapacityError, match=r"pairs\[0\]"):
        capacity.value_concentration(2, 4, [4, 4], [13, 0])


def test_no_filtering_leaves_the_simulation_as_it_was():
    a = simulate(base_config(paper_pool(16), steps=12, seed=3))
    b = simulate(base_config(paper_pool(16), steps=12, seed=3, filter_rate=0.0, provision_for="raw"))
    assert (a.bubble_ratio, a.cost_total, a.machines_mean, a.mu_target) == (
        b.bubble_ratio, b.cost_total, b.machines_mean, b.mu_target)
    assert a.groups_filtered == 0 and a.filter_rate == 0.0


def test_a_pool_sized_on_raw_rollouts_starves_the_learner_and_one_sized_on_useful_rollouts_does_not():
    raw = simulate(base_config(paper_pool(40), steps=14, seed=0, filter_rate=0.5, provision_for="raw"))
    useful = simulate(base_config(paper_pool(40), steps=14, seed=0, filter_rate=0.5, provision_for="useful"))
    assert raw.bubble_ratio > 0.15 and useful.bubble_ratio < 0.02, (raw.bubble_ratio, useful.bubble_ratio)
    assert useful.mu_target == pytest.approx(2 * raw.mu_target, rel=0.05)  # R / (1 - f) raw rollouts a step
    assert useful.machines_mean > raw.machines_mean
    assert useful.cost_per_step_steady < raw.cost_per_step_steady  # an idle learner costs more than the workers
    assert 0.4 < useful.filter_rate < 0.6 and useful.groups_filtered > 0


def test_a_bad_filter_rate_or_basis_is_named():
    with pytest.raises(ConfigError, match="filter_rate"):
        base_config(paper_pool(4), filter_rate=1.0)
    with pytest.raises(ConfigError, match="provision_for"):
        base_config(paper_pool(4), provision_for="bytes")


def test_echo2_simulate_filter_prints_the_grid(tmp_path):
    out = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "simulate", "filter", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 0")]
    assert len(rows) == 6 and (tmp_path / "filter.json").exists()
    assert "| 0.8 | raw |" in out and "| 0.8 | useful |" in out


def _same(a, b) -> bool:
    return (a.bubble_ratio, a.cost_total, a.cost_per_step_steady, a.machines_mean, a.mu_target, a.groups_filtered) == (
        b.bubble_ratio, b.cost_total, b.cost_per_step_steady, b.machines_mean, b.mu_target, b.groups_filtered)


def test_a_skip_rate_of_zero_leaves_the_simulation_as_it_was():
    """Skip rate 0 is today's simulator, whatever the precision: the same filter stream, pool and costs."""
    cfg = base_config(paper_pool(24), steps=10, seed=2, filter_rate=0.5)
    skip0 = base_config(paper_pool(24), steps=10, seed=2, filter_rate=0.5, skip_rate=0.0, skip_precision=0.3)
    assert skip0.filter_rate_after == cfg.filter_rate_after == 0.5 and skip0.R_provision == cfg.R_provision
    a, b = simulate(cfg), simulate(skip0)
    assert _same(a, b) and a.groups_filtered > 0
    # the grid's skip-0 rows are the grid as it was (no skip dimension)
    kw = {"rates": (0.5,), "seeds": (0,), "steps": 6, "pool": 24}
    before = filtering.filter_grid(**kw)["rows"]
    after = [r for r in filtering.filter_grid(**kw, skip_rates=(0.0, 0.4))["rows"] if r["skip_rate"] == 0.0]
    keys = ("filter_rate", "provision_for", "bubble_ratio", "machines_mean", "cost_per_step", "mu_target",
            "measured_filter_rate")
    assert [{k: r[k] for k in keys} for r in before] == [{k: r[k] for k in keys} for r in after]


def test_skipping_prompts_lowers_the_filter_rate_workers_and_cost_of_a_pool_sized_on_useful_rollouts():
    """f = 0.5, a share s = 0.4 of the prompts skipped, each certain to be zero-variance (p = 1): the generated
    groups are zero-variance at f_after = (0.5 - 0.4) / 0.6 = 1/6, the pool is sized on R / (1 - 1/6) raw rollouts a
    step instead of R / 0.5, and it needs fewer machines and costs less a step, the learner still fed."""
    kw = {"steps": 14, "seed": 0, "filter_rate": 0.5, "provision_for": "useful"}
    cfg = base_config(paper_pool(40), skip_rate=0.4, **kw)
    assert cfg.filter_rate_after == pytest.approx(1 / 6)
    base, skip = simulate(base_config(paper_pool(40), **kw)), simulate(cfg)
    assert 0.1 < skip.filter_rate < 0.23 and 0.4 < base.filter_rate < 0.6  # measured on the generated groups
    assert skip.mu_target == pytest.approx(base.mu_target * 0.5 / (5 / 6), rel=0.05)
    assert skip.machines_mean < 0.75 * base.machines_mean, (skip.machines_mean, base.machines_mean)
    assert skip.cost_per_step_steady < base.cost_per_step_steady
    assert skip.bubble_ratio < 0.02
    # skipping at random (p = f) skips as many useful prompts as useless ones: nothing gained
    blind = base_config(paper_pool(40), skip_rate=0.4, skip_precision=0.5, **kw)
    assert blind.filter_rate_after == pytest.approx(0.5) and blind.R_provision == pytest.approx(cfg.R * 2)
    # more zero-variance prompts skipped than there were (s p > f): f_after is clamped to 0
    assert base_config(paper_pool(4), filter_rate=0.2, skip_rate=0.4).filter_rate_after == 0.0


@pytest.mark.parametrize("kw,match", [
    ({"skip_rate": 1.0}, "skip_rate=1.0"),
    ({"skip_rate": -0.1}, "skip_rate=-0.1"),
    ({"skip_rate": math.nan}, "skip_rate=nan"),
    ({"skip_rate": "0.4"}, "skip_rate='0.4'"),
    ({"skip_rate": True}, "skip_rate=True"),
    ({"skip_rate": 0.4, "skip_precision": 1.5}, "skip_precision=1.5"),
    ({"filter_rate": 0.8, "skip_rate": 0.5, "skip_precision": 0.5}, "skip_rate=0.5 with skip_precision=0.5 leaves "
     "no useful group: filter_rate=0.8 can be at most 0.75"),
])
def test_a_bad_skip_rate_or_precision_is_named(kw, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(")):
        base_config(paper_pool(4), **kw)


def test_echo2_simulate_filter_prices_a_skip_rate_beside_none(tmp_path, monkeypatch, capsys):
    from echo2sdk.cli import main

    real = filtering.filter_grid
    monkeypatch.setattr(filtering, "filter_grid", lambda **kw: real(**{**kw, "rates": (0.0, 0.5), "steps": 6,
                                                                     "pool": 24}))
    assert main(["simulate", "filter", "--quick", "--out", str(tmp_path), "--skip-rate", "0.4",
                 "--skip-precision", "0.9"]) == 0
    printed = capsys.readouterr().out
    assert "| 0.5 | useful | 0 | 0.50 |" in printed and "| 0.5 | useful | 0.4 | 0.23 |" in printed  # (0.5 - 0.36) / 0.6
    assert "- f = 0.5, skip rate 0.4 (f after 0.23): the pool sized on useful rollouts needs" in printed
    saved = json.loads((tmp_path / "filter.json").read_text())
    assert saved["skip_rates"] == [0.0, 0.4] and saved["skip_precision"] == 0.9 and len(saved["rows"]) == 8
    row = next(r for r in saved["rows"]
               if (r["filter_rate"], r["provision_for"], r["skip_rate"]) == (0.5, "useful", 0.4))
    assert row["filter_rate_after"] == pytest.approx(0.14 / 0.6) and "cost_per_step" in row and "machines_mean" in row
    # a bad skip rate fails before any run, naming the field; skipping belongs to the filter scenario only
    assert main(["simulate", "filter", "--quick", "--out", str(tmp_path), "--skip-rate", "1.2"]) == 2
    assert "skip_rate=1.2" in capsys.readouterr().err
    assert main(["simulate", "launch", "--quick", "--out", str(tmp_path), "--skip-rate", "0.4"]) == 2
    assert "--skip-rate only with the 'filter' scenario" in capsys.readouterr().err
