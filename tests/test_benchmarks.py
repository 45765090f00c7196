"""The benchmarks run end to end at toy sizes, so they do not rot between the runs whose numbers are in
docs/ (their numbers are never asserted here: benchmarks measure, tests check behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys
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
         "--importance-weight", "off", "--set", "learner.filter_zero_variance=false", "--out", str(tmp_path)],
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
