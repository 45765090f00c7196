"""The whole loop on a tiny random Llama: learner + real worker processes over TCP, math task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("echo2_math")

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.runtime.learner.recipe import Trainer  # noqa: E402

pytestmark = pytest.mark.integration

#: The main job's files as recorded (written before the keys of ADDED_SINCE_RECORDED existed): a run's rows and
#: summary are pinned against these and against a tiny run's.
RECORDED = next(p for p in Path(__file__).resolve().parents if p.name == "tests") / "data" / "math_20step"

#: One metrics.jsonl row: every key, in order, with the types its value may take (None where it may be unset). Each
#: type but None must show up in the tiny run (in the recorded main job for RECORDED_ONLY): a column that changed its
#: type (a float become an int, or always None) fails test_metrics_and_summary_keep_their_keys_order_and_types.
ROW = {
    "step": int, "version": int, "time_s": float, "t_train_s": float, "t_forward_s": float,
    "t_backward_s": float, "t_optim_s": float, "t_publish_s": float, "t_step_wall_s": float,
    "learner_wait_s": float, "reward_mean": float, "reward_std": float, "accuracy": (float, None),
    "rollout_reward_mean": (float, None), "rollout_accuracy": (float, None),
    "filter_rate": (float, None), "filter_rate_predicted": (float, None),
    "prompt_concentration": (float, None), "filter_rate_predicted_reward": (float, None),
    "reward_concentration": (float, None), "rollouts": int,
    "rollouts_per_s": (float, None), "useful_rollouts_per_s": (float, None), "adapter_failures": dict,
    "adapter_failure_rate": (float, None), "learner_wait_filtered_s": float, "learner_wait_empty_s": float,
    "learner_wait_snapshot_s": float,
    "staleness_max": int, "staleness_mean": float, "trajectories": int, "tokens": int, "rejected": int,
    "evicted": int, "groups_filtered": int, "groups_filtered_frac": float, "loss": float, "kl": float,
    "clip_frac": float, "is_weight_mean": float, "is_truncated_frac": float, "grad_norm": float, "lr": float,
    "task": dict, "tasks": dict, "workers_alive": int,
    "t_bcast_s": (float, None), "t_bcast_all_s": (float, None), "t_bcast_received_s": (float, None),
    "broadcast_repairs": int, "sampler_gap": dict,
    "sampler_var": dict, "sampler_replay_gap": dict, "sampler_replay_var": dict, "t_audit_replay_s": float,
    "records_withheld": int, "workers_quarantined": int, "batches_dropped": int,
    "batches_withheld": int, "records_withheld_total": int, "version_span": int,
    "prompts_handed": int, "prompts_skipped": int, "prompts_skipped_by_reason": dict,
    "prompt_explore": (float, None), "filter_rate_unskipped": (float, None), "rollouts_per_useful": (float, None),
}

#: Columns the tiny run leaves None (tiny-random's prompts all look alike): their types are seen in RECORDED.
RECORDED_ONLY = {"prompt_concentration", "reward_concentration"}
#: Columns the tiny run leaves None, and where their other type is seen: learner.prompt_skip is off there
#: (tests/runtime/learner/test_prompt_skip.py runs with it), and tiny-random fills no group with signal (f = 1, so no
#: rollouts per useful one: tests/core/test_verdict.py).
NOT_IN_TINY_RUN = {"prompt_explore": "test_prompt_skip.py", "filter_rate_unskipped": "test_prompt_skip.py",
                   "rollouts_per_useful": "test_verdict.py"}

#: summary.json of the main job's configuration (no broadcast.delta: "deltas", no broadcast.store: "store"): its
#: keys in order, and those of its objects ("workers": one worker's row; "config": its sections, config.py's own).
SUMMARY = [
    "steps", "wall_s", "reward_first5", "reward_last5", "accuracy_first5", "accuracy_last5", "rollout_reward_first5",
    "rollout_reward_last5", "rollout_accuracy_first5", "rollout_accuracy_last5", "staleness_max", "S", "kappa", "R",
    "T_train_median_s", "T_train_full_batch_s", "T_bcast_median_s", "T_bcast_received_median_s", "mu_pool_measured",
    "mu_min", "bubble_ratio", "capacity", "buffer", "coordinator", "workers", "checkpoint", "last_checkpoint",
    "save_errors", "stopped", "learner_ranks", "quarantined", "batches_dropped", "batches_partial",
    "batches_dropped_records_by_worker", "batches_withheld", "records_withheld_by_worker", "prompt_filter", "bill", "warnings", "config",
]
SUMMARY_OBJECTS = {
    # "why" only where the pool was not enough (or none could be)
    "capacity": ["mu_pool_raw", "filter_rate", "accuracy", "prompt_concentration", "filter_rate_predicted",
                 "filter_rate_binary", "reward_concentration", "filter_rate_predicted_reward", "reward_shares",
                 "mu_pool_useful", "mu_min", "mu_min_without_broadcast", "enough", "short_because_of_filtering",
                 "short_because_of_broadcast", "learner_wait_s", "learner_wait_filtered_s", "learner_wait_empty_s",
                 "learner_wait_snapshot_s", "why"],
    "buffer": ["version", "admitted", "rejected", "evicted", "evicted_by_reason", "sampled", "staleness_hist", "held",
               "held_bytes", "pending_groups", "ready_groups", "filtered", "completed_records", "completed_reward_sum",
               "completed_scored", "completed_correct", "completed_groups", "filtered_groups", "scored_groups",
               "scored_groups_correct", "scored_groups_pairs", "scored_groups_all_or_none", "reward_values",
               "fallback_groups", "aside_groups", "completed_by_task"],
    "coordinator": ["workers_alive", "workers_seen", "refused", "refused_revoked", "quarantines", "rejected",
                    "empty_groups", "protocol_errors", "broadcast_repairs", "write_timeouts", "adapter_failures",
                    "groups_dropped", "rate_limited", "evicted", "over_capacity", "failed_logins", "handshake_timeouts"],
    "workers": ["worker_id", "address", "price_per_hour", "backend", "version", "joined_at", "last_seen",
                "trajectories", "rejected", "rollouts_per_s", "alive", "active", "relay_addr", "relay_reachable",
                "credential", "rejoins", "adapter_failures", "groups_dropped"],
    "last_checkpoint": ["path", "step", "bytes", "save_s"],
    "prompt_filter": ["enabled", "handed_all", "forced", "forgotten", "foreign", "pending"],  # the filter's own with prompt_skip
    "bill": ["measure", "rollouts_generated", "machine_hours", "cost_usd", "accuracy_first5", "accuracy_last5",
             "gain_points", "rollouts_per_point", "machine_hours_per_point", "usd_per_point"],
    "config": ["model", "task", "rollout", "learner", "broadcast", "scheduler", "provisioning", "run"],
}
OPTIONAL = {"capacity": {"why"}}

#: Keys that the recorded main job's files (RECORDED) predate.
ADDED_SINCE_RECORDED = {
    "metrics": ["t_bcast_received_s", "version_span", "prompts_handed", "prompts_skipped", "prompts_skipped_by_reason",
                "prompt_explore", "filter_rate_unskipped", "rollouts_per_useful"],
    "summary": ["T_bcast_received_median_s", "prompt_filter", "bill"],
    "capacity": ["mu_min_without_broadcast", "short_because_of_broadcast"],
    "coordinator": ["empty_groups"],
}


def _kinds(kind: object) -> tuple:
    return tuple(type(None) if k is None else k for k in (kind if isinstance(kind, tuple) else (kind,)))


def _check_row(row: dict) -> None:
    assert list(row) == list(ROW)
    for key, kind in ROW.items():
        assert type(row[key]) in _kinds(kind), f"{key} = {row[key]!r} is not {kind}"


def _summary_keys(summary: dict) -> dict[str, list[str]]:
    """summary.json's keys ("summary") and those of its objects (SUMMARY_OBJECTS' names; "workers": the first row's),
    the optional ones (OPTIONAL) left out."""
    objects = {name: summary[name][0] if name == "workers" else summary[name] for name in SUMMARY_OBJECTS
               if name in summary}  # an object added since the recorded main job is absent there
    return {"summary": list(summary), **{name: [k for k in obj if k not in OPTIONAL.get(name, ())]
                                         for name, obj in objects.items()}}


def _pinned(name: str, recorded: bool = False) -> list[str]:
    """The pinned keys of "metrics", "summary" or one of SUMMARY_OBJECTS, the optional ones left out; `recorded`:
    as the recorded main job has them (without ADDED_SINCE_RECORDED)."""
    keys = {"metrics": list(ROW), "summary": SUMMARY, **SUMMARY_OBJECTS}[name]
    return [k for k in keys if k not in OPTIONAL.get(name, ()) and not (recorded and k in ADDED_SINCE_RECORDED.get(name, ()))]


def _cfg(tmp_path, steps=6, workers=2, S=2, extra=()):
    return load_config(
        None,
        [
            'model.policy="tiny-random"',
            f"rollout.workers={workers}",
            "rollout.group_size=4",
            "rollout.max_new_tokens=12",
            "rollout.nice=0",
            f"learner.steps={steps}",
            "learner.trajectories_per_step=8",
            f"learner.staleness={S}",
            "learner.lr=1e-4",
            "learner.data_timeout_s=120",
            "run.progress=false",
            "run.heartbeat_s=0.5",
            f'run.out="{tmp_path}"',
            *extra,
        ],
    )


@pytest.mark.slow
def test_run_writes_metrics_summary_and_checkpoint(tiny_run):
    """The shared run (conftest.py): 8 steps, the token given in its config, local-0 killed after step 2."""
    tr, summary, tmp_path, steps = tiny_run.tr, tiny_run.summary, tiny_run.out, tiny_run.steps
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        _check_row(r)
        assert 0 <= r["staleness_max"] <= 2  # S
        assert r["trajectories"] == tiny_run.R and r["version"] == r["step"]
    assert any(r["t_bcast_s"] is not None for r in rows)  # snapshots reached the workers (kappa = 1)
    # a copy is complete before it is installed: the received part of T_bcast is never longer
    assert any(r["t_bcast_received_s"] is not None for r in rows)
    assert all(r["t_bcast_received_s"] <= r["t_bcast_s"] for r in rows if r["t_bcast_received_s"] is not None)
    assert summary["T_bcast_received_median_s"] <= summary["T_bcast_median_s"]
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == steps == summary["steps"]
    for r in rows:  # the wait split by cause adds up to it (1 ms of rounding each)
        causes = r["learner_wait_filtered_s"] + r["learner_wait_empty_s"] + r["learner_wait_snapshot_s"]
        assert abs(causes - r["learner_wait_s"]) < 2e-3, r
    cap = summary["capacity"]  # the capacity rule judged in useful rollouts (issue 35)
    f = summary["buffer"]["filtered_groups"] / max(summary["buffer"]["completed_groups"], 1)
    assert cap["filter_rate"] == round(f, 4) and cap["mu_pool_useful"] == pytest.approx(cap["mu_pool_raw"] * (1 - f))
    b = summary["buffer"]  # the whole run's binary-reward prediction (metrics.prediction) from the buffer's counts
    assert cap["filter_rate_binary"] == (round(b["scored_groups_all_or_none"] / b["scored_groups"], 4)
                                         if b["scored_groups"] else None)
    assert cap["accuracy"] == (round(b["completed_correct"] / b["completed_scored"], 4) if b["scored_groups"] else None)
    assert cap["enough"] in (True, False, None) and cap["learner_wait_s"] == pytest.approx(
        sum(r["learner_wait_s"] for r in rows), abs=1e-2)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint")
    assert all(p.poll() is not None for p in tr.procs) or not tr.procs
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and tiny_run.token.encode() in p.read_bytes()]
    assert leaked == [], leaked


def test_killing_a_worker_does_not_stop_training(tiny_run):
    tr = tiny_run.tr
    assert tiny_run.killed_at_step >= 2 and len(tr.rows) == tiny_run.steps
    assert tr.rows[-1]["workers_alive"] == 1
    assert "local-0" in (tiny_run.out / "run.log").read_text()


@pytest.mark.slow
def test_metrics_and_summary_keep_their_keys_order_and_types(tiny_run):
    """metrics.jsonl's keys, their order and their values' types (ROW), and summary.json's keys with those of its
    objects (SUMMARY, SUMMARY_OBJECTS), as the shared tiny run writes them and as the recorded main job did (the
    keys added since, ADDED_SINCE_RECORDED, aside). A column added, moved, renamed or retyped fails here: change
    ROW, SUMMARY and the docs (docs/observability.md) with it."""
    runs = {"tiny run": tiny_run.out, "recorded main job": RECORDED}
    rows = {name: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            for name, d in runs.items()}
    for r in rows["tiny run"]:
        _check_row(r)
    for r in rows["recorded main job"]:
        assert list(r) == _pinned("metrics", recorded=True)
        assert all(type(r[key]) in _kinds(ROW[key]) for key in r), r
    seen = {key: {type(r[key]) for r in rows["recorded main job" if key in RECORDED_ONLY else "tiny run"]}
            for key in ROW}
    unseen = {key: kinds for key, kind in ROW.items()
              if key not in NOT_IN_TINY_RUN and (kinds := set(_kinds(kind)) - {type(None)} - seen[key])}
    assert unseen == {}, f"types no row has: {unseen}"
    summaries = {name: json.loads((d / "summary.json").read_text()) for name, d in runs.items()}
    for name, summary in summaries.items():
        recorded = name == "recorded main job"
        names = [k for k in SUMMARY_OBJECTS if not (recorded and k in ADDED_SINCE_RECORDED["summary"])]
        assert _summary_keys(summary) == {k: _pinned(k, recorded) for k in ("summary", *names)}, name
        assert all(set(w) == set(SUMMARY_OBJECTS["workers"]) for w in summary["workers"]), name
        assert set(summary["capacity"]) - set(SUMMARY_OBJECTS["capacity"]) == set(), name


def test_calibrate_measures_decides_and_hands_the_pool_to_the_scheduler(tmp_path):
    prices = ['scheduler.enabled=true', 'scheduler.prices={"local-0" = 0.3, "local-1" = 0.5}']
    tr = Trainer(_cfg(tmp_path, steps=2, S=3, extra=prices))
    try:
        cal = tr.calibrate(steps=2)
        assert list(cal) == ["T_train", "T_train_steps", "T_bcast", "mu", "filter_rate", "prices", "plan", "decision"]
        assert len(cal["T_train_steps"]) == 2 and cal["T_train"] > 0 and cal["T_bcast"] >= 0
        assert set(cal["mu"]) <= {"local-0", "local-1"} and cal["prices"] == {"local-0": 0.3, "local-1": 0.5}
        assert json.loads((tmp_path / "calibration.json").read_text())["decision"] == cal["decision"]
        assert tr.version == 1  # the unchanged policy, published once to time T_bcast
        tr.run()
    finally:
        tr.close()
    assert [r["version"] for r in tr.rows] == [2, 3]
    events = (tmp_path / "scheduler.jsonl").read_text().splitlines() if (tmp_path / "scheduler.jsonl").exists() else []
    assert not events or json.loads(events[0])["event"] == "provisioned"


def _components_columns(records: list, st_withheld: list[bool] = (), t_bcast=(0.25, 0.5, 0.2)) -> list[dict]:
    """Each component's columns of one metrics row, made without a run: a batch of `records` sampled at v_t 4, a
    learner step's stats, a publication's T_bcast, an audit with nothing to say, the batches dropped, the pool."""
    from echo2sdk.core.learner import StepStats
    from echo2sdk.runtime.learner.batches import Batch
    from echo2sdk.runtime.learner.metrics import RunMetrics
    from echo2sdk.runtime.learner.publication import BcastTimes
    from echo2sdk.runtime.learner.replay import AuditReplay

    st = StepStats(loss=0.1, kl=0.0, clip_frac=0.0, is_weight_mean=1.0, is_truncated_frac=0.0, tokens=12,
                   t_train_s=0.5, t_forward_s=0.2, t_backward_s=0.2, t_optim_s=0.1, grad_norm=1.0,
                   withheld=list(st_withheld))
    batch = Batch([records], v_t=4, k=1, lr_scale=1.0, waited=0.1, wait_causes={"empty": 0.1}, taken_at=2.5)
    audit = AuditReplay(None, None, lie_threshold=0.0, lie_var_threshold=0.0, replay_n=0)
    buffer = {**dict.fromkeys(("completed_records", "completed_reward_sum", "completed_scored", "completed_correct",
                               "completed_groups", "filtered_groups", "scored_groups", "scored_groups_correct",
                               "scored_groups_pairs", "evicted"), 0), "reward_values": None}
    coordinator = {"adapter_failures": {}, "rejected": {"stale": 2}, "workers_alive": 2, "broadcast_repairs": 0,
                   "quarantines": 0}
    pool = RunMetrics(out=None, sinks=None, R=2, kappa=1, group_size=2).since_last(buffer, coordinator, records)
    from echo2sdk.runtime.coordinator.handout import Handout

    return [{"step": 2, "version": 5, "time_s": 3.0}, batch.metrics(now=3.0), st.metrics(),
            {"t_publish_s": 0.0, **BcastTimes(*t_bcast).columns()}, audit.metrics({}), {"batches_dropped": 0},
            Handout(iter(())).metrics(), pool]


def test_a_metrics_row_is_the_components_columns_in_order():
    from types import SimpleNamespace

    from echo2sdk.runtime.learner.metrics import metrics_row

    records = [SimpleNamespace(reward=r, version=3, meta=SimpleNamespace(extra={"correct": r > 0, "turns": 2}))
               for r in (0.0, 1.0)]
    row = metrics_row(*_components_columns(records, [False, True]))
    _check_row(row)
    assert row["reward_mean"] == 0.5 and row["accuracy"] == 0.5 and row["task"] == {"correct": 0.5, "turns": 2.0}
    assert (row["t_bcast_s"], row["t_bcast_all_s"], row["t_bcast_received_s"], row["staleness_max"]) == (0.25, 0.5, 0.2, 1)
    assert row["t_step_wall_s"] == 0.6 and row["learner_wait_empty_s"] == 0.1 and row["records_withheld"] == 1
    assert row["rejected"] == 2
    unscored = [SimpleNamespace(reward=-1.0, version=3, meta=SimpleNamespace(extra={"chips": -1.0}))] * 2
    row = metrics_row(*_components_columns(unscored, t_bcast=()))
    assert row["accuracy"] is None  # a task that scores no "correct" (poker) has no accuracy, not 0
    assert row["t_bcast_s"] is None
    parts = _components_columns(records)
    with pytest.raises(ValueError, match="given twice"):
        metrics_row(*parts, {"loss": 0.0})
    with pytest.raises(ValueError, match="missing.*'lr'"):
        metrics_row(*parts[:2], {k: v for k, v in parts[2].items() if k != "lr"}, *parts[3:])
    assert list(metrics_row(*parts, {"new_column": 1}))[-1] == "new_column"  # a new column follows COLUMNS


def test_the_prompts_concentration_is_measured_over_the_last_steps_and_the_run_over_all():
    """A step completes a few groups, too few to tell how alike its prompts are: metrics.jsonl's
    prompt_concentration pools the last NU_WINDOW steps (its prediction takes the step's own accuracy), and
    summary.json's capacity the whole run, beside the share of groups a binary reward would have filtered."""
    from echo2sdk.core import capacity
    from echo2sdk.core.buffer import COMPLETED
    from echo2sdk.core.verdict import prediction
    from echo2sdk.runtime.learner.metrics import NU_WINDOW, RunMetrics

    m, G = RunMetrics(out=None, sinks=None, R=8, kappa=1, group_size=4), 4
    done = dict.fromkeys(COMPLETED, 0)

    def step(ks: list[int]) -> dict:  # groups of G scored records with k correct each
        for k in ks:
            for key, add in (("completed_records", G), ("completed_scored", G), ("completed_correct", k),
                             ("completed_groups", 1), ("scored_groups", 1), ("scored_groups_correct", k),
                             ("scored_groups_pairs", k * (k - 1))):
                done[key] += add
        return m.rollout_since_last(done)

    first = step([4, 0])  # one prompt always solved, one never: the widest spread
    assert first["prompt_concentration"] == round(capacity.NU_FLOOR, 4) and first["filter_rate_predicted"] > 0.99
    # then prompts each solved half the time: k = 1 and 3, as a binomial spreads them
    alike = [step([1, 3]) for _ in range(NU_WINDOW - 1)]
    # the first step is still in the window: 20 groups, sum k 40, sum k (k - 1) 66
    assert alike[-1]["prompt_concentration"] == round(capacity.prompt_concentration(20, G, 40, 66), 4) < 10
    assert alike[-1]["filter_rate_predicted"] > capacity.filter_rate(0.5, G) + 0.05
    later = step([1, 3])  # the first step has left the window: alike but for the noise of 20 groups
    assert later["prompt_concentration"] > 50
    assert later["filter_rate_predicted"] == pytest.approx(capacity.filter_rate(0.5, G), abs=0.01)

    buffer = {"completed_scored": 9, "completed_correct": 4, "scored_groups": 2, "scored_groups_correct": 4,
              "scored_groups_pairs": 12, "scored_groups_all_or_none": 2}  # and one record scored apart
    f = round(capacity.filter_rate(4 / 9, G, capacity.NU_FLOOR), 4)
    assert prediction(buffer, G) == {"accuracy": round(4 / 9, 4), "prompt_concentration": round(capacity.NU_FLOOR, 4),
                                     "filter_rate_predicted": f, "filter_rate_binary": 1.0,
                                     "reward_concentration": None, "filter_rate_predicted_reward": None,
                                     "reward_shares": None}
    assert prediction({}, G)["filter_rate_predicted"] is None and prediction(buffer, 0)["accuracy"] is None


def test_the_filter_is_predicted_from_the_values_the_reward_took():
    """math pays 0.1 for a boxed wrong answer: groups all wrong but not all unboxed are not filtered, which the
    binary prediction cannot see. The prediction by reward values reads the buffer's RewardValues tally: the
    step's shares of each value, nu over the last NU_WINDOW steps, the whole run in summary.json."""
    from echo2sdk.core import capacity
    from echo2sdk.core.buffer import COMPLETED, RewardValues
    from echo2sdk.core.verdict import prediction, reward_prediction
    from echo2sdk.runtime.learner.metrics import NU_WINDOW, RunMetrics

    G, tally = 4, RewardValues(4)
    m = RunMetrics(out=None, sinks=None, R=8, kappa=1, group_size=G)

    def step(groups: list[list[float]]) -> dict:
        for g in groups:
            tally.add(g)
        return m.rollout_since_last({**dict.fromkeys(COMPLETED, 0), "reward_values": tally.stats()})

    first = step([[1.1] * 4, [0.0] * 4])  # one prompt always right, one never even boxed: every group filtered
    assert first["reward_concentration"] == round(capacity.NU_FLOOR, 4)
    assert first["filter_rate_predicted_reward"] > 0.99
    # then every prompt's answers all wrong, half of them boxed (0.1): 1 and 3 boxed as a binomial spreads them;
    # no group right, and few of them filtered
    mixed = [step([[0.1, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.0]]) for _ in range(NU_WINDOW)]
    assert mixed[-1]["filter_rate_predicted_reward"] == pytest.approx(capacity.value_filter_rate((0.5, 0.5), G), abs=0.02)
    assert mixed[0]["filter_rate_predicted_reward"] > mixed[-1]["filter_rate_predicted_reward"]  # the first step left
    # the whole run, as summary.json gives it, and readings with nothing new or no tally (a continuous reward)
    whole = prediction({"reward_values": tally.stats()}, G)
    counts = [[n for _, n, _ in tally.stats()["values"]], [p for *_, p in tally.stats()["values"]]]
    nu = capacity.value_concentration(2 + 2 * NU_WINDOW, G, *counts)
    assert whole["reward_concentration"] == round(nu, 4)
    assert whole["reward_shares"] == [[v, round(n / (G * (2 + 2 * NU_WINDOW)), 4)] for v, n, _ in tally.stats()["values"]]
    assert whole["filter_rate_predicted_reward"] == round(capacity.value_filter_rate(
        [n / (G * (2 + 2 * NU_WINDOW)) for n in counts[0]], G, nu), 4)
    nothing = {"reward_concentration": None, "filter_rate_predicted_reward": None}
    assert reward_prediction(tally.stats(), tally.stats(), G) == nothing
    assert reward_prediction(tally.stats(), None, G) == nothing and reward_prediction(None, tally.stats(), G) == nothing


def test_builders_fit_the_constructors(tmp_path):
    import inspect

    from echo2sdk.core.buffer import StalenessBuffer
    from echo2sdk.core.learner import Learner
    from echo2sdk.runtime.coordinator import Coordinator
    from echo2sdk.runtime.learner.build import buffer_args, coordinator_args, learner_args, worker_config

    cfg = _cfg(tmp_path)
    inspect.signature(Learner).bind("model-folder", **learner_args(cfg))
    inspect.signature(StalenessBuffer).bind(**buffer_args(cfg))
    inspect.signature(Coordinator).bind(buffer=None, tasks=iter(()), worker_config=worker_config(cfg, "folder"),
                                        vocab_size=8, **coordinator_args(cfg, "token"))


def test_model_policy_accepts_a_hub_id_from_the_local_cache(tmp_path):
    """A hub id resolves from the Hugging Face cache with the hub offline; one that is not cached is a
    ConfigError naming the cache and the command that fills it."""
    import os
    import shutil
    import subprocess
    import sys

    from echo2sdk.weights import resolve_model

    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(resolve_model("tiny-random"), snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    code = ("import sys\nfrom echo2sdk.config import load_config\nfrom echo2sdk.weights import resolve_model\n"
            "from echo2sdk.errors import ConfigError\n"
            "cfg = load_config(None, ['model.policy=\"acme/tiny\"'])\nprint(resolve_model(cfg.model.policy))\n"
            "try:\n    resolve_model('acme/absent@v2')\nexcept ConfigError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found, error = done.stdout.splitlines()[:2]
    assert found == str(snapshot)
    assert "acme/absent@v2" in error and str(tmp_path / "hub") in error and "hf download acme/absent" in error


def test_a_tiny_run_logs_config_steps_samples_and_staleness_to_its_sinks(tiny_run):
    """The shared real run (conftest.py): run.log_to = ["jsonl", "tensorboard"], 3 samples every 2 steps."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, steps = tiny_run.out, list(range(1, tiny_run.steps + 1))
    assert json.loads((out / "config.json").read_text())["run"]["token"] == "<redacted>"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == steps
    tables = [json.loads(line) for line in (out / "tables.jsonl").read_text().splitlines()]
    samples = next(t for t in tables if t["name"] == "samples")
    assert samples["step"] == 2 and len(samples["rows"]) == 3 and {"prompt", "response", "reward"} <= set(samples["rows"][0])
    assert any(t["name"] == "t_bcast" for t in tables)
    hists = [json.loads(line) for line in (out / "histograms.jsonl").read_text().splitlines()]
    assert [h["step"] for h in hists if h["name"] == "staleness"] == steps
    assert sum(next(h for h in hists if h["name"] == "staleness")["counts"].values()) == tiny_run.R
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward_mean")] == steps and "task/correct" in acc.Tags()["scalars"]


def test_a_runs_log_file_stops_at_its_close(tmp_path):
    """Two runs in one process (a bench, a notebook): the first run's run.log gets none of the second's lines
    (seen in bench/joiner.py before the handler was removed at close)."""
    import logging

    from echo2sdk.runtime.learner import console

    first = console.log_to(tmp_path / "a.log")
    assert console.log_to(tmp_path / "a.log") is None  # one handler per file
    logging.getLogger("echo2sdk.learner").info("first run")
    console.stop_logging_to(first)
    second = console.log_to(tmp_path / "b.log")
    logging.getLogger("echo2sdk.learner").info("second run")
    console.stop_logging_to(second)
    assert "first run" in (tmp_path / "a.log").read_text() and "second run" not in (tmp_path / "a.log").read_text()
    assert "second run" in (tmp_path / "b.log").read_text()
