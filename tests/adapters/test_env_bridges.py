"""The gymnasium and pettingzoo bridges on real envs, and the conformance suite on them."""

from __future__ import annotations

import pytest

pytest.importorskip("gymnasium")

from echo2sdk.adapters import SandboxAdapter  # noqa: E402
from echo2sdk.testing import check_adapter  # noqa: E402


def _play(adapter, actions, seed_task=0):
    ep = adapter.start(next(adapter.tasks(seed_task)), 0)
    steps = []
    for a in actions:
        st = ep.step(f"<answer>{a}</answer>")
        steps.append(st)
        if st.done:
            break
    return ep, steps


def test_frozenlake_goal_reached_by_named_actions():
    adapter = SandboxAdapter(env="gym://FrozenLake-v1", env_options={"is_slippery": False}, max_turns=10)
    ep, steps = _play(adapter, ["down", "down", "right", "right", "down", "right"])
    first = ep.messages[1]["content"]
    assert "SFFF\nFHFH" in first and "position: row 0, column 0" in first and "\x1b[" not in first
    assert "Legal actions: left, down, right, up." in first
    assert steps[-1].done and steps[-1].reward == 1.0 and all(s.info["status"] == "ok" for s in steps)
    assert "row 1, column 0" in steps[0].observation
    res = ep.result()
    assert res.reward == 1.0 and res.correct is True and res.info["fallbacks"] == 0


def test_falling_in_a_hole_ends_with_zero_and_taxi_blackjack_render_as_text():
    adapter = SandboxAdapter(env="gym://FrozenLake-v1", env_options={"is_slippery": False})
    _, steps = _play(adapter, ["right", "down"])  # (1, 1) is a hole
    assert steps[-1].done and steps[-1].reward == 0.0
    taxi = SandboxAdapter(env="gym://Taxi-v4").start(next(SandboxAdapter(env="gym://Taxi-v4").tasks(0)), 0)
    assert "passenger:" in taxi.messages[1]["content"] and "pickup" in taxi.messages[1]["content"]
    bj = SandboxAdapter(env="gym://Blackjack-v1")
    ep = bj.start(next(bj.tasks(0)), 0)
    assert "your_sum:" in ep.messages[1]["content"] and "stick, hit" in ep.messages[1]["content"]


def test_same_seed_same_initial_state():
    adapter = SandboxAdapter(env="gym://Blackjack-v1")
    task = next(adapter.tasks(3))
    assert adapter.start(task, 0).messages == adapter.start(task, 1).messages


def test_gym_conformance():
    report = check_adapter(SandboxAdapter(env="gym://FrozenLake-v1", max_turns=4))
    assert report["episodic"] and max(report["turns"]) <= 4


def test_tictactoe_board_legal_moves_and_win():
    pytest.importorskip("pettingzoo")
    adapter = SandboxAdapter(env="pettingzoo://tictactoe_v3", env_options={"opponent": "first"})
    # we are X (first seat); the opponent always takes the lowest free cell
    ep, steps = _play(adapter, ["4", "8", "2", "6"])
    assert ". . .\n. . .\n. . ." in ep.messages[1]["content"]
    assert steps[0].observation.count("X") >= 2 and "O" in steps[0].observation  # our X and its O
    assert "Legal actions: 1, 2, 3, 5, 6, 7, 8." in steps[0].observation  # cells 0 (O) and 4 (X) taken
    assert steps[-1].done and steps[-1].reward == 1.0 and ep.result().correct is True


def test_pettingzoo_conformance_and_unknown_module():
    pytest.importorskip("pettingzoo")
    from echo2sdk.errors import NameNotFound

    check_adapter(SandboxAdapter(env="pettingzoo://tictactoe_v3"))
    with pytest.raises(NameNotFound, match=r"unknown pettingzoo env 'tictactoe_v2'.*Did you mean 'tictactoe_v3'"):
        SandboxAdapter(env="pettingzoo://tictactoe_v2")


@pytest.mark.parametrize("env", ["utils.conversions", "classic.tictactoe_v3.tictactoe", "../x_v1", "test.api_test"])
def test_pettingzoo_names_only_environment_modules(env, monkeypatch):
    """The env name can come over the wire (a welcome): nothing but <family>.<env>_v<N> is imported."""
    import importlib

    from echo2sdk.errors import ConfigError

    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    with pytest.raises(ConfigError, match=r"expected an (environment module|env URL)"):
        SandboxAdapter(env=f"pettingzoo://{env}")
    assert not [m for m in imported if m.startswith("pettingzoo")]
