"""`echo2 plan`: catalog files, the provisioning decision, infeasible plans and their fixes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from echo2sdk.core import capacity
from echo2sdk.sim import GB, Network, measure_t_bcast
from echo2sdk.errors import CapacityError, ConfigError
from echo2sdk.plan import CatalogEntry, format_plan, idle_share, idle_share_overlap, load_catalog, make_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_toml_and_csv_catalogs_agree_and_match_the_simulated_pool():
    from echo2sdk.sim.paper import MIXED_POOL

    toml = load_catalog(EXAMPLES / "catalog_mixed.toml")
    csv = load_catalog(EXAMPLES / "catalog_mixed.csv")
    assert toml == csv
    assert [(e.name, e.price_per_hour, e.mu, e.count) for e in toml] == [tuple(p) for p in MIXED_POOL]


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("name,price_per_hour,mu\nx,0.3,abc\n", ".csv", r"row 2: field 'mu' = 'abc' is not a number"),
        ("name,price_per_hour,mu\nx,-1,0.2\n", ".csv", r"row 2: field 'price_per_hour' = '-1' must be"),
        ("name,price_per_hour,mu,count\nx,0.3,0.2,1.5\n", ".csv", r"field 'count' = '1.5' must be an integer"),
        ("name,price_per_hour\nx,0.3\n", ".csv", r"missing field 'mu'"),
        ('[[worker]]\nname = "x"\nprice_per_hour = 0.3\nmu = 0.2\nspeed = 3\n', ".toml", r"unknown field\(s\) \['speed'\]"),
        ("[[worker]]\nname = 'x'\nprice_per_hour = 0.3\nmu = 0.0\n", ".toml", r"\[\[worker\]\] #1: field 'mu' = 0.0"),
        ("[workers]\n", ".toml", r"expected \[\[worker\]\] tables"),
    ],
)
def test_bad_catalog_rows_name_file_row_field_and_value(tmp_path, text, suffix, message):
    path = tmp_path / f"cat{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_catalog(path)


def test_missing_catalog_and_wrong_suffix():
    with pytest.raises(ConfigError, match="does not exist"):
        load_catalog("nope.toml")
    bad = EXAMPLES.parent / "README.md"
    with pytest.raises(ConfigError, match="use a .toml or .csv"):
        load_catalog(bad)


CAT = [CatalogEntry("a100", 3.06, 0.40, 4), CatalogEntry("rtx5090", 0.35, 0.28, 16)]


def test_plan_numbers_follow_the_capacity_rule():
    p = make_plan(CAT, T_train=1631.2, R=2048, S=3, T_bcast=1437.0, learner_price_per_hour=12.24)
    m = capacity.mu_min(1631.2, 1437.0, 2048, 2)
    assert p.feasible and p.kappa == 2
    assert p.mu_min == pytest.approx(m) and p.mu_target == pytest.approx(1.1 * m)
    assert p.chosen == [{"name": "rtx5090", "count": 9, "price_per_hour": 0.35, "mu": 0.28, "rho": pytest.approx(1.25)}]
    assert p.mu_pool == pytest.approx(9 * 0.28)
    assert p.cost_per_hour == pytest.approx(12.24 + 9 * 0.35)
    assert p.cost_per_step == pytest.approx(p.cost_per_hour * 1631.2 / 3600)
    assert p.idle_share == 0.0
    assert p.delta_max_tightened == capacity.delta_max_tightened(1631.2, 1437.0, 2)
    assert p.delta_max_conservative == capacity.delta_max_conservative(1631.2, 1437.0, 2048, 2, 9 * 0.28)


def test_plan_reports_both_solvers_and_uses_the_chosen_one():
    cat = [CatalogEntry("b", 0.55, 4.5), CatalogEntry("d", 0.12, 0.7)]
    # mu_min = 2 * 12 / (2 * 100 - 10) = 0.1263, mu_target = 0.139: d alone suffices, greedy takes b (lower rho)
    exact = make_plan(cat, T_train=100.0, R=12, S=3, T_bcast=10.0)
    greedy = make_plan(cat, T_train=100.0, R=12, S=3, T_bcast=10.0, solver="greedy")
    assert [c["name"] for c in exact.chosen] == ["d"] and [c["name"] for c in greedy.chosen] == ["b"]
    for p in (exact, greedy):
        assert p.cost_per_hour_workers_exact == pytest.approx(0.12)
        assert p.cost_per_hour_workers_greedy == pytest.approx(0.55)
    assert exact.solver == "exact" and exact.cost_per_hour_workers == pytest.approx(0.12)
    assert greedy.cost_per_hour_workers == pytest.approx(0.55)
    assert "solver    exact $0.12/h vs greedy $0.55/h for the workers: exact saves 78.2% (this plan uses exact)" in format_plan(exact)


def test_t_bcast_is_estimated_with_the_simulators_chain_model():
    p = make_plan(CAT, T_train=1631.2, R=2048, S=3, snapshot_gb=16.38, B0_mbps=600, Bw_mbps=100, install_s=30)
    net = Network(snapshot_bytes=16.38 * GB, B0_mbps=600, install_s=30)
    assert p.T_bcast == pytest.approx(measure_t_bcast(p.workers, net, 100.0, 1 / 1.1))
    assert "chain model" in p.T_bcast_source and p.feasible


def test_delta_snapshots_shorten_t_bcast_and_need_fewer_workers():
    args = dict(T_train=1631.2, R=2048, S=3, snapshot_gb=16.38, B0_mbps=600, Bw_mbps=100, install_s=30)
    full = make_plan(CAT, **args)
    delta = make_plan(CAT, **args, delta_ratio=0.03, anchor_every=10)
    assert "deltas of 0.03 x the snapshot with an anchor every 10" in delta.T_bcast_source
    # the mean publication: (1 + 9 x 0.03) / 10 of 16.38 GB, at the same chain rates
    assert delta.T_bcast < 0.25 * full.T_bcast and delta.mu_min < full.mu_min
    assert delta.workers <= full.workers and delta.cost_per_hour <= full.cost_per_hour
    with pytest.raises(ConfigError, match="delta_ratio"):
        make_plan(CAT, **args, delta_ratio=2.0)


def test_idle_share_is_zero_exactly_when_eq1_holds():
    m = capacity.mu_min(100.0, 40.0, 128, 2)
    assert idle_share(100.0, 40.0, 128, 2, m) == pytest.approx(0.0, abs=1e-12)
    # half the pool: period = 40 + 2*128/(m/2) = 40 + 2*160 = 360 s for 200 s of training
    assert idle_share(100.0, 40.0, 128, 2, m / 2) == pytest.approx(1 - 200 / 360)
    assert idle_share(100.0, 40.0, 128, 2, 0.0) == 1.0
    # workers that keep generating during dissemination: only R / T_train matters
    assert idle_share_overlap(100.0, 128, 1.28) == 0.0
    assert idle_share_overlap(100.0, 128, 0.64) == pytest.approx(0.5)


def test_broadcast_longer_than_kappa_steps_is_infeasible_with_a_staleness_fix():
    p = make_plan(CAT, T_train=1000.0, R=2048, S=3, T_bcast=2500.0)
    assert not p.feasible and p.mu_min is None
    assert p.workers == 20 and p.idle_share == pytest.approx(idle_share(1000.0, 2500.0, 2048, 2, 4 * 0.4 + 16 * 0.28))
    assert p.idle_share > 0.3  # eq. (1) can never hold: at least (2500 - 2000) / 2500 of each period idles
    assert any("no number of workers" in w for w in p.warnings)
    # S = 4 hides the broadcast (3 * 1000 > 2500) but needs 12.3 rollouts/s; S = 5 needs 6.0 <= 6.08
    assert any("larger staleness: S = 5" in f for f in p.fixes), p.fixes


def test_a_catalog_too_small_is_infeasible_with_three_fixes():
    small = [CatalogEntry("rtx5090", 0.35, 0.28, 6)]
    p = make_plan(small, T_train=1631.2, R=2048, S=3, T_bcast=1437.0)
    assert not p.feasible and p.workers == 6
    assert p.idle_share == pytest.approx(idle_share(1631.2, 1437.0, 2048, 2, 6 * 0.28)) and p.idle_share > 0.1
    text = " | ".join(p.fixes)
    assert "more workers: about 3 more like 'rtx5090'" in text  # (2.468 - 1.68) / 0.28 = 2.8
    assert "larger staleness: S =" in text
    assert "faster dissemination: T_bcast below" in text
    tiny = make_plan([CatalogEntry("rtx5090", 0.35, 0.28, 4)], T_train=1631.2, R=2048, S=3, T_bcast=1437.0)
    assert "even with T_bcast = 0" in " | ".join(tiny.fixes)  # 1.12/s < gamma * R / T_train: only workers help
    assert not any("larger staleness" in f for f in tiny.fixes)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"S": 1}, CapacityError, "S must be >= 2"),
        ({"gamma": 0.8}, CapacityError, "gamma.*0.8"),
        ({"kappa": 3}, CapacityError, r"kappa must be an integer in \[1, S - 1 = 2\] \(paper section 4.1\), got kappa=3"),
        ({"T_bcast": None}, ConfigError, "give T_bcast, or snapshot_gb"),
        ({"T_train": -5.0}, CapacityError, "T_train must be > 0, got T_train=-5.0"),
        ({"solver": "lp"}, CapacityError, "solver must be 'exact' or 'greedy', got solver='lp'"),
        ({"learner_price_per_hour": -1.0}, CapacityError, r"learner price \(\$/h\) must be >= 0, got .*=-1.0"),
    ],
)
def test_bad_plan_inputs_are_named(kwargs, error, message):
    args = {"T_train": 100.0, "R": 64, "S": 3, "T_bcast": 10.0, **kwargs}
    with pytest.raises(error, match=message):
        make_plan(CAT, **args)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "echo2sdk.cli", "plan", *args], capture_output=True, text=True)


def test_cli_plan_prints_json_and_signals_infeasible_plans():
    cat = str(EXAMPLES / "catalog_5090.toml")
    ok = _cli("--catalog", cat, "--t-train", "1631.2", "--R", "2048", "--S", "3", "--t-bcast", "1437", "--json")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["feasible"] and data["chosen"][0]["count"] == 9
    assert data["solver"] == "exact" and data["cost_per_hour_workers_greedy"] == pytest.approx(9 * 0.35)
    mixed = _cli("--catalog", str(EXAMPLES / "catalog_mixed.toml"), "--t-train", "1631.2", "--R", "2048", "--S", "3",
                 "--t-bcast", "1437", "--solver", "greedy")
    assert mixed.returncode == 0 and "solver    exact $" in mixed.stdout and "this plan uses greedy" in mixed.stdout
    bad = _cli("--catalog", cat, "--t-train", "1000", "--R", "2048", "--S", "3", "--t-bcast", "2500")
    assert bad.returncode == 1 and "feasible  NO" in bad.stdout and "fix" in bad.stdout
    err = _cli("--catalog", "missing.csv", "--t-train", "1", "--R", "2", "--S", "3", "--t-bcast", "0")
    assert err.returncode == 2 and "missing.csv" in err.stderr and "Traceback" not in err.stderr


def test_a_filter_rate_sizes_the_pool_on_useful_rollouts():
    """Dynamic sampling drops a share f of the groups: R useful rollouts a step take R / (1 - f) generated, so the
    plan's mu_min is the raw rule's for R / (1 - f) (issue 35)."""
    plain = make_plan(CAT, T_train=1631.2, R=2048, S=3, T_bcast=1437.0)
    f = capacity.filter_rate(0.1, 4)
    p = make_plan(CAT, T_train=1631.2, R=2048, S=3, T_bcast=1437.0, filter_rate=f)
    assert p.R == 2048 and p.R_raw == pytest.approx(2048 / (1 - f)) and p.filter_rate == f
    assert p.mu_min == pytest.approx(capacity.mu_min(1631.2, 1437.0, 2048 / (1 - f), 2))
    assert p.mu_min == pytest.approx(plain.mu_min / (1 - f)) and p.workers > plain.workers
    assert "filtering f = 0.656" in format_plan(p) and "filtering" not in format_plan(plain)
    with pytest.raises(CapacityError, match="f must be < 1"):
        make_plan(CAT, T_train=1631.2, R=2048, S=3, T_bcast=1437.0, filter_rate=1.0)


def test_cli_plan_predicts_the_filter_rate_from_an_accuracy():
    cat = str(EXAMPLES / "catalog_5090.toml")
    base = ("--catalog", cat, "--t-train", "1631.2", "--R", "2048", "--S", "3", "--t-bcast", "1437", "--json")
    out = _cli(*base, "--accuracy", "0.5", "--group-size", "4")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["filter_rate"] == pytest.approx(0.125) and "accuracy p = 0.5" in data["filter_rate_source"]
    assert data["chosen"][0]["count"] > 9  # 9 without filtering (test_cli_plan_prints_json...)
    both = _cli(*base, "--accuracy", "0.5", "--group-size", "4", "--filter-rate", "0.5")
    assert both.returncode == 2 and "only one of" in both.stderr
    alone = _cli(*base, "--accuracy", "0.5")
    assert alone.returncode == 2 and "--group-size" in alone.stderr
    # prompts not alike (a = b = 2): 2 x (2*3*4*5)/(4*5*6*7) = 0.286 of the groups filtered at the same accuracy
    spread = _cli(*base, "--accuracy", "0.5", "--group-size", "4", "--prompt-concentration", "4")
    assert spread.returncode == 0, spread.stderr
    wide = json.loads(spread.stdout)
    assert wide["filter_rate"] == pytest.approx(2 / 7) and "nu = 4" in wide["filter_rate_source"]
    assert wide["chosen"][0]["count"] > data["chosen"][0]["count"]
    lone = _cli(*base, "--prompt-concentration", "1")
    assert lone.returncode == 2 and "go with --accuracy" in lone.stderr
    # a reward of three values (math: unformatted, boxed but wrong, right), as summary.json's reward_shares gives
    # them: alike prompts filter sum_v q_v^G of the groups; spread ones more
    shares = _cli(*base, "--reward-shares", "0.5,0.4,0.1", "--group-size", "4")
    assert shares.returncode == 0, shares.stderr
    by_value = json.loads(shares.stdout)
    assert by_value["filter_rate"] == pytest.approx(0.5**4 + 0.4**4 + 0.1**4)
    assert "reward shares 0.5, 0.4, 0.1" in by_value["filter_rate_source"]
    spread = _cli(*base, "--reward-shares", "0.5,0.4,0.1", "--group-size", "4", "--prompt-concentration", "2")
    assert json.loads(spread.stdout)["filter_rate"] == pytest.approx(capacity.value_filter_rate((0.5, 0.4, 0.1), 4, 2))
    # summary.json's shares, rounded to 4 digits, may sum to 0.9999: rescaled
    rounded = _cli(*base, "--reward-shares", "0.1207,0.6903,0.1889", "--group-size", "4")
    assert rounded.returncode == 0 and "reward shares 0.1207" in json.loads(rounded.stdout)["filter_rate_source"]
    for bad, word in ((("--reward-shares", "0.5,0.4", "--group-size", "4"), "--reward-shares must sum to 1, got 0.9"),
                      (("--reward-shares", "1.5,-0.5", "--group-size", "4"), "must each be in [0, 1]"),
                      (("--reward-shares", "0.5;0.5", "--group-size", "4"), "--reward-shares must be numbers"),
                      (("--reward-shares", "0.5,0.5"), "--reward-shares needs --group-size"),
                      (("--reward-shares", "0.5,0.5", "--accuracy", "0.5", "--group-size", "4"),
                       "not --accuracy and --reward-shares")):
        out = _cli(*base, *bad)
        assert out.returncode == 2 and word in out.stderr, (bad, out.stderr)


def test_cli_plan_predicts_the_filter_rate_from_a_runs_summary(tmp_path):
    """--filter-from RUN_DIR: the main job's recorded summary (reward values 0 / 0.1 / 1.1 in shares 0.0787 /
    0.1142 / 0.8071, concentration 1.2574, G = 4) gives its own prediction, 0.675, and extrapolates to G = 16."""
    run = Path(__file__).parent / "data" / "math_20step"
    cat = str(EXAMPLES / "catalog_5090.toml")
    base = ("--catalog", cat, "--t-train", "1631.2", "--R", "2048", "--S", "3", "--t-bcast", "1437", "--json")
    cap = json.loads((run / "summary.json").read_text())["capacity"]
    out = _cli(*base, "--filter-from", str(run))
    assert out.returncode == 1, out.stderr  # a plan, but the catalog falls short with 2/3 of the groups filtered
    got = json.loads(out.stdout)
    assert got["feasible"] is False
    assert got["filter_rate"] == pytest.approx(cap["filter_rate_predicted_reward"], abs=1e-4)
    assert f"of {run / 'summary.json'}, G = 4: prompt concentration nu = 1.2574" in got["filter_rate_source"]
    wider = json.loads(_cli(*base, "--filter-from", str(run), "--group-size", "16").stdout)
    shares = [q for _, q in cap["reward_shares"]]
    assert wider["filter_rate"] == pytest.approx(capacity.value_filter_rate(
        [q / sum(shares) for q in shares], 16, cap["reward_concentration"]))
    assert wider["filter_rate"] < got["filter_rate"]  # a larger group is less often all one reward
    # a run with only the binary counts plans on its accuracy; one with neither is refused, naming the file
    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "summary.json").write_text(json.dumps({"capacity": {"accuracy": 0.5, "prompt_concentration": None},
                                                    "config": {"rollout": {"group_size": 4}}}))
    assert json.loads(_cli(*base, "--filter-from", str(binary)).stdout)["filter_rate"] == pytest.approx(0.125)
    old = Path(__file__).parent / "data" / "smollm2_4step"
    for bad, word in (((str(old),), "has neither capacity.reward_shares nor capacity.accuracy"),
                      ((str(tmp_path / "none"),), "cannot read"),
                      ((str(run), "--prompt-concentration", "2"), "leave --prompt-concentration out"),
                      ((str(run), "--accuracy", "0.5"), "not --accuracy and --filter-from")):
        r = _cli(*base, "--filter-from", *bad)
        assert r.returncode == 2 and word in r.stderr, (bad, r.stderr)
