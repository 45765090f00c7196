"""The learner process's console and process-wide settings: one progress bar (echo2's), log lines above it and
INFO into DIR/run.log, transformers' bars off, the first SIGTERM/SIGINT routed to the recipe, a JSON-lines event
file. Used by the recipe (recipe.py); nothing here knows the run."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["log_above", "one_line", "library_bars_off", "progress", "signals", "log_to", "event_log", "refusals_line"]

log = logging.getLogger("echo2sdk.learner")


@contextlib.contextmanager
def log_above(bar: Any) -> Iterator[None]:
    """While the bar runs, console log lines go through tqdm.write (printed above the bar, which stays whole)
    at the console handler's level (WARNING under `echo2 run`): INFO goes to DIR/run.log only."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    root = logging.getLogger()
    console = [h for h in root.handlers if type(h) is logging.StreamHandler and h.stream in (sys.stdout, sys.stderr)]
    if bar.disable or not console:
        yield
        return
    before = set(root.handlers)
    with logging_redirect_tqdm(loggers=[root]):
        for h in set(root.handlers) - before:
            h.setLevel(max(c.level for c in console))  # logging_redirect_tqdm does not copy the level
        yield


def refusals_line(rejected: dict[str, int]) -> str | None:
    """One line counting the records refused at intake by reason (summary.json's coordinator.rejected), printed after
    the summary: routine refusals (stale) were logged in run.log only. None when there were none."""
    if not rejected:
        return None
    why = " (stale: generated on a snapshot older than v_t - S, which bounded staleness drops by design)"
    return ("records refused at intake: " + ", ".join(f"{n} {reason}" for reason, n in sorted(rejected.items()))
            + (why if "stale" in rejected else ""))


@contextlib.contextmanager
def one_line(model: str, show: bool) -> Iterator[None]:
    """Resolve `model` with stderr held back: when that took a while (a first use converts or fetches it), one
    line says so (if `show`) instead of the converter's progress bars; on an error all that was held is shown."""
    import io

    held, t0 = io.StringIO(), time.perf_counter()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise
    took = time.perf_counter() - t0
    if took > 2.0:
        log.info("model %r prepared in %.1f s (converted or fetched once into the model cache)", model, took)
        if show:
            print(f"echo2: model {model!r} prepared once in {took:.0f} s; later runs load it from the cache",
                  file=sys.stderr)


@contextlib.contextmanager
def library_bars_off() -> Iterator[None]:
    """transformers' progress bars ("Loading weights", "Writing model shards") off: the learner process's
    console shows echo2's bar only."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def progress(total: int, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="echo2 steps", unit="step", disable=not enabled, dynamic_ncols=True)


@contextlib.contextmanager
def signals(on_signal: Any) -> Iterator[None]:
    """Route the first SIGTERM/SIGINT to `on_signal(signum)`; the handlers in place before come back at once,
    so a second signal acts as it would have. Only the main thread can set handlers; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        for s, h in before.items():
            signal.signal(s, h)
        on_signal(signum)

    for s in before:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def log_to(path: Path) -> logging.Handler | None:
    """echo2sdk's INFO lines into `path` as well. Returns the handler added (None when one writes there already):
    the run removes it at its close, so that a later run in the same process does not write into this file."""
    root = logging.getLogger("echo2sdk")
    root.setLevel(logging.INFO)
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path.resolve()) for h in root.handlers):
        return None
    fh = logging.FileHandler(path)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(fh)
    return fh


def stop_logging_to(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger("echo2sdk").removeHandler(handler)
        handler.close()


def event_log(path: Path) -> tuple[IO[str], Any]:
    """The scheduler's event file (appended to) and a function writing one JSON line to it, flushed."""
    events = open(path, "a")

    def write(event: dict[str, Any]) -> None:
        events.write(json.dumps(event, default=str) + "\n")
        events.flush()

    return events, write
