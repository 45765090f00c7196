"""adapter.stream(mode="offline_or_live"): logged episodes replay through the worker path into the same
records as live play (flagged off-policy; the learner takes w_t = 1 for them)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from echo2sdk.adapters import SandboxAdapter, write_episode_log  # noqa: E402
from echo2sdk.backends.hf import HFBackend  # noqa: E402
from echo2sdk.core.episodes import EpisodeStats, play_episodes  # noqa: E402
from echo2sdk.core.contracts import SamplingParams  # noqa: E402
from echo2sdk.core.learner import Learner  # noqa: E402
from echo2sdk.errors import AdapterError  # noqa: E402
from echo2sdk.weights import resolve_model  # noqa: E402

OPTS = {"env_options": {"is_slippery": False}, "max_turns": 2, "max_action_tokens": 6}


@pytest.fixture(scope="module")
def tiny():
    return resolve_model("tiny-random")


def test_logged_episodes_replay_into_the_same_records(tiny, tmp_path):
    live = SandboxAdapter(env="gym://FrozenLake-v1", **OPTS)
    with HFBackend(tiny) as backend:
        played = play_episodes(backend, live, [next(live.tasks(0))], 2, SamplingParams(max_new_tokens=6, seed=0), version=0)
        log = tmp_path / "episodes.jsonl"
        assert write_episode_log([r for g in played for r in g], log) == 2
        stream = SandboxAdapter(env="gym://FrozenLake-v1", logs=[str(log)], offline_group_size=2, **OPTS).stream(mode="offline_or_live")
        tasks = list(zip(range(2), stream))
        assert "offline" in tasks[0][1].info and "seed" in tasks[1][1].info  # the log first, then live play
        stats = EpisodeStats()
        (replayed,) = play_episodes(backend, stream.adapter, [tasks[0][1]], 2, SamplingParams(max_new_tokens=6), version=3, stats=stats)
    assert stats.failed == 0
    for old, new in zip(played[0], replayed):
        kept = [m for m in old.prompt]
        while kept[-1].role == "user":
            kept.pop()
        assert new.prompt == tuple(kept) and new.reward == old.reward and new.version == 3
        assert new.meta.off_policy and new.meta.prompt_ids == old.meta.prompt_ids
        assert sum(new.meta.loss_mask) > 0
    learner = Learner(tiny, lr=1e-4, precision="fp32")
    st = learner.step([replayed])
    assert st.is_weight_mean == pytest.approx(1.0)  # pi_sampler := pi_old for logged responses


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "invalid JSON"),
        (json.dumps({"reward": 1}), "field 'messages'"),
        (json.dumps({"messages": [{"role": "user", "content": "s"}], "reward": 1}), "must be \\[system\\], user, assistant"),
        (json.dumps({"messages": [{"role": "user", "content": "s"}, {"role": "assistant", "content": "a"}]}), "missing field 'reward'"),
        (json.dumps({"messages": [{"role": "user", "content": "s"}, {"role": "assistant", "content": "a"}], "reward": "x"}), "field 'reward' = 'x'"),
    ],
)
def test_bad_log_lines_name_file_line_and_field(tmp_path, line, message):
    log = tmp_path / "bad.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "s"}, {"role": "assistant", "content": "a"}], "reward": 0}) + "\n" + line + "\n")
    adapter = SandboxAdapter(env="gym://FrozenLake-v1", mode="offline", logs=[str(log)])
    with pytest.raises(AdapterError, match=f"bad.jsonl:2: .*{message}"):
        next(adapter.tasks(0))
