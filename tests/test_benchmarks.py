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
