"""Package-level contracts: cheap import, exported names, config errors, CLI wiring."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import echo2sdk
from echo2sdk.config import load_config
from echo2sdk.errors import ConfigError, NameNotFound


def test_import_does_not_load_torch_or_transformers():
    code = "import echo2sdk, sys; print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_exported_members_resolve():
    for name in echo2sdk.__all__:
        assert getattr(echo2sdk, name) is not None, name


def test_unknown_config_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown key 'learner.stalenes' \(did you mean 'staleness'\?\)"):
        load_config(None, ["learner.stalenes=3"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("learner.staleness=1", "learner.staleness = 1"),
        ("learner.trajectories_per_step=10", "multiple of rollout.group_size=4"),
        ("learner.kappa=5", "kappa must be an integer in [1, S - 1 = 2] (paper section 4.1), got kappa=5"),
        ("rollout.workers=-1", "rollout.workers = -1"),
    ],
)
def test_bad_values_name_field_and_value(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])


def test_key_value_flags_read_toml_values_and_name_the_flag():
    from echo2sdk.config import key_values

    assert key_values(["a=1", " b = x y ", 'c=[1, "z"]', "d=true"]) == [("a", 1), ("b", "x y"), ("c", [1, "z"]),
                                                                        ("d", True)]
    with pytest.raises(ConfigError, match="--task-option expects KEY=VALUE, got 'level'"):
        key_values(["level"], "--task-option")
    with pytest.raises(ConfigError, match="--set expects KEY=VALUE"):
        load_config(None, ["=3"])


def test_example_config_is_valid():
    cfg = load_config("examples/math_smollm2.toml")
    assert cfg.learner.staleness == 3 and cfg.kappa == 2 and cfg.rollout.workers == 2


def test_echo2_set_maps_short_names_and_rejects_unknown():
    e = echo2sdk.Echo2(policy="tiny-random").set(dataset="math", staleness=4, steps=3)
    assert (e.config.learner.staleness, e.config.learner.steps, e.config.task.adapter) == (4, 3, "math")
    with pytest.raises(ConfigError, match="unknown option 'stalenes'"):
        e.set(stalenes=3)


def test_unknown_adapter_suggests_close_names():
    from echo2sdk.plugins import load_adapter

    with pytest.raises(NameNotFound, match=r"unknown adapter 'maht'.*Did you mean 'math'"):
        load_adapter("maht")


def test_cli_reports_config_errors_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[learner]\nstepz = 3\n")
    r = subprocess.run([sys.executable, "-m", "echo2sdk.cli", "run", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "unknown key 'learner.stepz'" in r.stderr and "Traceback" not in r.stderr


def test_switching_adapter_by_set_drops_the_files_options():
    """issue 18: switching from math with --set must not need task.options={} by hand."""
    example = Path(__file__).resolve().parents[1] / "examples" / "math_smollm2.toml"
    assert load_config(example).task.options == {"difficulty": 1}
    moba = load_config(example, ["task.adapter=moba://lane_1v1_v1"])
    assert (moba.task.adapter, moba.task.options) == ("moba://lane_1v1_v1", {})
    tuned = load_config(example, ["task.options.max_turns=8", "task.adapter=moba://lane_1v1_v1"])
    assert tuned.task.options == {"max_turns": 8}  # the order of the --set flags does not matter
    same = load_config(example, ["task.adapter=math", "task.options.difficulty=2"])
    assert same.task.options == {"difficulty": 2}  # naming the same adapter keeps the file's options
    assert load_config(example, ["rollout.backend=hf"]).rollout.backend == "hf"
