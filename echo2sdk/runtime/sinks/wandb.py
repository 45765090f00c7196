"""The `wandb` sink: a Weights & Biases run under RUN_DIR/wandb/.

Offline unless told otherwise: the mode is ``$WANDB_MODE`` (default ``offline``, which needs no account and no
network; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later), the project ``$WANDB_PROJECT``
(default ``echo2``), the run's name the run folder's name. The config goes to the run's config; each step's
row to its history (nested dicts flattened, ``task/correct``); tables as `wandb.Table`; histograms as
`wandb.Histogram` with one bin per integer value. W&B's console capture is off (the progress bar and
echo2's log stay as they are) and so are its console messages. Needs the `wandb` extra.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from echo2sdk.errors import DependencyNotInstalled
from echo2sdk.runtime.sinks import columns, flatten, sorted_counts

__all__ = ["WandbSink"]


class WandbSink:
    """One W&B run per `open` (a resumed run is a new W&B run in the same folder and project)."""

    def __init__(self) -> None:
        self._run: Any = None

    def open(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise DependencyNotInstalled("wandb", "wandb") from None
        self._wandb = wandb
        settings = wandb.Settings(console="off", silent=True, disable_git=True, save_code=False)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "echo2"),
            dir=str(run_dir),
            name=Path(run_dir).resolve().name,
            config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),
            settings=settings,
            reinit="create_new",
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(flatten(metrics), step=step)

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        cols = columns(rows)
        table = self._wandb.Table(columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows])
        self._run.log({name: table}, step=step)

    def log_histogram(self, step: int, name: str, counts: Mapping[int, int]) -> None:
        pairs = sorted_counts(counts)
        if not pairs:
            return
        lo, hi = pairs[0][0], pairs[-1][0]
        dense = dict(pairs)
        values = [dense.get(k, 0) for k in range(lo, hi + 1)]
        edges = [k - 0.5 for k in range(lo, hi + 2)]  # one bin per integer value
        self._run.log({name: self._wandb.Histogram(np_histogram=(values, edges))}, step=step)

    def close(self) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.finish()
            # finish() returns when W&B's service has taken the exit; the service writes the offline file's last
            # block when it closes the run's stream, later. With no other W&B run open in this process, teardown
            # waits for that: the file is complete (ready for `wandb sync`) when close returns.
            if self._wandb.setup().most_recent_active_run is None:
                self._wandb.teardown()


def _cell(value: Any) -> Any:
    """A table cell W&B types consistently: numbers and booleans as they are, the rest as text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)
