"""`echo2 plot RUN_DIR`: PNGs from a run folder. The data is a real 4-step SmolLM2-135M run (2 workers,
S = 3, kappa = 2) recorded in tests/data/smollm2_4step (metrics.jsonl and summary.json as the trainer wrote
them); variants add what other runs have (prices, sink files) or lack (summary.json, after a crash)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from echo2sdk.errors import Echo2Error

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402 - matplotlib's own dependency

from echo2sdk.plot import load_run, plot_run  # noqa: E402

RECORDED = Path(__file__).parent / "data" / "smollm2_4step"
ALL = ["reward.png", "staleness.png", "learner_time.png", "t_bcast.png", "workers.png", "cost.png", "tasks.png",
       "filter.png", "skipping.png"]
NO_MIX = "no task mixture (metrics rows have no per-task 'tasks')"
NO_FILTER = "no filter rate measured (filter_rate is null in every row: no group completed, or a run older than the metric)"
NO_SKIPPING = "no prompt filter columns (prompts_skipped is in no row: a run older than pre-rollout prompt skipping)"
#: the main job (examples/math_smollm2.toml) as it ran on 2026-12-07: 20 steps with every issue-35 metric
RECORDED_FILTER = Path(__file__).parent / "data" / "math_20step"


@pytest.fixture
def run_dir(tmp_path) -> Path:
    d = tmp_path / "math_smollm2"
    shutil.copytree(RECORDED, d)
    return d


def _check_png(path: Path) -> tuple[int, int]:
    """A real, non-blank PNG of figure size: returns (width, height) in pixels."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 10_000 < path.stat().st_size < 1_000_000, path
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        w, h = im.size
        lo, hi = im.convert("L").getextrema()
    assert 600 <= w <= 1400 and 300 <= h <= 900, (path.name, w, h)
    assert hi - lo > 100, f"{path.name} is blank"  # text and lines on a white figure
    return w, h


def test_recorded_run_gives_every_png_but_cost_which_says_why(run_dir):
    result = plot_run(run_dir)
    assert [p.name for p in result.written] == ALL[:-4]
    assert all(p.parent == run_dir / "plots" for p in result.written)
    for p in result.written:
        _check_png(p)
    assert result.skipped == {"cost.png": "no prices in this run (every worker's price_per_hour is 0 and "
                                          "scheduler.prices is empty)", "tasks.png": NO_MIX, "filter.png": NO_FILTER,
                              "skipping.png": NO_SKIPPING}


def test_prices_sink_files_and_per_version_t_bcast_are_used_when_present(run_dir, tmp_path):
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["workers"][0]["price_per_hour"] = 0.55
    summary["config"]["scheduler"]["prices"] = {"local-0": 0.12}
    del summary["buffer"]  # staleness then comes from the sink's per-step histograms
    (run_dir / "summary.json").write_text(json.dumps(summary))
    from echo2sdk.runtime.sinks import load_sinks

    sinks = load_sinks(["jsonl"], tmp_path / "sinks", summary["config"])
    for step in (1, 2, 3, 4):
        sinks.log_histogram(step, "staleness", {step - 1: 16})
    sinks.log_table(4, "t_bcast", [{"version": 2, "t_bcast_s": 79.3, "t_bcast_all_s": 80.1},
                                   {"version": 4, "t_bcast_s": 12.0, "t_bcast_all_s": None}])
    sinks.close()
    for name in ("histograms.jsonl", "tables.jsonl", "config.json"):
        shutil.copy(tmp_path / "sinks" / name, run_dir / name)
    run = load_run(run_dir)
    assert run.histograms["staleness"][4] == {3: 16} and run.tables["t_bcast"][0][0] == 4
    result = plot_run(run_dir, tmp_path / "pngs")
    assert [p.name for p in result.written] == ALL[:-3]
    assert result.skipped == {"tasks.png": NO_MIX, "filter.png": NO_FILTER, "skipping.png": NO_SKIPPING}
    for p in result.written:
        _check_png(p)


def test_a_crashed_run_plots_from_metrics_alone(run_dir):
    (run_dir / "summary.json").unlink()
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "version": 5, "time_s": 41')  # the line a kill cut off
    run = load_run(run_dir)
    assert len(run.rows) == 4 and run.summary == {}
    result = plot_run(run_dir)
    assert [p.name for p in result.written] == ALL[:-4]
    assert "has not finished" in result.skipped["cost.png"]
    for p in result.written:
        _check_png(p)


def test_a_folder_without_rows_is_an_error_that_says_so(tmp_path):
    with pytest.raises(Echo2Error, match="metrics.jsonl does not exist: echo2 plot takes the folder of a run"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(Echo2Error, match="has no rows yet"):
        plot_run(tmp_path)


def _echo2(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "echo2sdk.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_plot_prints_the_pngs_and_the_skipped_ones(run_dir, tmp_path):
    r = _echo2("plot", str(run_dir), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:5] == [str(tmp_path / "out" / name) for name in ALL[:-4]]
    assert lines[5].startswith("cost.png: skipped: no prices in this run")
    assert lines[6] == f"tasks.png: skipped: {NO_MIX}" and lines[7] == f"filter.png: skipped: {NO_FILTER}"
    assert lines[8] == f"skipping.png: skipped: {NO_SKIPPING}"
    r = _echo2("plot", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "echo2: error:" in r.stderr and "Traceback" not in r.stderr


def test_cli_version_and_console_flags():
    r = _echo2("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"echo2 {version('echo2sdk')}"
    r = _echo2("-q", "-v", "plot", "x")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    from echo2sdk.cli import build_parser

    args = build_parser().parse_args(["--quiet", "plot", "x"])
    assert args.quiet and not args.verbose and args.command == "plot"


def test_a_mixture_run_gets_its_per_task_figure(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for k, row in enumerate(rows):  # two components; the second completes nothing at step 2
        row["tasks"] = {"sum": {"rollout_accuracy": 0.2 * k, "filter_rate": 0.5, "groups_completed": 2}}
        if k != 1:
            row["tasks"]["legs"] = {"rollout_accuracy": None, "rollout_reward_mean": 0.1 * k, "filter_rate": 1.0}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = plot_run(run_dir)
    assert "tasks.png" not in result.skipped
    _check_png(run_dir / "plots" / "tasks.png")


def test_a_run_with_dynamic_sampling_gets_its_filter_figure(tmp_path):
    """The main job's filter rate against both predictions and its rollouts a second against mu_min; a run that
    crashed before its summary still draws the rates, without the whole run's figures."""
    d = tmp_path / "math"
    shutil.copytree(RECORDED_FILTER, d)
    result = plot_run(d)
    assert "filter.png" not in result.skipped
    _check_png(d / "plots" / "filter.png")
    summary = json.loads((d / "summary.json").read_text())
    summary["capacity"]["mu_min"] = "infeasible: kappa*T_train = 2*10 = 20 s <= T_bcast = 25 s"
    (d / "summary.json").write_text(json.dumps(summary))
    assert "filter.png" not in plot_run(d, tmp_path / "infeasible").skipped  # named, not drawn
    _check_png(tmp_path / "infeasible" / "filter.png")
    (d / "summary.json").unlink()
    assert "filter.png" not in plot_run(d, tmp_path / "crashed").skipped
    _check_png(tmp_path / "crashed" / "filter.png")


def _with_prompt_filter(d: Path, explore: float | None = 0.1) -> list[dict]:
    """The main job's rows as a run with the prompt filter would have written them (issue 44): prompts skipped
    by reason, f had none been skipped, the explore probability (None: the filter off)."""
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    for k, row in enumerate(rows):  # all-wrong prompts early, all-right ones as the policy learns
        reasons = {"all_correct": k // 3, "all_wrong": max(0, 4 - k // 2), "all_same": int(k in (7, 12))}
        on = explore is not None
        row.update(prompts_handed=8, prompts_skipped=sum(reasons.values()) if on else 0,
                   prompts_skipped_by_reason=reasons if on else {}, prompt_explore=explore,
                   filter_rate_unskipped=None if not on or k == 0 else min(1.0, (row["filter_rate"] or 0) + 0.1),
                   rollouts_per_useful=None)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_run_with_the_prompt_filter_gets_its_skipping_figure(tmp_path):
    d = tmp_path / "math"
    shutil.copytree(RECORDED_FILTER, d)
    _with_prompt_filter(d)
    result = plot_run(d)
    assert "skipping.png" not in result.skipped and "filter.png" not in result.skipped
    _check_png(d / "plots" / "skipping.png")
    rows = _with_prompt_filter(d, explore=None)  # the filter off: the columns are there, nothing to draw
    assert all(r["prompts_skipped"] == 0 for r in rows)
    result = plot_run(d, tmp_path / "off")
    assert result.skipped["skipping.png"] == "the prompt filter is off (prompt_explore is null in every row)"
    assert "filter.png" not in result.skipped
