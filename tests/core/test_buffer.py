"""StalenessBuffer: admission window v_t - S <= v <= v_t, group-aware sampling (paper §4.1)."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.errors import ConfigError, TrajectoryRejected

VOCAB = 100
MAX_LEN = 16
LIMITS = {"vocab_size": VOCAB, "max_len": MAX_LEN}

_serial = itertools.count()


def rec(group_id: str, version: int, *, response_ids: tuple[int, ...] = (3,)) -> Trajectory:
    """A valid record; every call gets a unique response text so records can be told apart."""
    n = next(_serial)
    return Trajectory(
        prompt="p",
        response=f"r{n}",
        reward=float(n % 2),
        version=version,
        meta=Meta(
            group_id=group_id,
            prompt_ids=(1, 2),
            response_ids=response_ids,
            logprobs=tuple(-0.1 for _ in response_ids),
        ),
    )


def group(group_id: str, version: int, n: int = 2) -> list[Trajectory]:
    return [rec(group_id, version) for _ in range(n)]


def held(buf: StalenessBuffer) -> int:
    return buf.stats()["held"]


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"staleness": -1}, "staleness"),
        ({"staleness": 1.5}, "staleness"),
        ({"group_size": 0}, "group_size"),
        ({"capacity_groups": 0}, "capacity_groups"),
        ({"order": "lifo"}, "order"),
    ],
)
def test_bad_config(kwargs, word):
    args = {"staleness": 2, "group_size": 2} | kwargs
    with pytest.raises(ConfigError, match=word):
        StalenessBuffer(**args)


# ---------------------------------------------------------------- intake


def test_add_group_then_sample():
    buf = StalenessBuffer(staleness=2, group_size=2)
    g = group("a", 0)
    buf.add_group(g, **LIMITS)
    assert buf.ready_groups() == 1
    assert buf.sample(1) == [g]
    s = buf.stats()
    assert (s["admitted"], s["sampled"], s["evicted"], s["held"]) == (2, 2, 0, 0)
    assert s["staleness_hist"] == {0: 2}
    assert s["ready_groups"] == s["pending_groups"] == 0


@pytest.mark.parametrize(("version", "reason"), [(0, "stale"), (6, "future_version")])
def test_out_of_window_group_rejected_and_counted_per_record(version, reason):
    buf = StalenessBuffer(staleness=2, group_size=3)
    buf.set_version(5)  # window [3, 5]
    with pytest.raises(TrajectoryRejected) as e:
        buf.add_group(group("a", version, 3), **LIMITS)
    assert e.value.reason == reason
    s = buf.stats()
    assert s["rejected"] == {reason: 3}
    assert s["admitted"] == 0 and buf.ready_groups() == 0


def test_window_edges_are_admitted():
    buf = StalenessBuffer(staleness=2, group_size=1)
    buf.set_version(5)
    buf.add_group(group("lo", 3, 1), **LIMITS)  # v = v_t - S
    buf.add_group(group("hi", 5, 1), **LIMITS)  # v = v_t
    assert buf.ready_groups() == 2


def test_one_bad_record_rejects_the_whole_group():
    buf = StalenessBuffer(staleness=2, group_size=3)
    g = [rec("a", 0), rec("a", 0, response_ids=(VOCAB,)), rec("a", 0)]
    with pytest.raises(TrajectoryRejected, match="token_out_of_vocab"):
        buf.add_group(g, **LIMITS)
    assert buf.stats()["rejected"] == {"token_out_of_vocab": 3}
    assert buf.ready_groups() == 0 and held(buf) == 0


def test_too_long_rejected():
    buf = StalenessBuffer(staleness=2, group_size=1)
    with pytest.raises(TrajectoryRejected, match="too_long"):
        buf.add_group([rec("a", 0, response_ids=tuple(range(3, 3 + MAX_LEN)))], **LIMITS)


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        (lambda: group("a", 0, 1), "group_size"),
        (lambda: group("a", 0, 3), "group_size"),
        (lambda: [rec("a", 0), rec("a", 1)], "group_mixed_versions"),
        (lambda: [rec("a", 0), rec("b", 0)], "group_mixed_ids"),
        (lambda: [rec("a", 0), "not a record"], "schema"),
    ],
)
def test_malformed_groups(records, reason):
    buf = StalenessBuffer(staleness=2, group_size=2)
    buf.set_version(1)
    rs = records()
    with pytest.raises(TrajectoryRejected) as e:
        buf.add_group(rs, **LIMITS)
    assert e.value.reason == reason
    assert buf.stats()["rejected"] == {reason: len(rs)}


def test_duplicate_groups_rejected_while_held_pending_or_sampled():
    buf = StalenessBuffer(staleness=2, group_size=2)
    buf.add_group(group("held", 0), **LIMITS)
    buf.add(rec("pending", 0), **LIMITS)
    buf.add_group(group("gone", 0), **LIMITS)
    buf.sample(2)  # fifo: "held" then "gone"
    buf.add_group(group("held2", 0), **LIMITS)
    for gid in ("held2", "pending", "held", "gone"):
        with pytest.raises(TrajectoryRejected, match="duplicate"):
            buf.add_group(group(gid, 0), **LIMITS)
    assert buf.stats()["rejected"] == {"duplicate": 8}
    # The same group_id under another version is a different group.
    buf.set_version(1)
    buf.add_group(group("gone", 1), **LIMITS)


def test_sampled_keys_are_forgotten_once_stale_and_stale_resend_is_rejected():
    buf = StalenessBuffer(staleness=1, group_size=1)
    buf.add_group(group("a", 0, 1), **LIMITS)
    buf.sample(1)
    buf.set_version(2)
    assert buf._sampled_keys == set()  # bounded by the window
    with pytest.raises(TrajectoryRejected, match="stale"):
        buf.add_group(group("a", 0, 1), **LIMITS)


def test_single_records_accumulate_into_a_group():
    buf = StalenessBuffer(staleness=2, group_size=3)
    buf.add(rec("a", 0), **LIMITS)
    buf.add(rec("a", 0), **LIMITS)
    buf.add(rec("b", 0), **LIMITS)
    assert buf.ready_groups() == 0 and buf.stats()["pending_groups"] == 2
    with pytest.raises(ValueError, match="only 0 ready"):
        buf.sample(1)
    buf.add(rec("a", 0), **LIMITS)
    assert buf.ready_groups() == 1 and buf.stats()["pending_groups"] == 1
    # A fourth record for a complete group is one too many.
    with pytest.raises(TrajectoryRejected) as e:
        buf.add(rec("a", 0), **LIMITS)
    assert e.value.reason == "group_size"
    [g] = buf.sample(1)
    assert len(g) == 3 and {t.meta.group_id for t in g} == {"a"}
    s = buf.stats()
    assert (s["admitted"], s["sampled"], s["held"], s["rejected"]) == (4, 3, 1, {"group_size": 1})


def test_single_records_of_other_versions_open_separate_groups():
    buf = StalenessBuffer(staleness=2, group_size=2)
    buf.set_version(1)
    buf.add(rec("a", 0), **LIMITS)
    buf.add(rec("a", 1), **LIMITS)
    assert buf.ready_groups() == 0 and buf.stats()["pending_groups"] == 2


def test_single_record_rejections_counted():
    buf = StalenessBuffer(staleness=1, group_size=2)
    buf.set_version(3)
    with pytest.raises(TrajectoryRejected, match="stale"):
        buf.add(rec("a", 1), **LIMITS)
    with pytest.raises(TrajectoryRejected, match="schema"):
        buf.add(object(), **LIMITS)
    assert buf.stats()["rejected"] == {"stale": 1, "schema": 1}


# ---------------------------------------------------------------- versions and eviction


def test_set_version_is_monotonic():
    buf = StalenessBuffer(staleness=2, group_size=1)
    buf.set_version(3)
    buf.set_version(3)
    with pytest.raises(ConfigError, match=r"v_t=3.*2"):
        buf.set_version(2)
    assert buf.version == 3


def test_set_version_evicts_ready_and_pending():
    buf = StalenessBuffer(staleness=2, group_size=2)
    buf.add_group(group("old", 0), **LIMITS)
    buf.add(rec("old-partial", 0), **LIMITS)
    buf.set_version(1)
    buf.add_group(group("mid", 1), **LIMITS)
    buf.set_version(2)  # window [0, 2]: nothing goes yet
    assert buf.ready_groups() == 2 and buf.stats()["evicted"] == 0
    buf.set_version(3)  # window [1, 3]: version-0 data go
    s = buf.stats()
    assert s["evicted"] == 3 and s["evicted_by_reason"] == {"stale": 3}
    assert s["ready_groups"] == 1 and s["pending_groups"] == 0
    [g] = buf.sample(1)
    assert g[0].meta.group_id == "mid"
    assert buf.stats()["staleness_hist"] == {2: 2}


# ---------------------------------------------------------------- sampling


def test_sample_raises_without_removing():
    buf = StalenessBuffer(staleness=2, group_size=1)
    buf.add_group(group("a", 0, 1), **LIMITS)
    with pytest.raises(ValueError, match="asked for 2 groups, only 1 ready"):
        buf.sample(2)
    assert buf.ready_groups() == 1
    assert buf.sample(0) == []


def _fill(buf: StalenessBuffer) -> None:
    for v, gid in [(0, "a"), (2, "b"), (1, "c"), (2, "d")]:
        buf.set_version(max(buf.version, v))
        buf.add_group(group(gid, v, 1), **LIMITS)


def test_fifo_order():
    buf = StalenessBuffer(staleness=3, group_size=1, order="fifo")
    _fill(buf)
    assert [g[0].meta.group_id for g in buf.sample(4)] == ["a", "b", "c", "d"]


def test_freshest_order():
    buf = StalenessBuffer(staleness=3, group_size=1, order="freshest")
    _fill(buf)
    assert [g[0].meta.group_id for g in buf.sample(3)] == ["b", "d", "c"]
    assert buf.stats()["staleness_hist"] == {0: 2, 1: 1}


def test_overflow_drops_oldest_version_first():
    buf = StalenessBuffer(staleness=3, group_size=2, capacity_groups=2)
    buf.set_version(1)
    buf.add_group(group("new", 1), **LIMITS)
    buf.add_group(group("old", 0), **LIMITS)
    buf.add_group(group("newer", 1), **LIMITS)  # third group: "old" (v=0) goes
    s = buf.stats()
    assert s["ready_groups"] == 2
    assert s["evicted_by_reason"] == {"overflow": 2}
    assert s["admitted"] == s["sampled"] + s["evicted"] + s["held"]
    assert [g[0].meta.group_id for g in buf.sample(2)] == ["new", "newer"]


def test_one_worker_holds_at_most_groups_per_worker_its_oldest_go_first():
    buf = StalenessBuffer(staleness=3, group_size=1, groups_per_worker=2)
    flood = lambda gid, v, w: Trajectory(prompt="p", response="r", reward=0.5, version=v,  # noqa: E731
                                         meta=Meta(group_id=gid, prompt_ids=(1,), response_ids=(3,), logprobs=(-1.0,),
                                                   worker=w))
    buf.set_version(1)
    for gid, v in (("f1", 1), ("f0", 0), ("f2", 1), ("f3", 1)):
        buf.add_group([flood(gid, v, "fast")], **LIMITS)
    buf.add_group([flood("h0", 0, "honest")], **LIMITS)
    s = buf.stats()
    assert s["evicted_by_reason"] == {"worker_overflow": 2} and s["ready_groups"] == 3
    assert s["admitted"] == s["sampled"] + s["evicted"] + s["held"]
    assert sorted(g[0].meta.group_id for g in buf.sample(3)) == ["f2", "f3", "h0"]  # f0 (v0) then f1 went


def test_groups_per_worker_must_be_a_positive_integer():
    with pytest.raises(ConfigError, match="groups_per_worker"):
        StalenessBuffer(staleness=1, group_size=1, groups_per_worker=0)


def test_wait_for():
    buf = StalenessBuffer(staleness=2, group_size=1)
    assert buf.wait_for(1, timeout=0.01) is False
    buf.add_group(group("a", 0, 1), **LIMITS)
    assert buf.wait_for(1, timeout=0.01) is True
    assert buf.wait_for(0, timeout=0) is True


def test_producer_consumer_threads():
    """A producer thread adds groups at the current version while a learner thread waits, samples
    two groups and advances the version; every group arrives exactly once and within the window.
    (The learner advances at most once between the producer reading v_t and adding, so S=2 suffices.)"""
    S, per_step, steps = 2, 2, 25
    buf = StalenessBuffer(staleness=S, group_size=4)
    got: list[list[Trajectory]] = []
    failures: list[BaseException] = []

    def producer():
        try:
            for i in range(per_step * steps):
                # back-pressure: stay at most one batch ahead, as a coordinator with a bounded queue would
                while buf.ready_groups() >= per_step:
                    time.sleep(0.001)
                buf.add_group(group(f"g{i}", buf.version, 4), **LIMITS)
        except BaseException as e:  # surfaced by the assertion below
            failures.append(e)

    def learner():
        try:
            for _ in range(steps):
                assert buf.wait_for(per_step, timeout=10)
                v_t = buf.version
                batch = buf.sample(per_step)
                assert all(v_t - S <= t.version <= v_t for g in batch for t in g)
                got.extend(batch)
                buf.set_version(v_t + 1)
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=producer), threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert sorted(g[0].meta.group_id for g in got) == sorted(f"g{i}" for i in range(per_step * steps))
    s = buf.stats()
    assert s["sampled"] == s["admitted"] == 4 * per_step * steps
    assert s["rejected"] == {} and s["evicted"] == 0


# ---------------------------------------------------------------- property test

GROUP_SIZE = 3

op = st.one_of(
    # a whole group: group id from a small pool (so duplicates happen), version offset from v_t
    st.tuples(st.just("group"), st.integers(0, 5), st.integers(-4, 2), st.booleans()),
    # single records into a group: how many records to send
    st.tuples(st.just("single"), st.integers(0, 5), st.integers(-4, 2), st.integers(1, GROUP_SIZE + 1)),
    st.tuples(st.just("advance"), st.integers(0, 2)),
    st.tuples(st.just("sample"), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None)
@given(
    S=st.integers(0, 3),
    capacity=st.one_of(st.none(), st.integers(1, 4)),
    order=st.sampled_from(["fifo", "freshest"]),
    ops=st.lists(op, max_size=40),
)
def test_random_interleavings_keep_invariants(S, capacity, order, ops):
    buf = StalenessBuffer(staleness=S, group_size=GROUP_SIZE, capacity_groups=capacity, order=order)
    seen_records: set[str] = set()
    seen_groups: set[tuple[str, int]] = set()
    for o in ops:
        kind = o[0]
        if kind == "group":
            _, gid, dv, mixed = o
            v = max(0, buf.version + dv)
            rs = group(f"g{gid}", v, GROUP_SIZE)
            if mixed and v > 0:
                rs[-1] = rec(f"g{gid}", v - 1)
            try:
                buf.add_group(rs, **LIMITS)
            except TrajectoryRejected as e:
                assert e.reason in {"stale", "future_version", "duplicate", "group_mixed_versions"}
            else:
                assert not mixed or v == 0
                assert buf.version - S <= v <= buf.version
        elif kind == "single":
            _, gid, dv, count = o
            v = max(0, buf.version + dv)
            for _ in range(count):
                try:
                    buf.add(rec(f"s{gid}", v), **LIMITS)
                except TrajectoryRejected as e:
                    assert e.reason in {"stale", "future_version", "group_size"}
        elif kind == "advance":
            buf.set_version(buf.version + o[1])
        else:
            k = min(o[1], buf.ready_groups())
            v_t = buf.version
            for g in buf.sample(k):
                # (c) one group_id, one version, group_size records
                assert len(g) == GROUP_SIZE
                assert len({t.meta.group_id for t in g}) == 1
                assert len({t.version for t in g}) == 1
                key = (g[0].meta.group_id, g[0].version)
                assert key not in seen_groups
                seen_groups.add(key)
                for t in g:
                    # (a) nothing older than v_t - S (nor newer than v_t)
                    assert v_t - S <= t.version <= v_t
                    # (b) no record twice
                    assert t.response not in seen_records
                    seen_records.add(t.response)
        # (d) counters add up after every operation
        s = buf.stats()
        assert s["admitted"] == s["sampled"] + s["evicted"] + s["held"]
        assert s["sampled"] == len(seen_records) == sum(s["staleness_hist"].values())
        assert all(0 <= d <= S for d in s["staleness_hist"])
        assert s["evicted"] == sum(s["evicted_by_reason"].values())
        if capacity is not None:
            assert s["ready_groups"] <= capacity


# ---------------------------------------------------------------- dynamic sampling (zero-variance groups)


def uniform(group_id: str, version: int, n: int = 2, reward: float = 1.0) -> list[Trajectory]:
    """A group whose members all got the same reward: zero advantage."""
    return [r.model_copy(update={"reward": reward}) for r in group(group_id, version, n)]


def test_zero_variance_groups_are_filtered_and_counted():
    buf = StalenessBuffer(staleness=1, group_size=2, filter_zero_variance=True)
    buf.add_group(uniform("a", 0), **LIMITS)
    buf.add_group(group("b", 0), **LIMITS)
    for t in uniform("c", 0, reward=0.0):
        buf.add(t, **LIMITS)  # the one-record path filters too
    s = buf.stats()
    assert (buf.ready_groups(), s["filtered_groups"], s["completed_groups"]) == (1, 2, 3)
    assert s["admitted"] == s["sampled"] + s["evicted"] + s["filtered"] + s["held"] == 6
    assert s["filtered"] == 4 and s["aside_groups"] == 0  # no fallback: nothing is kept aside
    assert not buf.wait_for(2, timeout=0)
    assert [g[0].meta.group_id for g in buf.sample(1)] == ["b"]
    unfiltered = StalenessBuffer(staleness=1, group_size=2)
    unfiltered.add_group(uniform("a", 0), **LIMITS)
    assert unfiltered.ready_groups() == 1


def test_completed_groups_are_summed_filtered_or_not():
    """The rollout-level reward and accuracy (metrics rollout_*) count every completed group, filtered ones too."""
    buf = StalenessBuffer(staleness=1, group_size=2, filter_zero_variance=True)
    right = [r.model_copy(update={"meta": r.meta.model_copy(update={"extra": {"correct": True}})})
             for r in uniform("a", 0, reward=1.1)]
    buf.add_group(right, **LIMITS)  # filtered: both right
    buf.add_group(group("b", 0), **LIMITS)  # rewards 0 and 1, no "correct" key
    buf.add(rec("c", 0), **LIMITS)  # incomplete: not counted
    s = buf.stats()
    assert (s["filtered_groups"], s["completed_groups"], s["completed_records"]) == (1, 2, 4)
    assert s["completed_reward_sum"] == pytest.approx(2.2 + 1.0)
    assert (s["completed_scored"], s["completed_correct"]) == (2, 2)
    # the group scored whole counts towards how alike the prompts are; "b" (unscored) does not
    assert (s["scored_groups"], s["scored_groups_correct"], s["scored_groups_pairs"], s["scored_groups_all_or_none"]) \
        == (1, 2, 2, 1)


def test_a_group_scored_in_part_counts_its_records_but_not_towards_the_prompts_spread():
    """A failed episode keeps its record with no "correct": its group's accuracy counts the scored records, but a
    group of fewer than G scores would bias E[k (k - 1)] / (G (G - 1)), so it stays out of the spread's counts."""
    buf = StalenessBuffer(staleness=1, group_size=2)

    def scored(gid: str, marks: tuple) -> list:
        return [r.model_copy(update={"meta": r.meta.model_copy(update={"extra": {} if c is None else {"correct": c}})})
                for r, c in zip(group(gid, 0), marks)]

    buf.add_group(scored("part", (True, None)), **LIMITS)
    buf.add_group(scored("whole", (True, False)), **LIMITS)
    s = buf.stats()
    assert (s["completed_scored"], s["completed_correct"]) == (3, 2)
    assert (s["scored_groups"], s["scored_groups_correct"], s["scored_groups_pairs"], s["scored_groups_all_or_none"]) \
        == (1, 1, 0, 0)


def test_completed_groups_are_tallied_by_reward_value_until_the_reward_looks_continuous():
    """The filter drops a group whose rewards are all one value, so its prediction counts the values: each
    value's records and sum n_v (n_v - 1) over groups of G records that all train (a failed episode's group, whose
    record carries no loss, is filtered on the others and stays out); past MAX_REWARD_VALUES values, None."""
    from echo2sdk.core.buffer import MAX_REWARD_VALUES

    buf = StalenessBuffer(staleness=1, group_size=2, filter_zero_variance=True)

    def rewarded(gid: str, *rewards: float, mask: tuple | None = None) -> list:
        return [r.model_copy(update={"reward": x, "meta": r.meta.model_copy(update={"loss_mask": mask} if mask and
                                                                              i == 0 else {})})
                for i, (r, x) in enumerate(zip(group(gid, 0), rewards))]

    assert buf.stats()["reward_values"] == {"groups": 0, "values": []}
    buf.add_group(rewarded("a", 0.1, 0.1), **LIMITS)  # filtered: both boxed, both wrong
    buf.add_group(rewarded("b", 0.0, 1.1), **LIMITS)
    buf.add_group(rewarded("c", 0.0, 0.1, mask=(0,)), **LIMITS)  # its first record carries no loss: not tallied
    assert buf.stats()["reward_values"] == {"groups": 2, "values": [[0.0, 1, 0], [0.1, 2, 2], [1.1, 1, 0]]}
    for i in range(MAX_REWARD_VALUES - 3):  # 13 more values: 16 in all
        buf.add_group(rewarded(f"v{i}", 2.0 + i, 2.0 + i), **LIMITS)
    assert len(buf.stats()["reward_values"]["values"]) == MAX_REWARD_VALUES
    buf.add_group(rewarded("one-more", -1.0, -1.0), **LIMITS)
    assert buf.stats()["reward_values"] is None  # a continuous reward: nothing to predict from
    from echo2sdk.core.buffer import RewardValues

    tally = RewardValues(2)
    tally.add([-0.0, 0.0])  # one value, shown as 0.0
    assert tally.stats() == {"groups": 1, "values": [[0.0, 2, 2]]} and str(tally.stats()["values"][0][0]) == "0.0"
    with pytest.raises(ValueError, match="a group of 3 rewards, not group_size = 2"):
        tally.add([0.0, 1.0, 1.0])


def test_fallback_fills_the_batch_with_the_newest_filtered_groups():
    buf = StalenessBuffer(staleness=2, group_size=2, filter_zero_variance=True, fallback_after=2)
    buf.add_group(group("info", 0), **LIMITS)
    buf.add_group(uniform("old", 0), **LIMITS)
    assert not buf.wait_for(2, timeout=0)  # 1 filtered since the last sample: below fallback_after
    buf.set_version(1)
    buf.add_group(uniform("new", 1), **LIMITS)
    assert buf.wait_for(2, timeout=0)
    batch = buf.sample(2)
    assert [g[0].meta.group_id for g in batch] == ["info", "new"]  # informative first, then the newest filtered
    s = buf.stats()
    assert (s["fallback_groups"], s["aside_groups"]) == (1, 1)
    buf.add_group(group("info2", 1), **LIMITS)
    assert not buf.wait_for(2, timeout=0)  # the patience starts again after every sample
    buf.set_version(3)  # "old" (v0) leaves the window: dropped as filtered, not counted as evicted
    s = buf.stats()
    assert (s["aside_groups"], s["evicted"], s["filtered"]) == (0, 0, 2)
    assert s["admitted"] == s["sampled"] + s["evicted"] + s["filtered"] + s["held"]


@settings(max_examples=100, deadline=None)
@given(
    fallback_after=st.integers(0, 3),
    ops=st.lists(st.tuples(st.sampled_from(["info", "flat", "advance", "sample"]), st.integers(0, 2)), max_size=40),
)
def test_filtering_keeps_the_counters_and_never_samples_a_flat_group_but_by_fallback(fallback_after, ops):
    buf = StalenessBuffer(staleness=1, group_size=2, filter_zero_variance=True, fallback_after=fallback_after)
    flat_sampled = 0
    for i, (kind, arg) in enumerate(ops):
        if kind == "advance":
            buf.set_version(buf.version + arg)
        elif kind == "sample":
            if buf.wait_for(arg, timeout=0):
                batch = buf.sample(arg)
                flat_sampled += sum(len({t.reward for t in g}) == 1 for g in batch)
        else:
            buf.add_group((group if kind == "info" else uniform)(f"g{i}", buf.version), **LIMITS)
        s = buf.stats()
        assert s["admitted"] == s["sampled"] + s["evicted"] + s["filtered"] + s["held"]
        assert s["aside_groups"] <= fallback_after
        assert flat_sampled == s["fallback_groups"]


# ---------------------------------------------------------------- bytes (issue 34)


def _worker_group(gid: str, worker: str, text: str = "", n: int = 2) -> list[Trajectory]:
    return [t.model_copy(update={"response": text or t.response, "meta": t.meta.model_copy(update={"worker": worker})})
            for t in group(gid, 0, n)]


def test_text_beyond_64_characters_per_token_of_max_len_is_refused_and_counted():
    from echo2sdk.core.records import MAX_CHARS_PER_TOKEN, Message

    buf = StalenessBuffer(staleness=2, group_size=2)
    limit = MAX_CHARS_PER_TOKEN * MAX_LEN
    buf.add_group(_worker_group("ok", "w", "x" * limit), **LIMITS)  # at the bound: admitted
    with pytest.raises(TrajectoryRejected, match="'response'.*1025 characters") as e:
        buf.add_group(_worker_group("long", "w", "x" * (limit + 1)), **LIMITS)
    assert e.value.reason == "text_too_long"
    chat = tuple(Message(role="user", content="y" * (limit // 2 + 1)) for _ in range(2))  # together over it
    with pytest.raises(TrajectoryRejected, match="'prompt'"):
        buf.add_group([t.model_copy(update={"prompt": chat}) for t in group("chat", 0)], **LIMITS)
    assert buf.stats()["rejected"] == {"text_too_long": 4} and held(buf) == 2


def test_a_worker_over_its_byte_budget_loses_its_own_oldest_groups():
    from echo2sdk.core.records import held_bytes

    one = held_bytes(_worker_group("probe", "w", "x" * 500))
    buf = StalenessBuffer(staleness=2, group_size=2, bytes_per_worker=3 * one)
    for i in range(5):
        buf.add_group(_worker_group(f"big-{i}", "big", "x" * 500), **LIMITS)
    buf.add_group(_worker_group("small", "honest"), **LIMITS)
    s = buf.stats()
    assert s["evicted_by_reason"] == {"worker_bytes": 4} and s["ready_groups"] == 4
    assert s["held_bytes"] <= 3 * one + held_bytes(_worker_group("s", "honest"))
    kept = {g[0].meta.group_id for g in buf.sample(4)}
    assert kept == {"big-2", "big-3", "big-4", "small"}  # the newest three of `big`; the honest group untouched


def test_a_pool_holds_its_budget_together_and_the_greediest_member_pays():
    from echo2sdk.core.records import held_bytes

    one = held_bytes(_worker_group("probe", "t0", "x" * 500))
    pools = {"t0": ("token", 4 * one), "t1": ("token", 4 * one), "honest": ("token", 4 * one), "cred": None}
    buf = StalenessBuffer(staleness=2, group_size=2, pool_of=pools.get)
    buf.add_group(_worker_group("h", "honest", "x" * 500), **LIMITS)
    for i in range(3):  # one token holder under two ids: 6 groups, the pool holds 4
        buf.add_group(_worker_group(f"a{i}", "t0", "x" * 500), **LIMITS)
        buf.add_group(_worker_group(f"b{i}", "t1", "x" * 500), **LIMITS)
    for i in range(3):  # a credential worker is in no pool
        buf.add_group(_worker_group(f"c{i}", "cred", "x" * 500), **LIMITS)
    s = buf.stats()
    assert s["evicted_by_reason"] == {"pool_bytes": 6}  # 3 groups of 2 records
    ids = {g[0].meta.group_id for g in buf.sample(s["ready_groups"])}
    assert "h" in ids and {"c0", "c1", "c2"} <= ids  # the honest member and the credential keep theirs
    assert len(ids & {"a0", "a1", "a2", "b0", "b1", "b2"}) == 3


def test_held_bytes_counts_text_by_its_width_and_the_extra_strings():
    from echo2sdk.core.records import RECORD_OVERHEAD_BYTES, held_bytes

    (t,) = group("g", 0, 1)
    base = held_bytes([t])
    assert base == RECORD_OVERHEAD_BYTES + len("p") + len(t.response) + 36 * 3 + 32 * 1
    wide = t.model_copy(update={"response": "漢" * 100})  # 2 bytes a character in a Python str
    assert held_bytes([wide]) - base == 200 - len(t.response)
    noted = t.model_copy(update={"meta": t.meta.model_copy(update={"extra": {"note": "x" * 4096}})})
    assert held_bytes([noted]) - base == 64 + 4 + 4096


def test_a_pool_keeps_counting_ids_the_registry_forgot_and_many_small_ids_evict_only_themselves():
    from echo2sdk.core.records import held_bytes

    one = held_bytes(_worker_group("probe", "x", "x" * 500))
    forgotten: set[str] = set()

    def pool_of(worker: str):
        return None if worker in forgotten else ("token", 4 * one)

    buf = StalenessBuffer(staleness=2, group_size=2, bytes_per_worker=2 * one, pool_of=pool_of)
    buf.add_group(_worker_group("h0", "honest", "x" * 500), **LIMITS)
    buf.add_group(_worker_group("h1", "honest", "x" * 500), **LIMITS)  # at its fair share (2 groups)
    for i in range(300):  # ids that push one group each and leave: the registry forgets them
        buf.add_group(_worker_group(f"s{i}", f"small-{i}", "x" * 500), **LIMITS)
        forgotten.add(f"small-{i}")
    s = buf.stats()
    assert s["held_bytes"] <= 4 * one + one // 10  # the pool's budget holds, forgotten ids counted in it
    ids = {g[0].meta.group_id for g in buf.sample(s["ready_groups"])}
    assert {"h0", "h1"} <= ids  # the honest worker, at its fair share, lost nothing
    assert s["evicted_by_reason"] == {"pool_bytes": 2 * 298}
