"""The `jsonl` sink: the run folder's own files, the record `--resume` and `echo2 plot` read.

    config.json        the configuration, written when the sink opens (a crashed run keeps it)
    metrics.jsonl      one line per learner step: the trainer's row, exactly as `json.dumps` writes it
    tables.jsonl       one line per table: {"step", "name", "rows"}
    histograms.jsonl   one line per histogram: {"step", "name", "counts": {"0": n0, "1": n1, ...}}

Files are appended to, never truncated: a fresh run in a used folder calls `reset_run_files` first (a
resumed run keeps them; the trainer cuts metrics.jsonl back to the checkpoint itself).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from echo2sdk.runtime.files import write_atomic
from echo2sdk.runtime.sinks import sorted_counts

__all__ = ["JsonlSink", "FILES", "reset_run_files"]

#: The files this sink appends to (config.json is replaced at every open).
FILES = ("metrics.jsonl", "tables.jsonl", "histograms.jsonl")


def reset_run_files(run_dir: str | Path) -> None:
    """Remove a previous run's FILES from `run_dir` (a fresh run in a used folder starts them empty)."""
    for name in FILES:
        (Path(run_dir) / name).unlink(missing_ok=True)


class JsonlSink:
    """config.json, metrics.jsonl, tables.jsonl and histograms.jsonl in the run folder (see the module)."""

    def __init__(self) -> None:
        self.dir: Path | None = None
        self._files: dict[str, IO[str]] = {}

    def open(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.dir = Path(run_dir)
        write_atomic(self.dir / "config.json", json.dumps(config, indent=2, default=str) + "\n")
        self._file("metrics.jsonl")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._append("metrics.jsonl", json.dumps(metrics))

    def tell(self) -> int:
        """The length of metrics.jsonl after the last row (what a checkpoint records)."""
        fh = self._file("metrics.jsonl")
        fh.flush()
        return os.fstat(fh.fileno()).st_size  # the file's, even if it was cut back since it was opened

    def log_table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        self._append("tables.jsonl", json.dumps({"step": step, "name": name, "rows": rows}, default=str))

    def log_histogram(self, step: int, name: str, counts: Mapping[int, int]) -> None:
        pairs = {str(k): v for k, v in sorted_counts(counts)}
        self._append("histograms.jsonl", json.dumps({"step": step, "name": name, "counts": pairs}))

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def _file(self, name: str) -> IO[str]:
        if self.dir is None:
            raise RuntimeError("JsonlSink: open() was not called")
        if name not in self._files:
            self._files[name] = open(self.dir / name, "a")  # noqa: SIM115 - kept open until close()
        return self._files[name]

    def _append(self, name: str, line: str) -> None:
        fh = self._file(name)
        fh.write(line + "\n")
        fh.flush()
