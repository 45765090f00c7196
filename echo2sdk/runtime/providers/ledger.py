"""The run ledger: every machine a run's providers launched, in the run folder, written before the launch.

``RUN_DIR/machines.jsonl`` holds one JSON object per line, appended and flushed to disk (fsync) before the
provider acts, so that a learner killed at any moment (SIGKILL included) leaves behind the list of what it may
have started: ``echo2 fleet status RUN_DIR`` reads it back and ``echo2 fleet down RUN_DIR`` ends every machine
in it that is not known to be down, through the provider that started it (:func:`fleet_down`).

Events, each with ``t`` (Unix seconds), ``event``, ``machine`` (the worker id) and ``provider`` (its entry-point
name): ``launch`` (written before the launch; ``handle`` is what the provider needs to find the machine again
without the learner: a SkyPilot cluster name; a local pid with its start time, and the SHA-256 of the nonce in that
worker's environment, never the nonce; ``spec``: the launch's public description: type, resources, $/h, never a
secret), ``requested`` (the launch request's id, to cancel), ``up`` (the launch finished), ``failed`` (with
``reason``) and ``down`` (the machine was ended and its end confirmed, or it was found no longer running; never one
left alone because it could not be proven the run's). A machine's state is its last event; ``handle`` fields added
by later events are merged in.

``echo2 fleet`` trusts this file as much as it trusts the run folder: it refuses one that another user owns or
that others may write, and it acts only through providers registered as entry points. A process whose providers
have written the ledger holds ``RUN_DIR/.fleet.lock`` (flock, with its pid) while it lives: ``echo2 fleet down`` refuses
to end the machines of a run still going unless forced (a killed learner's lock is gone with it).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echo2sdk.errors import ConfigError

__all__ = ["FILENAME", "Ledger", "Machine", "read_ledger", "holder"]

FILENAME = "machines.jsonl"
LOCK = ".fleet.lock"
_HELD: dict[str, int] = {}  # run folder -> the open lock file this process holds
EVENTS = ("launch", "requested", "up", "failed", "down")


@dataclass
class Machine:
    """One machine as the ledger knows it: its last event and what the launch recorded."""

    name: str
    provider: str
    handle: dict[str, Any]
    spec: dict[str, Any] = field(default_factory=dict)
    state: str = "launch"  # the last event: launch, up, failed or down
    launched_at: float = 0.0
    changed_at: float = 0.0
    reason: str = ""

    @property
    def down(self) -> bool:
        return self.state == "down"


class Ledger:
    """Appends events to ``run_dir/machines.jsonl``; safe to share between a provider's threads."""

    def __init__(self, run_dir: str | os.PathLike, provider: str):
        self.path = Path(run_dir) / FILENAME
        self.provider = provider
        self._lock = threading.Lock()

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"t": round(time.time(), 3), "provider": self.provider, **record}, sort_keys=True)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _hold(self.path.parent)  # from the first record on, for the rest of this process
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with open(fd, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())  # on disk before the launch it announces

    def launching(self, machine: str, handle: dict[str, Any], spec: dict[str, Any] | None = None) -> None:
        """Record a launch about to happen (call this before the provider acts)."""
        self._write({"event": "launch", "machine": machine, "handle": handle, "spec": spec or {}})

    def requested(self, machine: str, request: str) -> None:
        """The provider's launch request is under way (SkyPilot: its request id, which `fleet down` cancels)."""
        self._write({"event": "requested", "machine": machine, "handle": {"request": request}})

    def up(self, machine: str, handle: dict[str, Any] | None = None, **detail: Any) -> None:
        """The launch finished; `handle`: what it learned of the machine (merged into the launch's)."""
        self._write({"event": "up", "machine": machine, **({"handle": handle} if handle else {}), **detail})

    def failed(self, machine: str, reason: str) -> None:
        self._write({"event": "failed", "machine": machine, "reason": reason})

    def down(self, machine: str) -> None:
        self._write({"event": "down", "machine": machine})

    def machines(self) -> dict[str, Machine]:
        return read_ledger(self.path.parent)


def read_ledger(run_dir: str | os.PathLike) -> dict[str, Machine]:
    """The machines recorded in ``run_dir/machines.jsonl`` by name, each with its last event. A torn last line
    (the learner killed mid-write) is skipped; any other bad line is an error naming the file and line."""
    path = Path(run_dir) / FILENAME
    if not path.is_file():
        raise ConfigError(f"no run ledger at {str(path)!r}: is {str(run_dir)!r} a run folder whose run launched machines?")
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ConfigError(f"run ledger {str(path)!r}: owned by uid {st.st_uid} with mode {st.st_mode & 0o777:o}; "
                          "echo2 fleet acts only on a ledger you own that no one else may write")
    out: dict[str, Machine] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            event, name, provider = rec["event"], rec["machine"], rec["provider"]
        except (ValueError, KeyError, TypeError) as e:
            if i == len(lines):  # a write cut short by a kill: the launch it announced never happened
                break
            raise ConfigError(f"{path}:{i}: not a ledger record ({e}): {line[:120]!r}") from None
        if event not in EVENTS:
            raise ConfigError(f"{path}:{i}: unknown event {event!r} (known: {', '.join(EVENTS)})")
        t = float(rec.get("t", 0.0))
        if event == "launch":
            out[name] = Machine(name, provider, dict(rec.get("handle") or {}), dict(rec.get("spec") or {}),
                                state="launch", launched_at=t, changed_at=t)
        elif name in out:
            m = out[name]
            m.handle.update(rec.get("handle") or {})
            if event != "requested":  # part of the launch: the state stays "launch"
                m.state, m.changed_at, m.reason = event, t, str(rec.get("reason", ""))
    return out


def _hold(run_dir: Path) -> None:
    """Hold RUN_DIR/.fleet.lock for the rest of this process (once per folder; another holder: leave it)."""
    key = str(run_dir.resolve())
    if key in _HELD:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD[key] = fd


def holder(run_dir: str | os.PathLike) -> int | None:
    """The pid of another process that holds RUN_DIR/.fleet.lock (a learner still running), else None."""
    path = Path(run_dir) / LOCK
    if str(Path(run_dir).resolve()) in _HELD or not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        text = os.read(fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else -1
    finally:
        os.close(fd)
    return None
