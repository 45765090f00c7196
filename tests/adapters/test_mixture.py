"""Issue 33: task mixtures ([[task.mix]]) drawn by weight, scored by their components, split by task in the
metrics; Score.info and Task.info carried into the records; the metrics' per-task rows and health warnings."""

from __future__ import annotations

import collections
import itertools
import json
import logging

import pytest

from echo2sdk.config import load_config
from echo2sdk.core.contracts import Score, Task
from echo2sdk.errors import ConfigError
from echo2sdk.plugins import load_adapter
from echo2sdk.testing import MockBackend, check_adapter


def _qa(tmp_path, name="qa.jsonl", rows=None):
    rows = rows or [{"question": f"{i}+1?", "answer": str(i + 1), "level": i % 3} for i in range(30)]
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _mix(tmp_path):
    return [{"adapter": "toy", "weight": 3.0},
            {"adapter": f"dataset://{_qa(tmp_path)}", "weight": 1.0, "options": {"info": ["level"]}}]


def test_a_mixture_draws_by_weight_and_scores_with_the_component(tmp_path):
    adapter = load_adapter("mixture", {"mix": _mix(tmp_path)})
    tasks = list(itertools.islice(adapter.tasks(0), 4000))
    counts = collections.Counter(t.info["task"] for t in tasks)
    assert set(counts) == {"toy", "qa"} and abs(counts["toy"] / 4000 - 0.75) < 0.03
    assert tasks == list(itertools.islice(adapter.tasks(0), 4000))  # seeded
    qa = next(t for t in tasks if t.info["task"] == "qa")
    assert qa.id.startswith("qa/") and qa.info["level"] in (0, 1, 2)
    assert adapter.score(qa, f"<answer>{qa.answer}</answer>").correct  # the dataset's scorer, its own task
    toy = next(t for t in tasks if t.info["task"] == "toy")
    assert adapter.score(toy, toy.answer).correct and not adapter.score(toy, "nope").correct
    with pytest.raises(ValueError, match="names no component"):
        adapter.score(Task(id="x/1", messages=(), info={"task": "other"}), "")
    report = check_adapter(adapter, backend=MockBackend(), n=2, groups=2)
    assert report["tasks_checked"] == 100
    assert load_adapter(*adapter.spec()) == adapter


def test_mixture_errors_name_the_component_and_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"task.mix\[1\].weight must be > 0"):
        load_adapter("mixture", {"mix": [{"adapter": "toy"}, {"adapter": "toy", "weight": 0, "name": "b"}]})
    with pytest.raises(ConfigError, match=r"task.mix\[1\]: the name 'toy' is taken"):
        load_adapter("mixture", {"mix": [{"adapter": "toy"}, {"adapter": "toy"}]})
    with pytest.raises(ConfigError, match=r"task.mix\[0\]: unknown key\(s\) \['ratio'\]"):
        load_adapter("mixture", {"mix": [{"adapter": "toy", "ratio": 2}]})
    with pytest.raises(ConfigError, match=r"task.mix\[0\].adapter = 'gym://FrozenLake-v1' is episodic"):
        load_adapter("mixture", {"mix": [{"adapter": "gym://FrozenLake-v1"}]})


def test_task_mix_tables_in_a_config_become_the_mixture_adapter(tmp_path):
    path = tmp_path / "mix.toml"
    qa = _qa(tmp_path)
    path.write_text(f"""
[[task.mix]]
adapter = "toy"
weight = 2

[[task.mix]]
adapter = "dataset://{qa}"
options = {{ scorer = "contains" }}
""")
    cfg = load_config(path)
    assert cfg.task.adapter == "mixture" and [p["adapter"] for p in cfg.task.options["mix"]] == ["toy", f"dataset://{qa}"]
    again = load_config(None, [f"task.adapter={json.dumps(cfg.task.adapter)}",
                               "task.options={ mix = [{ adapter = 'toy' }] }"])
    assert again.task.options == {"mix": [{"adapter": "toy"}]}  # a dumped config reads back
    assert load_config(path, ['task.adapter="math"']).task.adapter == "math"  # --set replaces the mixture
    bad = tmp_path / "bad.toml"
    bad.write_text('[task]\nadapter = "math"\n[[task.mix]]\nadapter = "toy"\n')
    with pytest.raises(ConfigError, match="task.mix is a mixture of adapters: it replaces task.adapter"):
        load_config(bad)


def test_a_worker_refuses_a_mixture_component_it_must_not_load():
    from echo2sdk.runtime.protocol.messages import WorkerConfig
    from echo2sdk.runtime.trust.plugin_policy import allowances, check_plugins

    def cfg(component):
        return WorkerConfig.from_mapping({"adapter": "mixture", "adapter_options": {"mix": [{"adapter": "toy"}, component]},
                                          "backend": "mock"})

    check_plugins(cfg({"adapter": "dataset://x.jsonl"}))
    with pytest.raises(ConfigError, match="named adapter 'evil.module:Adapter', which is not registered"):
        check_plugins(cfg({"adapter": "evil.module:Adapter"}))
    with pytest.raises(ConfigError, match="has a ':' in its env id"):
        check_plugins(cfg({"adapter": "gym://evil.module:Env"}))
    with pytest.raises(ConfigError, match="adapter 'nosuch://x' loads nothing here: unknown URL scheme"):
        check_plugins(cfg({"adapter": "nosuch://x"}))
    assert allowances(cfg({"adapter": "evil.module:Adapter"})) == ["evil.module:Adapter"]


# -- records and metrics --------------------------------------------------------------------------------------
def test_score_info_and_task_info_go_into_the_records():
    from echo2sdk.core.contracts import SamplingParams
    from echo2sdk.core.rollout import RolloutStats, generate_groups

    class _Info:
        def tasks(self, seed):
            for i in itertools.count():
                yield Task(id=f"t{i}", messages=({"role": "user", "content": "hi"},), answer="a",
                           info={"level": i % 2, "source": "file.jsonl", "task": "mine", "nested": [1, 2]})

        def score(self, task, response):
            return Score(reward=0.5, correct=False, info={"answered": True, "level": 9, "correct": "shadowed"})

    tasks = list(itertools.islice(_Info().tasks(0), 2))
    groups = generate_groups(MockBackend(), _Info(), tasks, 2, SamplingParams(max_new_tokens=4, seed=0), version=0,
                             stats=RolloutStats())
    extra = groups[1][0].meta.extra
    assert extra["level"] == 9 and extra["source"] == "file.jsonl" and extra["task"] == "mine"  # the score's wins
    assert extra["answered"] is True and extra["correct"] is False  # the runtime's own keys win over both
    assert "nested" not in extra  # not a scalar


def _record(task, reward, correct, group="g", **extra):
    from echo2sdk.core.records import Message, Meta, Trajectory

    meta = Meta(group_id=group, prompt_ids=(1,), response_ids=(2,), logprobs=(-1.0,), worker="w",
                extra={"task": task, "correct": correct, **extra})
    return Trajectory(prompt=(Message(role="user", content="x"),), response="y", reward=reward, version=0, meta=meta)


def test_per_task_metrics_split_the_batch_and_never_average_ids():
    from echo2sdk.runtime.learner.batches import is_measure, per_task, task_means

    batch = [_record("a", 1.0, True, level=1, row=7, dataset_seed=99, secret_id=3, note="x"),
             _record("a", 0.0, False, level=3, row=8, dataset_seed=98, secret_id=4, note="y"),
             _record("b", 0.5, None, level=2, row=1, dataset_seed=97, secret_id=5, note="z")]
    assert task_means(batch) == {"correct": 0.5, "level": 2.0}
    assert not any(is_measure(k, 1) for k in ("row", "index", "epoch", "seed", "dataset_seed", "secret_id", "x_index"))
    rollout = {"a": {"rollout_accuracy": 0.25, "filter_rate": 0.5, "groups_completed": 4},
               "c": {"rollout_accuracy": 0.0, "filter_rate": 1.0, "groups_completed": 2}}
    out = per_task(batch, rollout)
    assert out["a"] == {"trajectories": 2, "reward_mean": 0.5, "accuracy": 0.5, "rollout_accuracy": 0.25,
                        "filter_rate": 0.5, "groups_completed": 4, "info": {"correct": 0.5, "level": 2.0}}
    assert out["b"]["accuracy"] is None and out["c"]["trajectories"] == 0  # completed, none trained on
    assert per_task([_record(None, 1.0, True)]) == {}


def test_the_buffer_counts_completed_groups_by_task_with_a_bound_on_names():
    from echo2sdk.core.buffer import MAX_TASKS, OTHER_TASK, StalenessBuffer
    from echo2sdk.runtime.learner.metrics import RunMetrics

    buf = StalenessBuffer(staleness=3, group_size=2, filter_zero_variance=True)
    for k in range(MAX_TASKS + 3):
        g = [_record(f"t{k}", 1.0, True, f"g{k}"), _record(f"t{k}", 0.0 if k % 2 else 1.0, k % 2 == 0, f"g{k}")]
        buf.add_group(g, vocab_size=10, max_len=64)
    by = buf.stats()["completed_by_task"]
    assert len(by) == MAX_TASKS + 1 and by[OTHER_TASK].groups == 3  # 3 groups past the bound
    assert by["t0"] == (2, 2.0, 2, 2, 1, 1, 1, 2, 2) and by["t1"] == (2, 1.0, 2, 1, 1, 0, 1, 1, 0)  # t0: filtered
    m = RunMetrics(out=None, sinks=None, R=4, kappa=1, group_size=2)
    tasks = m.rollout_since_last(buf.stats())["tasks_rollout"]
    assert tasks["t0"]["filter_rate"] == 1.0 and tasks["t1"]["rollout_accuracy"] == 0.5
    assert tasks["t1"]["groups_completed"] == 1
    assert m.rollout_since_last(buf.stats())["tasks_rollout"]["t1"]["groups_completed"] == 0  # since the last call


def test_failures_since_last_are_per_step_and_survive_a_worker_restart():
    from echo2sdk.runtime.learner.metrics import RunMetrics

    m = RunMetrics(out=None, sinks=None, R=4, kappa=1)
    assert m.failures_since_last({}, 10) == {"adapter_failures": {}, "adapter_failure_rate": 0.0}
    assert m.failures_since_last({"adapter_error": 2}, 18) == {"adapter_failures": {"adapter_error": 2},
                                                                 "adapter_failure_rate": 0.1}
    assert m.failures_since_last({"adapter_error": 1}, 8)["adapter_failures"] == {}  # a restarted worker: 0 again
    assert m.failures_since_last({"adapter_error": 1}, 0)["adapter_failure_rate"] is None


def test_health_warns_without_reward_signal_and_on_rising_failures(caplog):
    from echo2sdk.runtime.learner.health import Health

    h = Health(steps=3, repeat=5)
    flat = {"reward_std": 0.0, "reward_mean": 0.0, "grad_norm": 0.0, "rollout_accuracy": 0.0, "adapter_failures": {}}
    with caplog.at_level(logging.WARNING, logger="echo2sdk.health"):
        assert h.check({**flat, "step": 1}) == [] and h.check({**flat, "step": 2}) == []
        [w] = h.check({**flat, "step": 3})
        assert w.startswith("no reward signal for 3 steps (step 3)") and "accuracy 0.00" in w
        assert [h.check({**flat, "step": s}) for s in (4, 5, 6, 7)] == [[], [], [], []]
        assert h.check({**flat, "step": 8})[0].startswith("no reward signal for 8 steps")  # repeated every 5
        assert h.check({**flat, "reward_std": 0.4, "step": 9}) == []
        assert h.silent == 0
        filtered = {**flat, "reward_std": 0.3, "filter_rate": 1.0}
        assert [bool(h.check({**filtered, "step": s})) for s in (10, 11, 12)] == [False, False, True]
        ok = {**flat, "reward_std": 0.3, "filter_rate": 0.5}
        [w] = h.check({**ok, "step": 13, "adapter_failures": {"adapter_error": 1}, "adapter_failure_rate": 0.05})
        assert "the task adapter failed 1 rollout(s)" in w and "adapter_error 1" in w
        assert h.check({**ok, "step": 14, "adapter_failures": {"adapter_error": 1}, "adapter_failure_rate": 0.06}) == []
        [w] = h.check({**ok, "step": 15, "adapter_failures": {"nan": 3}, "adapter_failure_rate": 0.12})
        assert "failure rate rose" in w
        assert h.check({**ok, "step": 16}) == []  # no failures: the next ones warn again, whatever their rate
        [w] = h.check({**ok, "step": 17, "adapter_failures": {"nan": 1}, "adapter_failure_rate": 0.01})
        assert "the task adapter failed 1 rollout(s)" in w
    assert len(h.warnings) == 6 and len(caplog.records) == 6


def test_a_mixture_of_mixtures_is_refused_and_still_walked_by_the_policy(tmp_path):
    from echo2sdk.runtime.protocol.messages import WorkerConfig
    from echo2sdk.runtime.trust.plugin_policy import check_plugins

    with pytest.raises(ConfigError, match=r"task.mix\[0\].adapter = 'mixture': a mixture's components are tasks"):
        load_adapter("mixture", {"mix": [{"adapter": "mixture", "options": {"mix": [{"adapter": "toy"}]}}]})
    with pytest.raises(ConfigError, match=r"task.mix\[0\].adapter = 'nosuch': unknown adapter 'nosuch'"):
        load_adapter("mixture", {"mix": [{"adapter": "nosuch"}]})
    inner = {"adapter": "mixture", "options": {"mix": [{"adapter": "gym://evil.module:Env"}]}}
    cfg = WorkerConfig.from_mapping({"adapter": "mixture", "adapter_options": {"mix": [inner]}, "backend": "mock"})
    with pytest.raises(ConfigError, match="has a ':' in its env id"):
        check_plugins(cfg)


def test_per_task_metrics_count_only_the_mixtures_own_names():
    from echo2sdk.core.buffer import OTHER_TASK, StalenessBuffer
    from echo2sdk.runtime.learner.build import mixture_names
    from echo2sdk.runtime.learner.batches import per_task

    names = mixture_names("mixture", {"mix": [{"adapter": "toy"}, {"adapter": "dataset://d/qa.jsonl", "name": "x"}]})
    assert names == ["toy", "x"] and mixture_names("math", {}) == []
    buf = StalenessBuffer(staleness=3, group_size=2, task_names=names)
    for k, name in enumerate(["toy", "forged", "x"]):
        buf.add_group([_record(name, 1.0, True, f"g{k}"), _record(name, 0.0, False, f"g{k}")], vocab_size=10, max_len=64)
    assert sorted(buf.stats()["completed_by_task"]) == [OTHER_TASK, "toy", "x"]
    batch = [_record("toy", 1.0, True), _record("forged", 0.0, False)]
    assert sorted(per_task(batch, None, names)) == [OTHER_TASK, "toy"]


def test_a_components_own_task_key_in_score_info_does_not_rename_it():
    class _Claims:
        def tasks(self, seed):
            for i in itertools.count():
                yield Task(id=str(i), messages=({"role": "user", "content": "x"},))

        def score(self, task, response):
            return Score(reward=1.0, info={"task": "someone-else"})

    adapter = load_adapter("mixture", {"mix": [{"adapter": "toy"}]})
    adapter._adapters["toy"] = _Claims()
    task = next(adapter.tasks(0))
    assert adapter.score(task, "").info == {"component_task": "someone-else"}


def test_health_names_a_mixture_component_that_stopped_teaching():
    from echo2sdk.runtime.learner.health import Health

    h = Health(steps=3)
    ok = {"reward_std": 0.3, "filter_rate": 0.5, "adapter_failures": {}}
    rows = [{"legs": {"filter_rate": 1.0, "rollout_accuracy": 0.0}, "sum": {"filter_rate": 0.4}},
            {"legs": {"filter_rate": None}, "sum": {"filter_rate": 0.5}},  # completed nothing: does not count
            {"legs": {"filter_rate": 1.0, "rollout_accuracy": 0.0}, "sum": {"filter_rate": 1.0}},
            {"legs": {"filter_rate": 1.0, "rollout_accuracy": 0.0}, "sum": {"filter_rate": 0.2}},
            {"legs": {"filter_rate": 1.0, "rollout_accuracy": 0.0}, "sum": {"filter_rate": 0.2}}]
    out = [h.check({**ok, "step": k + 1, "tasks": t}) for k, t in enumerate(rows)]
    assert out[:3] == [[], [], []] and out[4] == []  # once per streak
    [w] = out[3]
    assert w.startswith("task.mix component 'legs': every group it completed in the last 3 steps") and "0.00" in w
