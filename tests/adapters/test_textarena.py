"""The textarena:// bridge on real TextArena games, offline: prompts in the game's words, moves in brackets,
seeded opponents, rewards, fallbacks, the conformance suite with the mock backend, and clear errors."""

from __future__ import annotations

import random
import re
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("textarena")

from echo2sdk.adapters import SandboxAdapter  # noqa: E402
from echo2sdk.errors import ConfigError, DependencyNotInstalled, NameNotFound  # noqa: E402
from echo2sdk.testing import MockBackend, check_adapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _adapter(game: str, **kwargs) -> SandboxAdapter:
    return SandboxAdapter(env=f"textarena://{game}", **kwargs)


def _binary_search(ep, lo: int = 1, hi: int = 20) -> list:
    steps = []
    while True:
        guess = (lo + hi) // 2
        st = ep.step(f"My guess is [{guess}].")
        steps.append(st)
        if st.done:
            return steps
        if "higher" in st.observation:
            lo = guess + 1
        else:
            assert "lower" in st.observation
            hi = guess - 1


def test_guess_the_number_is_played_from_the_game_s_words_and_seeded():
    adapter = _adapter("GuessTheNumber-v0")
    task = next(adapter.tasks(0))
    outer = random.getstate()
    ep = adapter.start(task, 0)
    first = ep.messages[1]["content"]
    assert "You are playing Guess The Number." in first and "between 1 and 20 within 10 turns" in first
    assert ep.messages[0]["role"] == "system" and "GuessTheNumber-v0" in ep.messages[0]["content"]
    steps = _binary_search(ep)
    assert steps[-1].reward == 1.0 and all(s.reward == 0.0 for s in steps[:-1]) and len(steps) <= 5
    result = ep.result()
    assert result.reward == 1.0 and result.correct is True and result.info["fallbacks"] == 0
    assert "guessed the correct number" in result.info["outcome"]
    ep.close()
    again = adapter.start(task, 1)  # the n episodes of a group replay the same seeded game
    assert [s.observation for s in _binary_search(again)] == [s.observation for s in steps]
    again.close()
    assert random.getstate() == outer  # the game drew from its own copy of the global random state


def test_tictactoe_first_move_opponent_loses_to_a_diagonal():
    adapter = _adapter("TicTacToe-v0", env_options={"opponent": "first"})
    ep = adapter.start(next(adapter.tasks(0)), 0)
    first = ep.messages[1]["content"]
    assert "You are Player 0 in Tic Tac Toe." in first and "Available Moves: '[0]', '[1]'" in first
    # the opponent always takes the lowest free cell: we 4, it 0, we 2, it 1, we 6 (diagonal 2-4-6)
    s1 = ep.step("[4]")
    assert "Player 1 placed their symbol (X) in cell 0." in s1.observation and "[Player 1]" not in s1.observation
    assert s1.observation.rstrip().endswith("Reply with exactly one legal move in square brackets, as the game asks.")
    s2 = ep.step("A corner: <answer>2</answer>")
    assert "Player 1 placed their symbol (X) in cell 1." in s2.observation
    s3 = ep.step("6")
    assert s3.done and s3.reward == 1.0 and [s.info["status"] for s in (s1, s2, s3)] == ["ok"] * 3
    result = ep.result()
    assert result.correct is True and result.info["outcome"] == "Player 0 has won!"
    ep.close()


def test_connect_four_reads_col_moves_and_falls_back_on_illegal_ones():
    adapter = _adapter("ConnectFour-v0")
    ep = adapter.start(next(adapter.tasks(0)), 0)
    assert "Legal moves: [col 0], [col 1], [col 2], [col 3], [col 4], [col 5], [col 6]." in ep.messages[1]["content"]
    ok = ep.step("I drop it in [col 3]")
    assert ok.info == {"action": "[col 3]", "status": "ok", "answer": "col 3"} and ok.reward == 0.0
    same = ep.step("[3]")  # TextArena reads [3] as column 3 too
    assert same.info["action"] == "[col 3]" and same.info["status"] == "ok"
    bad = ep.step("[9]")  # no column 9: the first legal move, and the penalty
    assert bad.info["status"] == "illegal" and bad.info["action"] == "[col 0]" and bad.reward == pytest.approx(-0.1)
    none = ep.step("I am not sure.")
    assert none.info["status"] == "unparsable" and none.reward == pytest.approx(-0.1)
    assert ep.result().info["illegal"] == 1 and ep.result().info["unparsable"] == 1
    ep.close()


def test_nim_second_seat_sees_the_seeded_opponent_move_first():
    adapter = _adapter("Nim-v0", env_options={"seat": 1, "opponent": "random"})
    task = next(adapter.tasks(5))
    a, b = adapter.start(task, 0), adapter.start(task, 1)
    assert a.messages == b.messages
    text = a.messages[1]["content"]
    assert "Welcome to Nim, Player 1!" in text and re.search(r"Player 0 removes \d+ from pile \d\.", text)
    assert "Legal moves: [0 1]" in text
    rng = random.Random(0)
    while not (st := a.step(rng.choice(a.obs.legal))).done:
        pass
    assert st.reward in (1.0, -1.0) and a.result().info["won"] is (st.reward == 1.0)
    a.close()
    b.close()


@pytest.mark.parametrize("game", ["GuessTheNumber-v0", "TicTacToe-v0", "ConnectFour-v0", "Nim-v0"])
def test_conformance_with_the_mock_backend(game):
    report = check_adapter(_adapter(game, max_turns=12), backend=MockBackend())
    assert report["episodic"] and report["records"] == 4 and report["failed"] == 0
    assert all(r == r and -3.0 <= r <= 1.0 for r in report["rewards"])


def test_url_loads_the_sandbox_adapter_and_the_example_config_switches_one_line(example_diff):
    from echo2sdk.config import load_config
    from echo2sdk.plugins import load_adapter

    adapter = load_adapter("textarena://TicTacToe-v0", {"env_options": {"opponent": "first"}})
    assert isinstance(adapter, SandboxAdapter) and adapter.env == "textarena://TicTacToe-v0"
    assert example_diff("textarena") == ["adapter", "options", "tasks_per_request", "temperature", "steps", "lr"]
    assert tomllib.loads((ROOT / "examples/textarena.toml").read_text())["task"]["adapter"] == "textarena://TicTacToe-v0"
    cfg = load_config(ROOT / "examples/textarena.toml")
    check_adapter(load_adapter(cfg.task.adapter, cfg.task.options))


def test_errors_name_the_field_and_the_value(monkeypatch):
    with pytest.raises(NameNotFound, match=r"unknown textarena game 'TicTacToe-v1'.*Did you mean 'TicTacToe-v0'"):
        _adapter("TicTacToe-v1")
    with pytest.raises(ConfigError, match=r"'textarena://Wordle-v0' needs the network \(downloads NLTK corpora"):
        _adapter("Wordle-v0")
    with pytest.raises(ConfigError, match=r"'textarena://Debate-v0' needs the network \(its judge is an LLM jury"):
        _adapter("Debate-v0")
    with pytest.raises(ConfigError, match=r"'textarena://Chess-v0' is a TextArena game the bridge has no legal-move table"):
        _adapter("Chess-v0")
    with pytest.raises(ConfigError, match=r"env_options.seat must be .*got .*seat=2"):
        _adapter("TicTacToe-v0", env_options={"seat": 2})
    with pytest.raises(ConfigError, match=r"env_options.opponent = 'smart' must be one of"):
        _adapter("TicTacToe-v0", env_options={"opponent": "smart"})
    with pytest.raises(ConfigError, match=r"env_options.opponent = 'random': GuessTheNumber-v0 is a one-player game"):
        _adapter("GuessTheNumber-v0", env_options={"opponent": "random"})
    with pytest.raises(ConfigError, match=r"env_options = \{'board_size': 4\} do not fit GuessTheNumberEnv"):
        _adapter("GuessTheNumber-v0", env_options={"board_size": 4})
    small = _adapter("GuessTheNumber-v0", env_options={"max_number": 8})  # other options go to the game
    ep = small.start(next(small.tasks(0)), 0)
    assert "between 1 and 8" in ep.messages[1]["content"] and ep.obs.legal[-1] == "[8]"
    ep.close()
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(DependencyNotInstalled, match=r'textarena is not installed: run  pip install "echo2sdk\[bridges\]"'):
        _adapter("TicTacToe-v0")
