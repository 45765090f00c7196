"""echo2-moba: the game's rules, PettingZoo's own API test for every variant, determinism, the sandbox
through SandboxAdapter (conformance, one turn per controlled hero, fallbacks), the serializer/parser round
trip, the bot ladder, and bad input."""

from __future__ import annotations

import random
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("echo2_moba")
np = pytest.importorskip("numpy")
pytest.importorskip("pettingzoo")

import echo2_moba  # noqa: E402
from echo2_moba import BOTS, VARIANTS, Game, MobaActionRenderer, action_names, match, parallel_env, summarize  # noqa: E402
from echo2_moba.sandbox import continued  # noqa: E402

from echo2sdk.adapters import SandboxAdapter  # noqa: E402
from echo2sdk.adapters.registry import load_env_plugin  # noqa: E402
from echo2sdk.errors import ConfigError, NameNotFound  # noqa: E402
from echo2sdk.testing import MockBackend, check_adapter  # noqa: E402

ENVS = tuple(VARIANTS)


def _adapter(env="moba://lane_1v1_v1", max_turns=24, **env_options):
    return SandboxAdapter(env=env, env_options=env_options or None, max_turns=max_turns)


def _random_episode(adapter, seed, rng, task_seed=0):
    """Play one episode with random legal replies (by name or number); return (episode, steps)."""
    ep = adapter.start(next(adapter.tasks(task_seed + seed)), 0)
    steps = []
    while not ep.done and len(steps) < adapter.max_turns:
        i = rng.randrange(len(ep.obs.legal))
        reply = f"<answer>{ep.obs.legal[i]}</answer>" if rng.random() < 0.5 else f"<answer>{i + 1}</answer>"
        steps.append(ep.step(reply))
    return ep, steps


# -- PettingZoo -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ENVS)
def test_pettingzoo_parallel_api_test_passes(variant, capsys):
    from pettingzoo.test import parallel_api_test, parallel_seed_test

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(parallel_env(variant), num_cycles=1000)
        parallel_seed_test(lambda: parallel_env(variant))
    assert "Passed Parallel API test" in capsys.readouterr().out
    assert [str(w.message) for w in caught] == []


def _rollout(variant, seed, steps=120):
    """A seeded env driven by seeded random legal actions: the trajectory as plain values."""
    env = parallel_env(variant)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        if not env.agents:
            break
        actions = {a: int(rng.choice(np.flatnonzero(obs[a]["action_mask"]))) for a in env.agents}
        obs, rew, term, trunc, _ = env.step(actions)
        out.append((actions, {a: o["observation"].tobytes() for a, o in obs.items()}, rew, term, trunc))
    return out


@pytest.mark.parametrize("variant", ENVS)
def test_same_seed_and_actions_give_the_same_trajectory(variant):
    a, b = _rollout(variant, 7), _rollout(variant, 7)
    assert a == b and len(a) > 50
    assert _rollout(variant, 8) != a


def test_observations_are_own_perspective_and_rewards_zero_sum():
    env = parallel_env("3v3_v1")
    obs, infos = env.reset(seed=3)
    for i in range(3):  # a symmetric start: each red hero sees what its blue twin sees
        assert np.array_equal(obs[f"blue_{i}"]["observation"], obs[f"red_{i}"]["observation"])
        assert np.array_equal(infos[f"blue_{i}"]["action_mask"], obs[f"blue_{i}"]["action_mask"])
    space = env.observation_space("blue_0")
    while env.agents:
        obs, rew, term, trunc, _ = env.step({})  # every hero holds
        assert all(space.contains(o) for o in obs.values())
        assert sum(rew.values()) == pytest.approx(0.0)
    assert all(trunc.values()) or all(term.values())


def test_a_masked_out_action_is_played_as_hold_and_flagged():
    env = parallel_env("lane_1v1_v1")
    obs, _ = env.reset(seed=0)
    tower = env.actions.index("attack_tower")
    assert obs["blue_0"]["action_mask"][tower] == 0
    before = env.game.heroes[0].pos
    _, _, _, _, infos = env.step({"blue_0": tower, "red_0": 0})
    assert infos["blue_0"]["illegal"] and not infos["red_0"]["illegal"]
    assert env.game.heroes[0].pos == before


# -- rules ------------------------------------------------------------------------------------------


def test_structures_fall_in_order_and_a_fallen_base_ends_the_game():
    g = Game("lane_1v1_v1", seed=1)
    outer, inner = g.towers[1][0]
    base = g.bases[1]
    assert g.vulnerable(outer) and not g.vulnerable(inner) and not g.vulnerable(base)
    outer.hp = 0
    assert g.vulnerable(inner) and not g.vulnerable(base)
    inner.hp = 0
    assert g.vulnerable(base)
    base.hp = 1
    g.heroes[0].pos = base.pos - 1
    g.step([g.actions.index("attack_tower"), 0])
    assert g.over and not g.truncated and g.winner == 0
    assert g.result(0) == 1 and g.result(1) == -1


def test_step_limit_tie_break_by_base_then_tower_hp():
    g = Game("lane_1v1_v1", seed=2, max_ticks=3)
    for _ in range(3):
        g.step([0, 0])
    assert g.over and g.truncated and g.winner is None  # nothing was damaged: a draw
    g = Game("lane_1v1_v1", seed=2, max_ticks=3)
    g.towers[0][0][0].hp -= 1
    g.finish()
    assert g.winner == 1
    g = Game("lane_1v1_v1", seed=2, max_ticks=3)
    g.towers[1][0][0].hp = 0
    g.bases[0].hp -= 1  # base HP counts before tower HP
    g.finish()
    assert g.winner == 1


@pytest.mark.parametrize("variant", ENVS)
def test_the_rules_favour_no_side(variant, monkeypatch):
    from echo2_moba import play_game, rules

    monkeypatch.setattr(rules, "DAMAGE_SPREAD", 0.0)  # no rolls: a mirror match must be an exact draw
    for bot in ("pusher", "focus_fire"):
        g = play_game(variant, bot, bot, seed=1)
        assert g["winner"] is None and g["truncated"]
        for key in ("kills", "deaths", "gold", "xp", "last_hits", "towers_destroyed"):
            assert g["blue"][key] == g["red"][key], (bot, key)


def test_shaping_adds_up_to_shaping_times_the_final_potential():
    env = parallel_env("lane_1v1_v1", shaping=0.5, max_ticks=80)
    env.reset(seed=4)
    rng, total = random.Random(4), 0.0
    while env.agents:
        legal = {a: [i for i, ok in enumerate(env.game.legal(k)) if ok] for k, a in enumerate(env.possible_agents)}
        _, rew, *_ = env.step({a: rng.choice(ix) for a, ix in legal.items()})
        total += rew["blue_0"]
    g = env.game
    assert total == pytest.approx(g.result(0) + 0.5 * g.potential(0))
    assert abs(g.potential(0)) <= 1.0


def test_every_action_name_round_trips_through_the_parser():
    r = MobaActionRenderer()
    for variant in VARIANTS.values():
        names = action_names(variant)
        assert len(set(names)) == len(names)
        for i, name in enumerate(names, 1):
            spoken = name.upper().replace("_", " ")
            for text in (f"<answer>{name}</answer>", name, f"<answer>{i}</answer>", f"{i}. {name}", f"<answer>{spoken}</answer>"):
                got = r.parse(text, names)
                assert (got.status, got.action) == ("ok", name), text


# -- the sandbox through SandboxAdapter -------------------------------------------------------------


def test_prompt_shows_the_numbered_legal_actions_and_replies_round_trip():
    adapter = _adapter("moba://3v3_v1", control=2)
    rng = random.Random(0)
    for seed in range(3):
        ep = adapter.start(next(adapter.tasks(seed)), 0)
        text = ep.messages[-1]["content"]
        for _ in range(12):
            numbered = [line for line in text.splitlines() if line[:1].isdigit()]
            assert numbered == [f"{i}. {a}" for i, a in enumerate(ep.obs.legal, 1)]
            for i, a in enumerate(ep.obs.legal, 1):
                for reply in (f"<answer>{a}</answer>", f"<answer>{i}</answer>", f"{i}. {a}"):
                    assert adapter.renderer.parse(reply, ep.obs.legal).action == a
            st = ep.step(f"<answer>{rng.choice(ep.obs.legal)}</answer>")
            if st.done:
                break
            text = st.observation
        assert ep.result().info["fallbacks"] == 0


def test_check_adapter_passes():
    report = check_adapter(SandboxAdapter(env="moba://lane_1v1_v1"))
    assert report["episodic"] and all(t >= 1 for t in report["turns"])
    with_backend = check_adapter(SandboxAdapter(env="moba://lane_1v1_v1"), backend=MockBackend(), n=2, groups=2)
    assert with_backend["records"] == 4 and with_backend["failed"] == 0


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("torch")
    from echo2sdk.weights import resolve_model

    return resolve_model("tiny-random")


def test_moba_conformance_with_a_real_model(tiny):
    from echo2sdk.backends.hf import HFBackend

    with HFBackend(tiny) as backend:
        adapter = SandboxAdapter(env="moba://lane_1v1_v1", max_action_tokens=6)
        report = check_adapter(adapter, backend=backend, n=2, groups=2, max_len=1024)  # the tiny model's positions
    assert report["records"] == 4 and report["failed"] == 0


def test_one_turn_per_controlled_hero_per_decision_step():
    adapter = _adapter("moba://5v5_v1", control=3, decision_ticks=2)
    ep = adapter.start(next(adapter.tasks(0)), 0)
    game = ep.sandbox.game
    seen = []
    for _ in range(9):
        seen.append((game.tick, ep.obs.state["you"]["name"]))
        st = ep.step("<answer>hold</answer>")
        if st.done:
            break
    assert seen[:6] == [(0, "A0"), (0, "A1"), (0, "A2"), (2, "A0"), (2, "A1"), (2, "A2")]
    assert ep.rewards[0] == ep.rewards[1] == 0.0  # the team's reward arrives with the step's last turn


def test_the_same_seed_and_replies_replay_the_same_episode():
    adapter = _adapter(opponent="focus_fire", team=1)
    runs = []
    for _ in range(2):
        ep, steps = _random_episode(adapter, 5, random.Random(1))
        runs.append((ep.messages, [s.observation for s in steps], ep.rewards, ep.result().info))
    assert runs[0] == runs[1]
    assert runs[0][3]["team"] == "red"
    task = next(adapter.tasks(9))
    assert adapter.start(task, 0).messages == adapter.start(task, 1).messages  # a group replays one seed


def test_episode_return_is_outcome_plus_shaping_and_summary_feeds_summarize():
    adapter = _adapter(max_turns=200, decision_ticks=10, max_ticks=120)
    rng = random.Random(2)
    extras = []
    for seed in range(4):
        ep, _ = _random_episode(adapter, seed, rng)
        info = ep.result().info
        assert ep.done and info["finished"] and info["ticks"] <= 120
        game = ep.sandbox.game
        assert sum(ep.rewards) == pytest.approx(info["result"] + 0.2 * game.potential(0))
        extras.append(info)
    stats = summarize(extras)
    assert stats["games"] == 4 and stats["wins"] + stats["draws"] + stats["losses"] == 4
    assert stats["gold_diff"] == pytest.approx(sum(e["gold_diff"] for e in extras) / 4)


def test_malformed_replies_hold_with_a_penalty_and_are_counted():
    adapter = _adapter()
    ep = adapter.start(next(adapter.tasks(0)), 0)
    for reply in ("I am not sure", "<answer>dance</answer>", "<answer>99</answer>", f"<answer>2. {ep.obs.legal[0]}</answer>"):
        st = ep.step(reply)
        assert st.info["action"] == "hold" and st.info["status"] in ("unparsable", "illegal")
    res = ep.result()
    assert (res.info["unparsable"], res.info["illegal"], res.info["fallbacks"]) == (1, 3, 4)
    assert res.reward == pytest.approx(res.info["team_return"] - 4 * 0.1)


def test_an_aborted_episode_is_decided_by_the_tie_break():
    adapter = _adapter(opponent="pusher")
    ep = adapter.start(next(adapter.tasks(3)), 0)
    for _ in range(10):
        ep.step("<answer>hold</answer>")
    ep.abort("turn_limit")
    game = ep.sandbox.game
    assert game.over and ep.result().info["result"] == game.result(0)


def test_continued_actions():
    assert continued("strike_e1") == "attack_e1" and continued("ult_e0") == "attack_e0"
    assert continued("nova") == continued("buy_orb") == continued("lane_top") == "hold"
    assert continued("advance") == "advance"


# -- bots -------------------------------------------------------------------------------------------


def test_bot_ladder_focus_fire_beats_passive_and_pusher():
    # the full 200-game ladder for every variant is bench/moba.py
    strong = match("lane_1v1_v1", "focus_fire", "passive", games=40, seed=0)
    assert strong["win_rate"] >= 0.8 and strong["gold_diff"] > 0 and strong["xp_diff"] > 0
    assert match("lane_1v1_v1", "focus_fire", "pusher", games=20, seed=100)["win_rate"] >= 0.8
    assert match("lane_1v1_v1", "pusher", "passive", games=20, seed=200)["win_rate"] >= 0.8
    assert match("3v3_v1", "focus_fire", "passive", games=6, seed=0)["win_rate"] >= 0.8


def test_passive_bot_never_attacks():
    env = parallel_env("lane_1v1_v1")
    env.reset(seed=0)
    from echo2_moba.evaluation import bot_actions

    bots = {0: echo2_moba.make_bot("pusher"), 1: echo2_moba.make_bot("passive")}
    rng = random.Random(0)
    while env.agents:
        chosen = bot_actions(env.game, bots, rng)
        assert env.actions[chosen[1]] in ("hold", "advance", "retreat")
        env.step({"blue_0": chosen[0], "red_0": chosen[1]})
    assert env.game.heroes[1].last_hits == 0


def test_echo2_eval_plays_moba_against_the_bots():
    from echo2sdk.adapters.evaluate import evaluate

    table = evaluate("moba://lane_1v1_v1", {"mock": "mock"}, opponents=BOTS, hands=2, backend="mock", metric="result", batch=2)
    assert set(table["mock"]) == set(BOTS)
    assert all(set(c.values) <= {-1.0, 0.0, 1.0} and c.fallback_rate == 1.0 for c in table["mock"].values())


# -- names, errors, the package ---------------------------------------------------------------------


def test_bad_input_is_named():
    with pytest.raises(NameNotFound, match=r"unknown moba env 'lane_1v1_v2'.*Did you mean 'lane_1v1_v1'"):
        SandboxAdapter(env="moba://lane_1v1_v2")
    with pytest.raises(NameNotFound, match=r"unknown moba variant '5v5'.*Did you mean '5v5_v1'"):
        parallel_env("5v5")
    with pytest.raises(NameNotFound, match=r"unknown moba bot .*'focus_fir'.*Did you mean 'focus_fire'"):
        _adapter(opponent="focus_fir")
    with pytest.raises(ConfigError, match=r"opponent lists 2 bots for 3 enemy heroes"):
        _adapter("moba://3v3_v1", opponent=["passive", "pusher"])
    with pytest.raises(ConfigError, match=r"env_options.control must be an integer in \[1, 1\]"):
        _adapter(control=2)
    with pytest.raises(ConfigError, match=r"unknown key 'opponents'"):
        _adapter(opponents="passive")
    with pytest.raises(ConfigError, match=r"env_options.team must be an integer in \[0, 1\]"):
        _adapter(team=2)


def test_plugin_is_registered_and_its_renderer_is_used():
    plugin = load_env_plugin("moba")
    assert isinstance(plugin, echo2_moba.MobaPlugin) and set(plugin.env_ids()) == set(ENVS)
    adapter = _adapter()
    assert isinstance(adapter.renderer, MobaActionRenderer)  # the plug-in's `action->text_v1` (numbers too)
    assert adapter.serializer_name == "moba_obs->prompt_v2" and adapter.penalty == 0.1
    assert plugin.eval_opponents == BOTS


def test_import_is_cheap_and_exports_are_real():
    code = "import sys, echo2_moba; print(sorted(m for m in ('numpy', 'gymnasium', 'pettingzoo', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    for name in echo2_moba.__all__:
        assert getattr(echo2_moba, name) is not None


def test_the_example_config_loads_and_its_adapter_passes_check_adapter():
    from pathlib import Path

    from echo2sdk.config import load_config
    from echo2sdk.plugins import load_adapter

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "moba.toml")
    assert cfg.task.adapter == "moba://lane_1v1_v1" and cfg.learner.max_len == 4096
    adapter = load_adapter(cfg.task.adapter, cfg.task.options)
    assert adapter.env_options["opponent"] == "passive"
    check_adapter(adapter, backend=MockBackend(), n=2, groups=1)
