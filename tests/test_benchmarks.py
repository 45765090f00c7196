"""The benchmarks run end to end at toy sizes, so they do not rot between the runs whose numbers are in
docs/ (their numbers are never asserted here: benchmarks measure, tests check behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
