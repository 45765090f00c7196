"""A failed rollout is data, not a crash: an adapter whose score raises, returns NaN or a string is counted by
reason on the worker, its group is not sent, the counts reach the learner's summary, and the run finishes."""

from __future__ import annotations

import json
import os

import pytest

from echo2sdk.core.contracts import Score
from echo2sdk.errors import AdapterError
from echo2sdk.testing import ToyAdapter, check_adapter

HERE = os.path.dirname(__file__)


class _Returns(ToyAdapter):
    def __init__(self, reward):
        super().__init__()
        self.reward = reward

    def score(self, task, response):
        return Score(reward=self.reward)


@pytest.mark.parametrize("reward, shown", [("0.1", "'0.1' is a str"), (True, "True is a bool"), (None, "None is a NoneType")])
def test_check_adapter_rejects_a_reward_that_is_not_a_number(reward, shown):
    with pytest.raises(AdapterError, match=rf"_Returns.*score: task 't0-0' \(task 1 of 100 drawn\): score\(\) gave reward = {shown}, not a real number"):
        check_adapter(_Returns(reward))


@pytest.mark.parametrize("value, reason", [(10**400, "adapter_nan"), (-(10**400), "adapter_nan"), (float("inf"), "adapter_nan"),
                                           (2**62, None), (True, "adapter_type")])
def test_a_reward_too_large_for_a_float_is_no_reward(value, reason):
    """An int beyond the float range is not finite as a reward: a RewardError (adapter_nan), not an OverflowError
    counted as adapter_error:OverflowError."""
    from echo2sdk.core.failures import RewardError, as_reward, failure_reason

    if reason is None:
        assert as_reward(value) == float(value)
        return
    with pytest.raises(RewardError) as e:
        as_reward(value)
    assert failure_reason(e.value) == reason


def test_check_adapter_takes_an_int_reward():
    assert check_adapter(_Returns(1))["episodic"] is False


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_with_a_flaky_adapter_finishes_and_counts_its_failures(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.recipe import Trainer

    monkeypatch.syspath_prepend(HERE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    cfg = load_config(None, [
        'model.policy="tiny-random"', 'task.adapter="_flaky_adapter:FlakyAdapter"', "rollout.workers=2",
        "rollout.group_size=2", "rollout.tasks_per_request=5", "rollout.max_new_tokens=6", "rollout.nice=0",
        "learner.trajectories_per_step=4", "learner.steps=3", "learner.staleness=2", "learner.lr=1e-4",
        "learner.data_timeout_s=120", "learner.filter_zero_variance=false", "run.progress=false",
        "run.heartbeat_s=0.3", f'run.out="{tmp_path}"',
    ])
    tr = Trainer(cfg)
    try:
        summary = tr.run()
        procs = list(tr.procs)
    finally:
        tr.close()
    print(json.dumps({"measure": "flaky_adapter_run_wall_s", "value": summary["wall_s"]}))
    assert summary["steps"] == 3
    saved = json.loads((tmp_path / "summary.json").read_text())["coordinator"]
    failures = saved["adapter_failures"]
    assert set(failures) == {"adapter_error:KeyError", "adapter_nan", "adapter_type"}, failures
    assert saved["groups_dropped"] >= 3 and all(n >= 1 for n in failures.values())
    log = "".join(p.read_text() for p in (tmp_path / "workers").glob("*.log"))
    assert "adapter '_flaky_adapter:FlakyAdapter' failed on task" in log and "KeyError" in log
    ends = [(p.returncode, f.read_text()[-600:]) for p, f in zip(procs, sorted((tmp_path / "workers").glob("*.log")))]
    assert len(procs) == 2 and [p.returncode for p in procs] == [0, 0], ends  # no worker died of it
