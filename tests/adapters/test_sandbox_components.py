"""SandboxAdapter components and names: the action renderer, reward and metadata specs, env URLs,
plug-in lookup with suggestions. No model needed."""

from __future__ import annotations

import pytest

from echo2sdk.adapters import SandboxAdapter
from echo2sdk.adapters.components import AnswerTagRenderer, episodic_return, per_step_mean
from echo2sdk.adapters.registry import load_env_plugin, parse_env, resolve_component
from echo2sdk.errors import AdapterError, ConfigError, NameNotFound
from echo2sdk.plugins import load_adapter

LEGAL = ("fold", "call", "raise_half_pot", "all_in")


@pytest.mark.parametrize(
    "text, action, status",
    [
        ("<answer>call</answer>", "call", "ok"),
        ("I think so. <answer> Raise half pot </answer>", "raise_half_pot", "ok"),
        ("<answer>fold</answer> no wait <answer>ALL-IN</answer>", "all_in", "ok"),  # the last answer counts
        ("call", "call", "ok"),  # a bare action name
        ("<answer>call", "call", "ok"),  # cut off by the token limit
        ("<answer>check</answer>", None, "illegal"),  # a real action, but not legal here
        ("<answer>banana</answer>", None, "illegal"),
        ("<answer></answer>", None, "unparsable"),
        ("", None, "unparsable"),
        ("I would probably call here", None, "unparsable"),
    ],
)
def test_answer_tag_renderer_parses_or_classifies(text, action, status):
    parsed = AnswerTagRenderer().parse(text, LEGAL)
    assert (parsed.action, parsed.status) == (action, status)


def test_renderer_never_raises_on_odd_input():
    r = AnswerTagRenderer()
    assert r.parse(None, LEGAL).status == "unparsable"  # type: ignore[arg-type]
    assert r.parse("<answer>" * 10000, LEGAL).status in ("illegal", "unparsable")
    text = r.instructions(LEGAL)
    assert "<answer>ACTION</answer>" in text
    assert not any(a in text for a in LEGAL), "the format line must not suggest one particular action"


def test_reward_specs():
    assert episodic_return([0.0, -2.0, 5.0]) == 3.0  # R_i = sum_t r_it
    assert per_step_mean([0.0, -2.0, 5.0]) == pytest.approx(1.0)
    assert per_step_mean([]) == 0.0


def test_metadata_specs_pick_grouping():
    assert resolve_component("metadata_spec", "grpo:turn_mask+adv_norm").grouping == "state"
    assert resolve_component("metadata_spec", "grpo:turn_mask+adv_norm@batch").grouping == "batch"
    with pytest.raises(NameNotFound, match=r"unknown metadata spec 'grpo:turn_mask\+adv_nrm'.*Did you mean"):
        resolve_component("metadata_spec", "grpo:turn_mask+adv_nrm")


@pytest.mark.parametrize("url", ["poker", "poker:/x", "://x", "Poker://x y", 3, None])
def test_bad_env_url_names_field_and_value(url):
    with pytest.raises(ConfigError, match=r"env = .*expected an env URL 'scheme://id'"):
        parse_env(url)


def test_unknown_scheme_suggests_close_names():
    with pytest.raises(NameNotFound, match=r"unknown env scheme 'pokr'.*Did you mean 'poker'"):
        load_env_plugin("pokr")


def test_moba_scheme_comes_from_the_echo2_moba_package():
    pytest.importorskip("echo2_moba")
    with pytest.raises(NameNotFound, match=r"unknown moba env 'hok_v2'.*Registered: 3v3_v1, 5v5_v1, lane_1v1_v1"):
        SandboxAdapter(env="moba://hok_v2")


def test_unknown_components_and_env_ids_suggest():
    with pytest.raises(NameNotFound, match=r"unknown gymnasium env 'FrozenLak-v1'.*Did you mean 'FrozenLake-v1'"):
        SandboxAdapter(env="gym://FrozenLak-v1")
    with pytest.raises(NameNotFound, match=r"unknown serializer 'state->text_v2'.*Did you mean 'state->text_v1'"):
        SandboxAdapter(env="gym://FrozenLake-v1", serializer="state->text_v2")
    with pytest.raises(NameNotFound, match=r"unknown reward spec 'episodic_retrun'.*Did you mean 'episodic_return'"):
        SandboxAdapter(env="gym://FrozenLake-v1", reward_spec="episodic_retrun")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_turns": 0}, "max_turns=0"),
        ({"penalty": -1.0}, "penalty=-1.0"),
        ({"mode": "replay"}, "mode = 'replay'"),
        ({"mode": "offline"}, "mode = 'offline' needs logs"),
        ({"env_options": {"is_slipery": False}}, "env_options = {'is_slipery': False} rejected"),
    ],
)
def test_bad_options_name_field_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("{", r"\{").replace("}", r"\}")):
        SandboxAdapter(env="gym://FrozenLake-v1", **kwargs)


def test_env_url_as_adapter_name_and_spec_round_trip():
    a = load_adapter("gym://FrozenLake-v1", {"env_options": {"is_slippery": False}, "max_turns": 5})
    assert isinstance(a, SandboxAdapter) and a.env == "gym://FrozenLake-v1" and a.max_turns == 5
    name, options = a.spec()
    assert name == "sandbox" and load_adapter(name, options) == a
    with pytest.raises(AdapterError, match="contradicts the adapter URL"):
        load_adapter("gym://FrozenLake-v1", {"env": "gym://Taxi-v4"})


def test_stream_carries_mode_and_rebuilds():
    s = SandboxAdapter(env="gym://FrozenLake-v1").stream(mode="offline_or_live")
    name, options = s.spec()
    assert options["mode"] == "offline_or_live" and load_adapter(name, options).mode == "offline_or_live"
    tasks = [t for _, t in zip(range(3), s)]
    assert len({t.id for t in tasks}) == 3 and all("seed" in t.info for t in tasks)


def test_grouping_by_state_shares_a_seed_and_by_batch_does_not():
    by_state = SandboxAdapter(env="gym://FrozenLake-v1")
    by_batch = SandboxAdapter(env="gym://FrozenLake-v1", metadata_spec="grpo:turn_mask+adv_norm@batch")
    task = next(by_state.tasks(0))
    assert {by_state.episode_seed(task, i) for i in range(4)} == {task.info["seed"]}
    assert len({by_batch.episode_seed(task, i) for i in range(4)}) == 4
