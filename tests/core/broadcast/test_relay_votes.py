"""Relay scores from receivers' reports (planner.WorkerScores with `reporter=`): clamped figures, one vote per
receiver, no lone receiver lifting a relay above the pool or making it rollout-only."""

from __future__ import annotations

from echo2sdk.core.broadcast.planner import MAX_RELAY_BPS, MAX_REPORTERS, WorkerScores, clamp_bps


def test_reported_speeds_are_clamped_to_a_physical_range():
    assert clamp_bps(1e300) == MAX_RELAY_BPS == 12.5e9
    assert clamp_bps(0.0) is None and clamp_bps(-5.0) is None and clamp_bps(float("nan")) is None
    assert clamp_bps(3e8) == 3e8


def test_one_receiver_complaining_many_times_counts_once():
    s = WorkerScores()
    for t in (1.0, 2.0, 3.0, 4.0):
        s.record_failure("honest", t, reporter="liar")
    assert s.recent_failures("honest", 5.0) == 1 and not s.rollout_only("honest", 5.0)
    for r in ("b", "c"):  # three distinct receivers agree: a real failure pattern demotes it
        s.record_failure("honest", 6.0, reporter=r)
    assert s.rollout_only("honest", 7.0)


def test_a_lone_inflated_report_does_not_rank_its_relay_first():
    s = WorkerScores()
    for relay, bps, reporter in (("h1", 1e8, "c1"), ("h2", 2e8, "c2"), ("acc", 1e300, "liar")):
        s.record_success(relay, bps, reporter=reporter)
    assert s.rank(["acc", "h1", "h2"], 0.0)[0] == "h2"
    assert s.speeds(["acc", "h1", "h2"])["acc"] == 2e8  # capped at the pool median: h2 ties, and ranks first
    s.record_success("acc", 5e7, reporter="c3")  # a second receiver: the lower median of the two
    assert s.speeds(["acc", "h1", "h2"])["acc"] == 5e7


def test_two_receivers_that_agree_lift_a_relay_above_the_pool():
    s = WorkerScores()
    s.record_success("h1", 1e8, reporter="c1")
    s.record_success("fast", 4e8, reporter="c2")
    s.record_success("fast", 4e8, reporter="c3")
    assert s.rank(["h1", "fast"], 0.0) == ["fast", "h1"] and s.speeds(["h1", "fast"])["fast"] == 4e8


def test_votes_per_relay_stay_bounded():
    s = WorkerScores()
    for i in range(100):
        s.record_success("r", 1e8, reporter=f"c{i}")
        s.record_failure("r", float(i), reporter=f"c{i}")
    assert len(s.stats["r"].speeds) == len(s.stats["r"].complaints) == MAX_REPORTERS
    assert list(s.stats["r"].speeds)[-1] == "c99"  # the newest kept


def test_own_measurements_count_as_before():
    s = WorkerScores()  # reporter=None: the caller measured it (the simulator)
    for t in (1.0, 2.0, 3.0):
        s.record_failure("w", t)
    assert s.rollout_only("w", 4.0)
