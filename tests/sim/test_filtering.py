"""Dynamic sampling against the capacity rule (issue 35): the predicted filter rate, the rule in useful rollouts,
and the simulator's learner starving on a pool sized on raw rollouts but not on one sized on useful ones."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from echo2sdk.core import capacity
from echo2sdk.errors import CapacityError, ConfigError
from echo2sdk.sim import simulate
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
