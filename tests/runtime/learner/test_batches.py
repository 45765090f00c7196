"""The learner's wait for a batch (runtime/learner/batches.py) against the real buffer: learner.max_wait_s trains on
the informative groups it has instead of idling, and the wait is split by cause. The learner is a stand-in here
(what it does with a batch is tested in tests/core and by the real runs of tests/runtime/learner/test_trainer.py, which
wait for whole batches)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Meta, Trajectory, TrajectoryRejected
from echo2sdk.runtime.learner.batches import Batch, Batches, DataLimits

G = 2


def _group(gid: str, rewards: tuple[float, ...], version: int = 0) -> list[Trajectory]:
    meta = Meta(group_id=gid, prompt_ids=(1,), response_ids=(2,), logprobs=(-0.1,))
    return [Trajectory(prompt="p", response="r", reward=r, version=version, meta=meta) for r in rewards]


class _Learner:
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.scales: list[float] = []

    def step(self, groups, screen, lr_scale=1.0):
        self.batches.append(len(groups))
        self.scales.append(lr_scale)
        return SimpleNamespace()


def _batches(buffer: StalenessBuffer, **limits) -> Batches:
    pool = SimpleNamespace(alive_workers=lambda: [object()])
    local = SimpleNamespace(started=lambda: [], exited=lambda: [])
    return Batches(buffer, pool, local, DataLimits(60.0, 0.5, 0, Path("."), **limits), threading.Event())


def _learn(b: Batches, k: int, v_t: int, learner: _Learner) -> Batch:
    """One update as the recipe makes it (Trainer._learn), the audit's screen left out: the next batch, the step."""
    batch = b.next(k, v_t)
    learner.step(batch.groups, None, batch.lr_scale)
    b.trained(batch)
    return batch


def _feed(buffer: StalenessBuffer, groups: list[list[Trajectory]], every_s: float) -> threading.Thread:
    def run() -> None:
        for g in groups:
            time.sleep(every_s)
            try:
                buffer.add_group(g, vocab_size=8, max_len=8)
            except TrajectoryRejected:  # counted by the buffer
                pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_after_max_wait_s_a_step_trains_on_the_informative_groups_it_has():
    buffer = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
    buffer.add_group(_group("ok-0", (0.0, 1.0)), vocab_size=8, max_len=8)
    feeder = _feed(buffer, [_group(f"flat-{i}", (1.0, 1.0)) for i in range(6)], 0.1)  # filtered, never ready
    b, learner = _batches(buffer, max_wait_s=0.4), _Learner()
    t0 = time.perf_counter()
    batch = _learn(b, 4, 0, learner)
    feeder.join()
    assert 0.35 < time.perf_counter() - t0 < 1.5 and 0.35 < batch.waited < 1.5
    assert learner.batches == [1] and [g[0].meta.group_id for g in batch.groups] == ["ok-0"] and b.partial == 1
    assert batch.partial and learner.scales == [0.5]  # learner.partial_lr "sqrt" (the default): sqrt(1/4)
    # 4 groups completed during the wait, all filtered: the wait was spent on groups the learner cannot use
    c = batch.wait_causes
    assert c["filtered"] > 0.3 and abs(sum(c.values()) - batch.waited) < 0.01


def test_without_max_wait_s_a_step_waits_for_all_of_its_groups():
    buffer = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
    feeder = _feed(buffer, [_group(f"ok-{i}", (0.0, 1.0)) for i in range(4)], 0.15)
    b, learner = _batches(buffer), _Learner()
    batch = _learn(b, 4, 0, learner)
    feeder.join()
    assert learner.batches == [4] and len(batch.groups) == 4 and b.partial == 0 and batch.waited > 0.4
    assert learner.scales == [1.0]
    assert batch.wait_causes["filtered"] == 0 and abs(batch.wait_causes["empty"] - batch.waited) < 0.01


def test_max_wait_s_needs_min_groups_ready():
    buffer = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
    buffer.add_group(_group("ok-0", (0.0, 1.0)), vocab_size=8, max_len=8)
    feeder = _feed(buffer, [_group("ok-1", (0.0, 1.0))], 0.6)
    b, learner = _batches(buffer, max_wait_s=0.2, min_groups=2), _Learner()
    batch = _learn(b, 4, 0, learner)
    feeder.join()
    assert learner.batches == [2] and batch.waited > 0.55 and b.partial == 1


def test_the_pool_is_sized_on_the_measured_filter_rate_up_to_its_cap(caplog):
    """scheduler.max_filter_rate: a task whose groups all get one reward (f near 1) is a task problem, not a
    capacity one; the pool is sized as for the cap, and a warning says why."""
    from echo2sdk.core.verdict import sizing_filter_rate

    assert sizing_filter_rate(0.5, 0.75) == 0.5 and not caplog.records
    assert sizing_filter_rate(0.98, 0.75) == 0.75 and "check the task's rewards" in caplog.text
    assert sizing_filter_rate(0.3, 0.0) == 0.0  # 0: sized on raw rollouts, the paper's rule


def test_the_fallback_says_it_fills_the_batch_and_a_partial_batch_does_not(caplog):
    caplog.set_level("INFO", logger="echo2sdk.learner")
    fallback = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True, fallback_after=2)
    feeder = _feed(fallback, [_group(f"flat-{i}", (1.0, 1.0)) for i in range(2)], 0.05)
    b, learner = _batches(fallback), _Learner()
    _learn(b, 2, 0, learner)
    feeder.join()
    assert learner.batches == [2] and "fills its batch with 2 zero-variance group(s)" in caplog.text
    caplog.clear()
    partial = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
    partial.add_group(_group("ok-0", (0.0, 1.0)), vocab_size=8, max_len=8)
    b, learner = _batches(partial, max_wait_s=0.2), _Learner()
    _learn(b, 4, 0, learner)
    assert learner.batches == [1] and "fills its batch" not in caplog.text


def test_a_partial_batch_steps_at_the_rate_learner_partial_lr_gives_it():
    for rule, want in (("linear", 0.25), ("none", 1.0), ("sqrt", 0.5)):
        buffer = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
        buffer.add_group(_group("ok-0", (0.0, 1.0)), vocab_size=8, max_len=8)
        b, learner = _batches(buffer, max_wait_s=0.05, partial_lr=rule), _Learner()
        _learn(b, 4, 0, learner)
        assert learner.scales == [want], rule


def test_the_capacity_verdict_judges_a_full_batchs_t_train_not_the_partial_steps():
    """With learner.max_wait_s the steps train on small batches; their T_train would raise mu_min, the bar the pool
    is judged by. summary.json's mu_min takes a full batch's: forward and backward scaled to R, the rest as is."""
    from echo2sdk.core import capacity
    from echo2sdk.runtime.learner.metrics import full_batch_t_train, summary

    def row(n: int, fwd: float, bwd: float, rest: float) -> dict:
        return {"trajectories": n, "t_train_s": fwd + bwd + rest, "t_forward_s": fwd, "t_backward_s": bwd,
                "t_bcast_s": 1.0, "learner_wait_s": 2.0, "staleness_max": 0}

    assert full_batch_t_train(row(16, 2.0, 4.0, 1.0), 16) == 7.0  # a full batch: its own
    assert full_batch_t_train(row(4, 0.5, 1.0, 1.0), 16) == 7.0  # 1.5 s x 4 + 1 s
    rows = [row(4, 0.5, 1.0, 1.0)] * 5
    out = summary(rows, 40.0, S=3, kappa=2, R=16, mu_pool=3.0)
    assert out["T_train_median_s"] == 2.5 and out["T_train_full_batch_s"] == 7.0
    assert out["mu_min"] == capacity.mu_min(7.0, 1.0, 16, 2) == out["capacity"]["mu_min"]
    mixed = summary(rows + [row(16, 2.0, 5.0, 1.0)], 40.0, S=3, kappa=2, R=16, mu_pool=3.0)
    assert mixed["T_train_full_batch_s"] == 8.0  # a measured full step is preferred to the estimate


def test_a_wait_on_groups_from_an_old_snapshot_counts_as_waiting_for_a_snapshot():
    """Workers still generating on a version below v_t - S deliver groups the buffer refuses as stale: the learner
    waits for the snapshot to reach them (learner_wait_snapshot_s), not for the pool to produce."""
    buffer = StalenessBuffer(staleness=1, group_size=G, filter_zero_variance=True)
    buffer.set_version(3)  # the floor is v 2
    b, learner = _batches(buffer), _Learner()
    groups = [_group(f"old-{i}", (0.0, 1.0), version=0) for i in range(3)]
    groups += [_group("flat", (1.0, 1.0), version=3), _group("ok", (0.0, 1.0), version=3)]
    feeder = _feed(buffer, groups, 0.3)  # the first arrives 0.3 s in: after the wait has taken its "before"
    batch = _learn(b, 1, 3, learner)
    feeder.join()
    c, waited = batch.wait_causes, batch.waited  # 5 groups arrived: 3 stale, 1 filtered, 1 ready ("empty": the rest)
    assert abs(sum(c.values()) - waited) < 0.01 and c["snapshot"] > 0.5 * waited > c["filtered"] > 0
    assert c["snapshot"] == pytest.approx(3 * c["filtered"]) and c["empty"] == pytest.approx(c["filtered"])


def test_calibration_waits_for_a_whole_batch_whatever_max_wait_s_says():
    """Warm-up calibration times T_train on a full batch: wait(k, whole=True) ignores learner.max_wait_s."""
    buffer = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
    buffer.add_group(_group("ok-0", (0.0, 1.0)), vocab_size=8, max_len=8)
    feeder = _feed(buffer, [_group("ok-1", (0.0, 1.0))], 0.4)
    b = _batches(buffer, max_wait_s=0.05)
    waited, _ = b.wait(2, whole=True)
    feeder.join()
    assert waited > 0.3 and buffer.ready_groups() == 2 and len(buffer.sample(2)) == 2


def test_the_live_recalibration_remeasures_a_full_batchs_t_train():
    """The live scheduler's mu_target (RunMetrics.remeasure) takes the same full-batch T_train as the summary."""
    from echo2sdk.runtime.learner.metrics import RunMetrics

    m = RunMetrics(out=None, sinks=None, R=16, kappa=2)
    m.rows = [{"trajectories": 4, "t_train_s": 2.5, "t_forward_s": 0.5, "t_backward_s": 1.0, "t_bcast_s": 1.0,
               "filter_rate": 0.0}] * 5
    assert m.remeasure()["T_train"] == 7.0  # 1.5 s x 4 + 1 s, not the partial steps' 2.5 s


def test_a_batch_the_step_fails_on_is_dropped_and_its_wait_counts_in_the_next():
    """Batches.drop counts a batch the learner step raised on and its records by worker; the update's wait goes on
    into the next batch's `waited`; MAX_DROPS_IN_A_ROW drops in a row end the run, a trained batch starts anew."""
    from echo2sdk.errors import Echo2Error
    from echo2sdk.runtime.learner.batches import MAX_DROPS_IN_A_ROW

    buffer = StalenessBuffer(staleness=2, group_size=G, filter_zero_variance=True)
    feeder = _feed(buffer, [_group(f"ok-{i}", (0.0, 1.0)) for i in range(2 * MAX_DROPS_IN_A_ROW + 1)], 0.02)
    b = _batches(buffer)
    first = b.next(1, 0)  # waits for the first group
    b.drop(first, ValueError("bad batch"))
    feeder.join()
    second = b.next(1, 0)  # ready at once
    assert second.waited >= first.waited >= 0.015 and b.dropped == 1 and sum(b.dropped_by_worker.values()) == G
    b.trained(second)
    assert b.next(1, 0).waited < 0.015  # the next update waits anew
    for _ in range(MAX_DROPS_IN_A_ROW - 1):
        b.drop(b.next(1, 0), RuntimeError("bad batch"))
    with pytest.raises(Echo2Error, match=f"failed on {MAX_DROPS_IN_A_ROW} batches in a row"):
        b.drop(b.next(1, 0), RuntimeError("bad batch"))
    assert b.summary() == {"batches_dropped": MAX_DROPS_IN_A_ROW + 1, "batches_partial": 0,
                           "batches_dropped_records_by_worker": {"": G * (MAX_DROPS_IN_A_ROW + 1)}}


def test_a_batch_reports_the_span_of_the_versions_that_generated_it():
    """version_span: max v - min v over the batch's records (0 when one snapshot generated the whole batch)."""
    one = Batch([_group("a", (0.0, 1.0), version=3), _group("b", (1.0, 0.0), version=3)], v_t=4, k=2, lr_scale=1.0,
                waited=0.0, wait_causes={}, taken_at=0.0)
    mixed = Batch([_group("a", (0.0, 1.0), version=1), _group("b", (1.0, 0.0), version=4)], v_t=4, k=2,
                  lr_scale=1.0, waited=0.0, wait_causes={}, taken_at=0.0)
    assert one.metrics(now=1.0)["version_span"] == 0
    assert mixed.metrics(now=1.0)["version_span"] == 3 == mixed.metrics(now=1.0)["staleness_max"]
