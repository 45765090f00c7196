"""Small files a reader must never see torn (summary.json, published.json, a run's config.json): written to a
temporary file beside the target, flushed to disk and renamed over it, so a reader sees the old file or the new
one; a write that fails (a full disk) leaves no temporary file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "write_atomic", "write_json_atomic"]


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename, a new file) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, fsync and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any, indent: int | None = None) -> None:
    """`obj` as JSON (json.dumps with `indent`), written by write_atomic."""
    write_atomic(path, json.dumps(obj, indent=indent))
