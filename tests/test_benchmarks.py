"""The benchmarks run end to end at toy sizes, so they do not rot between the runs whose numbers are in
docs/ (their numbers are never asserted here: benchmarks measure, tests check behaviour)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_broadcast_ceiling_mode_prints_its_parameters_and_both_measurements():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "broadcast.py"), "--mode", "ceiling", "--size-mib", "8", "--repeats", "1"],
        capture_output=True, text=True, timeout=180, check=True,
    ).stdout
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["mode"] == "ceiling" and row["hops"] == 8 and row["shaping"] == "none"
    assert row["snapshot_bytes"] == 8 << 20 and row["chunk_bytes"] == 4 << 20
    for key in ("echo2_tail_gbps", "plain_relay_gbps", "echo2_cpu_s_per_gb", "plain_cpu_s_per_gb",
                "echo2_busiest_thread_cpu_s_per_gb", "plain_busiest_thread_cpu_s_per_gb"):
        assert row[key] > 0, key
    assert abs(row["ratio"] - row["echo2_tail_gbps"] / row["plain_relay_gbps"]) < 0.02  # of the unrounded medians
    # the busiest thread cannot have spent more CPU than all threads together
    assert row["echo2_busiest_thread_cpu_s_per_gb"] <= row["echo2_cpu_s_per_gb"]


def test_a_plain_relay_that_dies_without_reporting_ends_the_baseline_with_its_exit_code(monkeypatch):
    """CI once waited past its 180 s on a relay that had died (its fixed port was taken); the baseline now
    listens on ports the kernel picks and names a dead relay's exit code at once."""
    broadcast = _bench("broadcast")
    real = broadcast._plain_relay

    def tail_dies(srv, next_port, total, chunk, result):
        if next_port is not None:
            return real(srv, next_port, total, chunk, result)
        conn, _ = srv.accept()
        got = 0
        while got < total and (n := len(conn.recv(1 << 16))):
            got += n
        os._exit(3)  # read everything, reported nothing

    assert broadcast.plain_baseline(1 << 20, 64 << 10, 3, timeout_s=60)[0] > 0  # the real relays report
    monkeypatch.setattr(broadcast, "_plain_relay", tail_dies)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exit codes \[3\], 2/3 relays reported"):
        broadcast.plain_baseline(1 << 20, 64 << 10, 3, timeout_s=60)
    assert time.monotonic() - started < 30


def test_intake_memory_bench_refuses_huge_text_with_the_bounds_and_prints_both_modes():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "intake_memory.py"), "--workers", "2", "--pushes", "2",
         "--text-kib", "100,1", "--settle-s", "0.5"],
        capture_output=True, text=True, timeout=180, check=True,
    ).stdout
    rows = {(r["mode"], r["text_kib"]): r for r in (json.loads(x) for x in out.splitlines() if x.startswith("{"))}
    assert sorted(rows) == [("bounds", 1), ("bounds", 100), ("none", 1), ("none", 100)]
    assert rows["bounds", 100]["rejected"] == {"text_too_long": 16} and rows["bounds", 100]["held"] == 0
    assert rows["none", 100]["accepted"] == 16 and rows["bounds", 1]["accepted"] == 16  # 1 KiB is honest text
    for r in rows.values():
        assert r["rss_before_mib"] > 0 and r["buffer"]["groups_per_worker"] == 16


def test_intake_stall_bench_times_the_probe_around_every_kind_of_push():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "intake_stall.py"), "--mib", "1", "--quiet-s", "0.3"],
        capture_output=True, text=True, timeout=180, check=True,
    ).stdout
    rows = {r["kind"]: r for r in (json.loads(x) for x in out.splitlines() if x.startswith("{"))}
    assert sorted(rows) == ["maps", "maps-cap", "records", "text"]
    # a header of maps is no push: over the 256 KiB cap it is refused from its prefix, under it it fails to parse
    assert rows["maps"]["answer"] == rows["maps-cap"]["answer"] == "closed"
    assert rows["maps"]["header_bytes"] > 256 << 10 > rows["maps-cap"]["header_bytes"] > (256 << 10) - 200
    assert rows["text"]["answer"] == rows["records"]["answer"] == "ack" and rows["records"]["records"] > 1000
    for r in rows.values():
        assert r["probes_during"] >= 1 and r["probe_worst_during_ms"] > 0 and r["probe_p50_before_ms"] > 0
        assert 0.9 < r["frame_mib"] < 1.1 or r["kind"] == "maps-cap"


@pytest.mark.slow
def test_load_bench_loses_nothing_and_prints_every_figure():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load.py"), "--seconds", "5", "--phases", "tls:1,tls:4"],
        capture_output=True, text=True, timeout=180, check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["tls"], r["workers"]) for r in rows] == [(True, 1), (True, 4)]
    for r in rows:
        assert r["sent"] > 0 and r["sent"] == r["acknowledged"] == r["in_buffer"] and r["lost"] == 0, r
        assert r["worker_errors"] == 0 and r["joined"] == r["workers"] and r["protocol_errors"] == 0
        for key in ("p50_ms", "p99_ms", "coordinator_cpu_s", "coordinator_rss_mib", "loadgen_cpu_s"):
            assert r[key] >= 0, key


@pytest.mark.slow
def test_multiturn_bench_prints_both_cases_and_their_ratio():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "multiturn.py"), "--model", "tiny-random", "--episodes", "4",
         "--group-size", "2", "--turns", "3", "--action-tokens", "4", "--obs-min", "3", "--obs-max", "5",
         "--prompt-tokens", "6", "--token-budget", "20", "--threads", "1"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["case"] for r in rows] == ["singleturn", "multiturn", "ratio multiturn/singleturn"]
    single, multi, _ = rows
    assert single["trained_tokens"] == multi["trained_tokens"] == 4 * 3 * 4  # records x turns x action tokens
    assert single["record_tokens"] < multi["record_tokens"] and multi["token_budget"] == 20
    for r in (single, multi):
        assert r["s_per_step"] > 0 and r["cpu_s"] > 0 and r["peak_rss_gib"] >= r["rss_model_gib"] > 0, r


@pytest.mark.slow
def test_bootstrap_bench_prints_both_modes_with_the_bytes_received():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bootstrap.py"), "--model", "tiny-random", "--repeats", "1",
         "--max-new-tokens", "4"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["local", "bootstrap"]
    assert all(r["seconds_to_first_rollout"] > 0 for r in rows)
    assert rows[1]["files"] >= 2 and rows[1]["weight_bytes"] > 0 and rows[1]["bootstrap_s"] >= 0


@pytest.mark.slow
def test_staleness_bench_prints_a_line_per_run_a_summary_and_a_png(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "staleness.py"), "--model", "tiny-random", "--steps", "2", "--S", "2,3",
         "--importance-weight", "off", "--workers", "1", "--set", "learner.filter_zero_variance=false",
         "--set", "rollout.max_new_tokens=8", "--set", "rollout.nice=0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    *runs, summary = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["S"], r["kappa"], r["importance_weight"]) for r in runs] == [(2, 1, False), (3, 2, False)]
    for r in runs:
        assert "error" not in r, r
        assert len(r["reward"]) == len(r["time_s"]) == len(r["staleness"]["per_step_max"]) == 2
        assert r["staleness"]["n"] == 2 * r["R"] and r["staleness"]["max"] <= r["S"]
        assert (r["is_weight_mean"], r["is_truncated_frac"]) == (1.0, 0.0)  # the weight is off: w_t = 1
        config = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert config["learner"]["importance_weight"] is False and config["learner"]["staleness"] == r["S"]
    assert summary["summary"] and summary["failed"] == 0
    assert [(c["S"], c["baseline_S"]) for c in summary["configs"]] == [(2, 2), (3, 2)]
    assert (tmp_path / "staleness.png").stat().st_size > 0
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 3

    # a sweep run in parts: --from summarizes and draws the run lines of several results files, running nothing
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    part_a, part_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    part_a.write_text(lines[0] + "\n" + lines[2] + "\n")  # a part's own summary line is recomputed, not copied
    part_b.write_text(lines[1] + "\n")
    merged = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "staleness.py"), "--from", str(part_a), str(part_b),
         "--out", str(tmp_path / "merged")], capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    *again, merged_summary = [json.loads(line) for line in merged.splitlines() if line.startswith("{")]
    assert again == runs and merged_summary == summary
    assert (tmp_path / "merged" / "staleness.png").stat().st_size > 0
    twice = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "staleness.py"), "--from", str(part_a), str(tmp_path / "results.jsonl"),
         "--out", str(tmp_path / "twice")], capture_output=True, text=True, timeout=120,
    )
    assert twice.returncode != 0 and "S=2, importance weight off, seed 0 is in both" in twice.stderr, twice.stderr

def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vs_trl():
    return _bench("vs_trl")


def test_vs_trl_level_is_reached_at_the_first_full_window_whose_mean_reaches_it():
    time_to_level = _vs_trl().time_to_level
    wall = [10.0, 20.0, 30.0, 40.0, 50.0]
    acc = [1.0, 0.0, 0.5, 0.5, 1.0]
    assert time_to_level(wall, acc, 0.5, 2) == (20.0, 2)  # step 1 alone (1.0) is no full window
    assert time_to_level(wall, acc, 0.75, 2) == (50.0, 5)
    assert time_to_level(wall, acc, 0.9, 2) is None
    assert time_to_level(wall, acc, 0.5, 1) == (10.0, 1)


def test_vs_trl_pooled_accuracy_takes_whole_newest_steps_up_to_n_completions():
    pooled = _vs_trl().pooled_accuracy_at
    run = {"wall_s": [10.0, 20.0, 30.0, 40.0], "accuracy": [0.0, 1.0, 0.5, 0.25], "completions": [8, 4, 4, 16]}
    assert pooled(run, 35.0, 8) == (0.75, 8)  # steps 3 and 2 (step 4 ended after t)
    assert pooled(run, 35.0, 6) == (0.75, 8)  # whole steps: step 2 is taken whole
    assert pooled(run, 40.0, 100) == (0.3125, 32)  # fewer than n: all of them, weighted by completions
    assert pooled(run, 5.0, 8) is None


def test_vs_trl_pooled_accuracy_between_takes_every_step_that_ended_in_the_stretch():
    between = _vs_trl().pooled_accuracy_between
    run = {"wall_s": [10.0, 20.0, 30.0, 40.0], "accuracy": [0.0, 0.5, 1.0, 0.25], "completions": [4, 4, 4, 20]}
    assert between(run, 0.0, 20.0) == (0.25, 8)  # steps 1 and 2: (0 x 4 + 0.5 x 4) / 8
    assert between(run, 20.0, 40.0) == (0.375, 24)  # steps 3 and 4, weighted by completions: (4 + 5) / 24
    assert between(run, 40.0, 50.0) is None


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                    reason='trl is not installed (the optional extra "bench": pip install -e ".[bench]")')
def test_vs_trl_runs_both_sides_and_prints_the_comparison(tmp_path):
    png = tmp_path / "vs_trl.png"
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "vs_trl.py"), "--model", "tiny-random", "--steps", "2",
         "--set", "rollout.max_new_tokens=4", "--set", "rollout.workers=1", "--png", str(png),
         "--set", "rollout.nice=0"],  # the suite's other process shares the cores: an idle worker would wait for it
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    params, echo2, trl, result = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert "(1, 1 torch thread(s) each, nice 0: rollout.nice)" in params["differs"][0]
    assert params["R"] == 16 and params["n"] == 4 and params["max_new_tokens"] == 4 and params["steps"] == 2
    trl_cfg = params["trl_config"]
    assert trl_cfg["num_generations"] == 4 and trl_cfg["max_completion_length"] == 4
    assert trl_cfg["per_device_train_batch_size"] * trl_cfg["gradient_accumulation_steps"] == 16
    assert trl_cfg["num_iterations"] == params["updates_per_step"]
    assert trl_cfg["max_steps"] == 2 * trl_cfg["num_iterations"]
    assert params["filter"] == "on"  # the main job's dynamic sampling, with a bounded wait
    assert params["learner"] == {"filter_zero_variance": True, "max_wait_s": 3.0}
    assert echo2["accuracy_of"] == "rollout_accuracy" and trl["accuracy_of"] == "generation batch"
    for side, row in (("echo2", echo2), ("trl", trl)):
        assert row["side"] == side
        assert len(row["wall_s"]) == len(row["accuracy"]) == len(row["reward"]) == row["steps_with_accuracy"]
        assert 0 < row["setup_s"] < row["wall_s"][0] <= row["wall_s"][-1] <= row["total_s"]
        assert all(0 <= a <= 1 for a in row["accuracy"])
    assert trl["steps_with_accuracy"] == 2 and 1 <= echo2["steps_with_accuracy"] <= 2
    assert result["level"] == pytest.approx(sum(trl["accuracy"]) / 2, abs=1e-4)
    assert result["trl_step_to_level"] == 2  # TRL's own trailing mean equals the level at its last step
    assert result["trl_total_s"] == pytest.approx(trl["total_s"], abs=0.01)
    assert result["accuracy_at_trl_total_s"]["trl"] == pytest.approx(result["level"], abs=1e-4)
    assert trl["completions"] == [16, 16] and all(c > 0 for c in echo2["completions"])
    pooled = result["pooled_accuracy_at_trl_total_s"]["trl"]  # 32 completions < 5 x 16: both steps, equal weights
    assert pooled["completions"] == 32 and pooled["accuracy"] == pytest.approx(result["level"], abs=1e-4)
    halves = [result[f"pooled_accuracy_{h}_half_of_trl_time"]["trl"] for h in ("first", "second")]
    assert halves[1]["completions"] in (16, 32)  # TRL's last step ends at its total time: in the second half
    assert sum(h["completions"] for h in halves if h) == 32
    if result["echo2_time_to_level_s"] is not None:
        expected = result["echo2_time_to_level_s"] / result["trl_time_to_level_s"]
        assert result["ratio"] == pytest.approx(expected, abs=2e-3)
    assert png.stat().st_size > 0


def test_prompt_skip_bench_reads_a_runs_figures_from_its_files(tmp_path):
    """bench/prompt_skip.py's per-run figures from a run folder's metrics.jsonl and summary.json (written here by
    hand): the filter rate over the run, rollouts per trained trajectory, the wait by cause, the time to the level."""
    bench = _bench("prompt_skip")
    rows = [{"step": s, "time_s": 10.0 * s, "rollout_accuracy": a, "rollouts": 32, "trajectories": 16,
             "learner_wait_s": 2.0, "learner_wait_filtered_s": 1.5, "learner_wait_empty_s": 0.5,
             "learner_wait_snapshot_s": 0.0} for s, a in ((1, 0.5), (2, None), (3, 0.9), (4, 0.9), (5, 0.95))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"wall_s": 55.0, "buffer": {"filtered_groups": 30, "completed_groups": 40}, "bubble_ratio": 0.2,
               "rollout_accuracy_first5": 0.8, "rollout_accuracy_last5": 0.8, "coordinator": {"rejected": {"stale": 3}},
               "prompt_filter": {"skipped": 7, "skipped_by_reason": {"all_correct": 7}, "f_unskipped": 0.8,
                                 "precision": 1.0, "explore": 0.05, "repeat_share": 0.6}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    fig = bench.figures(tmp_path, 0.85, 3)
    assert fig["f"] == 0.75 and fig["rollouts_per_trained"] == 2.0 and fig["stale_refused"] == 3
    assert (fig["learner_wait_s"], fig["wait_filtered_s"], fig["wait_empty_s"]) == (10.0, 7.5, 2.5)
    # trailing 3 of the steps with an accuracy: (0.5, 0.9, 0.9) = 0.77 at step 4, (0.9, 0.9, 0.95) at step 5
    assert (fig["time_to_0.85_s"], fig["step_to_0.85"]) == (50.0, 5)
    assert fig["skipped"] == 7 and fig["explore_end"] == 0.05
    off, on = dict(fig, **{"time_to_0.85_s": 100.0}), fig
    assert bench.compare(off, on, 0.85)["time_ratio_on_off"] == 0.5
