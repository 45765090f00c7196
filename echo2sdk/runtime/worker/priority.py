"""A rollout worker's CPU priority beside a learner on the same cores (rollout.nice, `echo2 worker --nice`).

"idle" puts every thread of the process under Linux's SCHED_IDLE: the worker takes a core only when no normal
process wants it, so the learner's update runs at the speed it has alone and the workers generate in its waits,
its publications and the gaps between its kernels. A niceness N (1-19) only lowers the worker's share: a worker
at nice 10 still took a core slice from every learner step here, and the learner's OpenMP threads spin at each
barrier while one of them waits for its core (docs/recipes.md, "Local workers' priority and the learner's
optimizer": 20 steps of the level-2 math job on a 2-core Xeon, the learner's forward and backward 0.78 s a
trajectory beside nice-10 workers, 0.56 s beside SCHED_IDLE ones). The price: an idle worker gets almost nothing
while any other process keeps the cores busy (another run, a build). Where SCHED_IDLE does not exist or is
refused (macOS; gVisor answers EINVAL) "idle" falls back to nice 19 and says so.
"""

from __future__ import annotations

import os
from pathlib import Path

from echo2sdk.core import checks
from echo2sdk.core.checks import IDLE

__all__ = ["IDLE", "lower_priority"]


def _threads() -> list[int]:
    """This process's thread ids (Linux: /proc/self/task), else [0] (the calling thread)."""
    tasks = Path("/proc/self/task")
    return [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]


def _renice(n: int) -> None:
    """Niceness n on every thread that runs now (Linux's nice is per thread) and, by inheritance, on later ones."""
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(n, os.getpriority(os.PRIO_PROCESS, tid)))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def lower_priority(nice: object) -> str:
    """Lower this process's CPU priority as `nice` says (see the module); returns what was done, for the log.
    Threads started later inherit it; the ones already running are moved too."""
    nice = checks.nice(nice)  # "idle" or 0-19; ValueError naming the value otherwise
    if nice == IDLE:
        if hasattr(os, "SCHED_IDLE"):
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread first: the one that matters
            except OSError as e:
                return _fallback(f"SCHED_IDLE refused: {e}")
            for tid in _threads():
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                except OSError:  # ended meanwhile; the ones that start later inherit it from this thread
                    pass
            return "SCHED_IDLE"
        return _fallback("this system has no SCHED_IDLE")
    if nice:
        _renice(nice)
        return f"nice {nice}"
    return "normal priority"


def _fallback(why: str) -> str:
    if not hasattr(os, "setpriority"):
        return f"normal priority ({why}, and no niceness on this system)"
    _renice(19)
    return f"nice 19 ({why})"
