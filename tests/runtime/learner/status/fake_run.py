"""A RunView over the recorded 20-step math run's metrics rows (tests/data/math_20step), with two local workers
and stand-ins for the registry, the buffer and the publication: what view.page_state reads, without a run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from echo2sdk.config import load_config
from echo2sdk.runtime.coordinator.worker_info import WorkerInfo
from echo2sdk.runtime.learner.status import RunView

ROWS = Path(__file__).parents[4] / "tests" / "data" / "math_20step" / "metrics.jsonl"

#: the prompt filter's columns of one step (issue 44): 3 prompts skipped (2 all right, 1 all wrong), 6 handed
FILTER_ON = {"prompts_handed": 6, "prompts_skipped": 3,
             "prompts_skipped_by_reason": {"all_correct": 2, "all_wrong": 1, "all_same": 0},
             "prompt_explore": 0.1, "filter_rate_unskipped": 0.95, "rollouts_per_useful": 4 / 3}


def rows() -> list[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines()]


def view(rows: list[dict], prices: str = "{}") -> RunView:
    cfg = load_config(None, ['model.policy="tiny-random"', "learner.steps=20", f"scheduler.prices={prices}"])
    workers = {w.worker_id: w for w in (WorkerInfo("local-0", "127.0.0.1:1", price_per_hour=0.5),
                                        WorkerInfo("local-1", "127.0.0.1:2", price_per_hour=0.5))}
    registry = SimpleNamespace(workers=workers, quarantined={}, delivery=SimpleNamespace(topology="direct"),
                               stats=lambda: {"groups_dropped": 0})
    return RunView("math", cfg, registry, SimpleNamespace(stats=lambda: {"staleness_hist": {}}),
                   SimpleNamespace(rows=rows), SimpleNamespace(version=len(rows)))
