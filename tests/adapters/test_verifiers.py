"""The verifiers:// bridge on two verifiers environments that run offline (tests/adapters/verifiers_envs/:
a SingleTurnEnv and a MultiTurnEnv, loaded by `verifiers.load_environment` from sys.path as installed
packages would be): tasks from the env's dataset, the rubric as the reward, env_response turn by turn,
the conformance suite with the mock backend, and clear errors."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("datasets")

from echo2sdk.adapters import verifiers as bridge  # noqa: E402
from echo2sdk.adapters.verifiers import VerifiersEpisodicAdapter, VerifiersTaskAdapter, verifiers_adapter  # noqa: E402
from echo2sdk.errors import ConfigError, DependencyNotInstalled, NameNotFound  # noqa: E402
from echo2sdk.testing import MockBackend, check_adapter  # noqa: E402

ENVS = Path(__file__).parent / "verifiers_envs"
ARITH, GUESS = "verifiers://vf-echo2-arith", "verifiers://vf-echo2-guess"


@pytest.fixture(autouse=True)
def env_packages(monkeypatch):
    for name in ("vf-echo2-arith", "vf-echo2-guess"):
        monkeypatch.syspath_prepend(str(ENVS / name))


def test_single_turn_env_is_a_task_adapter_scored_by_its_rubric():
    adapter = verifiers_adapter(env=ARITH)
    assert isinstance(adapter, VerifiersTaskAdapter) and not callable(getattr(adapter, "start", None))
    tasks = [t for _, t in zip(range(33), adapter.tasks(0))]
    task = tasks[0]
    assert [m["role"] for m in task.messages] == ["system", "user"] and "<answer>NUMBER</answer>" in task.messages[0]["content"]
    assert sorted(t.info["row"] for t in tasks[:32]) == list(range(32)) and tasks[32].info["epoch"] == 1  # shuffled epochs
    right = adapter.score(task, f"It is <answer>{task.answer}</answer>")
    assert right.reward == pytest.approx(1.2) and right.correct is True  # exact match (async) 1 + format 0.2
    assert right.info["metric.exact_match"] == 1.0 and right.info["metric.format_ok"] == 1.0
    wrong = adapter.score(task, f"<answer>{int(task.answer) + 1}</answer>")
    assert wrong.reward == pytest.approx(0.2) and wrong.correct is False
    assert adapter.score(task, "no idea").reward == 0.0


def test_single_turn_conformance_and_spec_round_trip():
    from echo2sdk.plugins import load_adapter

    adapter = verifiers_adapter(env=ARITH, env_args={"num_problems": 8})
    assert adapter.spec() == ("verifiers", {"env": ARITH, "env_args": {"num_problems": 8}, "split": "train"})
    rebuilt = load_adapter(*adapter.spec())
    assert isinstance(load_adapter("verifiers://vf-echo2-arith"), VerifiersTaskAdapter)  # the one-line config form
    assert [t.messages for _, t in zip(range(8), rebuilt.tasks(3))] == [t.messages for _, t in zip(range(8), adapter.tasks(3))]
    report = check_adapter(adapter, backend=MockBackend())  # random replies: no format, no match
    assert not report["episodic"] and report["records"] == 4 and report["rewards"] == [0.0] * 4


def _search(ep, lo: int = 1, hi: int = 16) -> list:
    steps = []
    while True:
        guess = (lo + hi) // 2
        st = ep.step(f"{guess}")
        steps.append(st)
        if st.done:
            return steps
        if "higher" in st.observation:
            lo = guess + 1
        else:
            assert "lower" in st.observation, st.observation
            hi = guess - 1


def test_multi_turn_env_plays_env_response_turn_by_turn():
    adapter = verifiers_adapter(env=GUESS)
    assert isinstance(adapter, VerifiersEpisodicAdapter) and adapter.max_turns == 5  # the env's own max_turns
    task = next(adapter.tasks(0))
    ep = adapter.start(task, 0)
    assert [m["role"] for m in ep.messages] == ["system", "user"] and "from 1 to 16" in ep.messages[1]["content"]
    steps = _search(ep)
    turns = len(steps)
    assert all(s.reward == 0.0 and "is wrong" in s.observation for s in steps[:-1])
    assert steps[-1].observation is None and steps[-1].reward == pytest.approx(1.0 + 0.5 * (5 - turns + 1) / 5)
    result = ep.result()
    assert result.correct is True and result.info["stop_condition"] == "has_final_env_response"
    assert result.info["metric.solved"] == 1.0 and result.info["turns"] == turns
    ep.close()


def test_multi_turn_limits_malformed_replies_and_abort():
    adapter = verifiers_adapter(env=GUESS)
    task = next(adapter.tasks(1))
    ep = adapter.start(task, 0)
    steps = [ep.step("I do not know")]
    assert steps[0].observation == "Please reply with a number from 1 to 16."
    while not steps[-1].done:
        steps.append(ep.step(""))
    assert len(steps) == 5 and ep.result().reward == 0.0 and ep.result().info["stop_condition"] == "max_turns_reached"
    ep.close()
    cut = adapter.start(task, 1)
    cut.step("3" if task.answer != "3" else "4")
    cut.abort("context_limit")  # ends as a verifiers rollout whose prompt overflowed, scored as it stands
    result = cut.result()
    assert result.reward == 0.0 and result.info["stop_condition"] == "prompt_too_long" and result.info["truncated"] is True
    cut.close()


def test_multi_turn_conformance_with_the_mock_backend():
    adapter = verifiers_adapter(env=GUESS, max_turns=4, max_action_tokens=8)
    assert adapter.spec()[1]["max_turns"] == 4
    report = check_adapter(adapter, backend=MockBackend())
    assert report["episodic"] and report["records"] == 4 and report["failed"] == 0 and max(report["turns"]) <= 4


def test_building_in_a_worker_thread_keeps_the_process_signal_handlers():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    built: dict = {}

    def build() -> None:
        try:
            built["adapter"] = verifiers_adapter(env=GUESS, env_args={"num_games": 3})  # not cached yet
        except Exception as e:  # noqa: BLE001
            built["error"] = e

    worker = threading.Thread(target=build)
    worker.start()
    worker.join()
    assert "error" not in built and isinstance(built["adapter"], VerifiersEpisodicAdapter)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _write_env(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))


def test_errors_name_the_field_and_the_value(tmp_path, monkeypatch):
    with pytest.raises(NameNotFound, match=r"unknown verifiers environment .*'vf-echo2-nothing'"):
        verifiers_adapter(env="verifiers://vf-echo2-nothing")
    with pytest.raises(ConfigError, match=r"env = 'gym://FrozenLake-v1' must be 'verifiers://ENV_ID'"):
        verifiers_adapter(env="gym://FrozenLake-v1")
    with pytest.raises(ConfigError, match=r"env_args = \{'levels': 3\} do not fit vf_echo2_arith.load_environment"):
        verifiers_adapter(env=ARITH, env_args={"levels": 3})
    with pytest.raises(ConfigError, match=r"split = 'test' must be one of \('train', 'eval'\)"):
        verifiers_adapter(env=ARITH, split="test")
    with pytest.raises(ConfigError, match=r"is single-turn: options \['max_turns'\] apply to multi-turn"):
        verifiers_adapter(env=ARITH, max_turns=3)
    with pytest.raises(ConfigError, match=r"vf-echo2-guess: unknown options \['opponent'\]"):
        verifiers_adapter(env=GUESS, opponent="random")
    with pytest.raises(ConfigError, match=r"is multi-turn \(GuessEnv\)"):
        VerifiersTaskAdapter(env=GUESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_env(tmp_path, "vf_echo2_online", """
        import urllib.request

        def load_environment():  # as an environment that fetches its dataset would
            urllib.request.urlopen("http://127.0.0.1:9/dataset.jsonl", timeout=5)
    """)
    with pytest.raises(ConfigError, match=r"env = 'verifiers://vf-echo2-online' needs the network to load \(URLError"):
        verifiers_adapter(env="verifiers://vf-echo2-online")
    _write_env(tmp_path, "vf_echo2_group", """
        import verifiers as vf
        from datasets import Dataset

        def load_environment():
            def best_of_group(completions, **kwargs) -> list[float]:
                return [0.0] * len(completions)
            rows = [{"question": "q", "answer": "a"}]
            return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[best_of_group]))
    """)
    with pytest.raises(ConfigError, match=r"vf-echo2-group: its rubric has group reward functions"):
        verifiers_adapter(env="verifiers://vf-echo2-group")
    monkeypatch.setattr(bridge, "_LOADED", {})
    monkeypatch.setitem(sys.modules, "verifiers", None)
    missing = r'verifiers is not installed: run  pip install "echo2sdk\[bridges\]" && pip install --no-deps "verifiers==0.2.1"'
    with pytest.raises(DependencyNotInstalled, match=missing):
        verifiers_adapter(env=ARITH)
