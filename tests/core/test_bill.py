"""The run's bill (core/bill.py): rollouts, machine-hours and dollars, and each per point of gain; numbers worked
by hand."""

from __future__ import annotations

import pytest

from echo2sdk.core.bill import bill, billed, billed_spans, price_per_hour

# local-0 registered free, 1800 s billed; cloud-1 registered at 2 $/h, 3600 s billed (monotonic clock readings)
WORKERS = [{"worker_id": "local-0", "price_per_hour": 0.0, "joined_at": 100.0, "last_seen": 1900.0},
           {"worker_id": "cloud-1", "price_per_hour": 2.0, "joined_at": 1000.0, "last_seen": 4600.0}]


def _rows(values, key="rollout_accuracy", rollouts=32):
    rows = []
    for i, v in enumerate(values):
        row = {"step": i + 1, "time_s": 30.0 * (i + 1), "rollouts": rollouts, "rollout_accuracy": None,
               "rollout_reward_mean": 0.0}
        row[key] = v
        rows.append(row)
    return rows


def test_a_run_that_improved_is_billed_per_point_of_accuracy():
    # first five: 0.2, 0.3, (none completed), 0.25, 0.25 -> 1.0 / 4 = 0.25; last five 3.25 / 5 = 0.65: +40 points
    rows = _rows([0.2, 0.3, None, 0.25, 0.25, 0.6, 0.7, 0.65, 0.65, 0.65])
    got = bill(rows, WORKERS, {"local-0": 0.5})  # the config prices local-0: 0.5 h x 0.5 + 1 h x 2 = 2.25 $
    assert got == {
        "measure": "accuracy",
        "rollouts_generated": 320,  # 10 rows x 32
        "machine_hours": pytest.approx(1.5),
        "cost_usd": pytest.approx(2.25),
        "accuracy_first5": pytest.approx(0.25),
        "accuracy_last5": pytest.approx(0.65),
        "gain_points": pytest.approx(40.0),
        "rollouts_per_point": pytest.approx(8.0),
        "machine_hours_per_point": pytest.approx(0.0375),
        "usd_per_point": pytest.approx(0.05625),
    }


def test_prices_from_the_config_override_the_registered_ones():
    rows = _rows([0.2, 0.2, 0.2, 0.2, 0.2, 0.4, 0.4, 0.4, 0.4, 0.4])  # +20 points
    assert bill(rows, WORKERS, {})["cost_usd"] == pytest.approx(2.0)  # registered: 0 for local-0, 2 $/h x 1 h
    got = bill(rows, WORKERS, {"cloud-1": 1.0})  # the config's 1 $/h beats the registered 2
    assert got["cost_usd"] == pytest.approx(1.0) and got["usd_per_point"] == pytest.approx(0.05)
    assert price_per_hour("cloud-1", 2.0, {"cloud-1": 0.0}) == 0.0  # a configured 0 is a price too
    assert price_per_hour("cloud-1", None, None) == 0.0


def test_local_workers_cost_nothing_but_still_bill_their_hours():
    rows = _rows([0.1] * 5 + [0.3] * 5)
    free = [{**w, "price_per_hour": 0.0} for w in WORKERS]
    got = bill(rows, free, {})
    assert got["cost_usd"] == 0.0 and got["usd_per_point"] == 0.0
    assert got["machine_hours"] == pytest.approx(1.5) and got["machine_hours_per_point"] == pytest.approx(0.075)


@pytest.mark.parametrize("values", [[0.5] * 10, [0.6] * 5 + [0.4] * 5, [0.3, 0.4, 0.5]])
def test_no_gain_or_a_loss_has_no_price_per_point(values):
    """Flat, worse, and a run of under five steps (its first five rows are its last five): no division."""
    got = bill(_rows(values), WORKERS, {})
    assert got["gain_points"] <= 0
    assert got["rollouts_per_point"] is got["machine_hours_per_point"] is got["usd_per_point"] is None
    assert got["rollouts_generated"] == 32 * len(values) and got["cost_usd"] == pytest.approx(2.0)


def test_a_task_without_accuracy_is_measured_in_reward_x100():
    # no correctness: rewards 0.1 .. 1.0; first five mean 0.3, last five 0.8: +50 reward units x100
    rows = _rows([0.1 * k for k in range(1, 11)], key="rollout_reward_mean", rollouts=10)
    got = bill(rows, WORKERS, {})
    assert got["measure"] == "reward"
    assert (got["accuracy_first5"], got["accuracy_last5"]) == (pytest.approx(0.3), pytest.approx(0.8))
    assert got["gain_points"] == pytest.approx(50.0) and got["rollouts_per_point"] == pytest.approx(2.0)


def test_without_rows_or_workers_what_is_unknown_is_null():
    got = bill([], [], {})
    assert got == {"measure": "reward", "rollouts_generated": 0, "machine_hours": None, "cost_usd": None,
                   "accuracy_first5": None, "accuracy_last5": None, "gain_points": None, "rollouts_per_point": None,
                   "machine_hours_per_point": None, "usd_per_point": None}
    rows = _rows([None] * 5 + [0.5] * 5)  # accuracy, but none in the first five rows: gain unknown
    assert bill(rows, WORKERS, {})["gain_points"] is None and bill(rows, WORKERS, {})["usd_per_point"] is None


def test_spans_are_placed_on_the_run_clock_by_the_newest_heartbeat():
    # the newest heartbeat (4600) is the run's end (3000 s): local-0 from -1500 to 300 s, cloud-1 from -600 s
    assert billed_spans(WORKERS, 3000.0) == [(-1500.0, 300.0), (-600.0, 3000.0)]
    assert billed(WORKERS, {"local-0": 0.5}, 3000.0) == [(0.5, -1500.0, 300.0), (2.0, -600.0, 3000.0)]
    rows = _rows([0.2] * 5 + [0.4] * 5)
    assert bill(rows, WORKERS, {}, wall_s=3000.0) == bill(rows, WORKERS, {})  # totals do not move with the end
    assert billed_spans([], 10.0) == []
