"""The built-in ``local`` provider: rollout workers as local processes (``echo2 worker``).

Each started worker is ``python -m echo2sdk.cli worker --connect HOST:PORT --id NAME --price P`` (`worker_command`,
the command of the run's own local workers too), with the shared token in its environment (never on the command
line), its output appended to ``log_dir/NAME.log``, ``nice``, ``threads``, the plug-ins it may import (``allow``) and
``plaintext`` (run.tls = false). The run's own local workers (rollout.workers) start through this provider too.
``close`` first gives the workers ``grace_s`` to exit on their own (they leave when the coordinator sends its
shutdown), then terminates them. With ``run_dir`` every worker goes into the run ledger (``machines.jsonl``): the
launch before the process starts, its pid and start time after, so ``echo2 fleet down RUN_DIR`` can end a worker the
killed learner left behind, and only that process (a reused pid has another start time).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from echo2sdk.core import checks
from echo2sdk.errors import ConfigError
from echo2sdk.runtime.providers.ledger import Ledger, Machine

__all__ = ["LocalProvider", "worker_command", "worker_env", "process_started"]


def worker_command(
    host: str, port: int, worker_id: str, nice: int | str, allow: Sequence[str] = (), plaintext: bool = False,
    python: str | None = None,
) -> list[str]:
    """The command line of one local rollout worker (the token travels in its environment: ps shows argv).
    `allow`: the "pkg.mod:Attr" plug-ins the run's own config names (workers import no other unregistered name);
    `plaintext`: the coordinator runs without TLS (run.tls = false)."""
    cmd = [python or sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"{host}:{port}", "--id", worker_id]
    cmd += ["--plaintext"] if plaintext else []
    for ref in allow:
        cmd += ["--allow-plugin", ref]
    return cmd + ["--nice", str(nice)]


def worker_env(token: str, threads: int) -> dict[str, str]:
    """The environment of a local rollout worker: the token and its thread counts."""
    env = dict(os.environ, ECHO2_TOKEN=token)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    return env


class LocalProvider:
    def __init__(
        self,
        connect: str,
        token: str,
        *,
        log_dir: str | os.PathLike = ".",
        threads: int = 1,
        nice: int | str = 0,
        python: str | None = None,
        allow: Sequence[str] = (),
        plaintext: bool = False,
        grace_s: float = 0.0,
        run_dir: str | os.PathLike | None = None,
    ):
        if not token:
            raise ConfigError("local provider: a token is required (workers must authenticate)")
        self.connect, self.token = connect, token
        self.log_dir = Path(log_dir)
        self.threads, self.nice = int(threads), checks.nice(nice)
        self.python = python or sys.executable
        self.allow, self.plaintext = tuple(allow), bool(plaintext)
        self.grace_s = float(grace_s)
        self.procs: dict[str, subprocess.Popen] = {}  # name -> process, in the order they were started
        self.ledger = Ledger(run_dir, "local") if run_dir is not None else None
        self._failures: dict[str, str] = {}

    def command(self, name: str, price_per_hour: float = 0.0) -> list[str]:
        host, _, port = self.connect.rpartition(":")
        cmd = worker_command(host, int(port), name, self.nice, self.allow, self.plaintext, self.python)
        return cmd + ["--price", repr(float(price_per_hour))]

    def spec(self, name: str, price_per_hour: float = 0.0) -> dict:
        """The worker's public description (--dry-run): its command and thread count; the token only by name."""
        return {"run": shlex.join(self.command(name, price_per_hour)), "envs": {"OMP_NUM_THREADS": str(self.threads)},
                "secrets": ["ECHO2_TOKEN"]}

    def start(self, name: str, price_per_hour: float = 0.0) -> None:
        if name in self.running():
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = self.command(name, price_per_hour)
        env = worker_env(self.token, self.threads)
        if self.ledger is not None:
            self.ledger.launching(name, {"host": "localhost"}, {"price_per_hour": float(price_per_hour), "run": cmd})
        try:
            with open(self.log_dir / f"{name}.log", "a") as fh:
                p = self.procs[name] = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        except OSError as e:
            self._failures[name] = f"could not start {cmd[0]}: {e}"
            if self.ledger is not None:
                self.ledger.failed(name, self._failures[name])
            return
        if self.ledger is not None:
            self.ledger.up(name, handle={"pid": p.pid, "started": process_started(p.pid)})

    def stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if self.ledger is not None:
            self.ledger.down(name)

    def failures(self) -> dict[str, str]:
        """Workers whose process could not be started, since the last call: name -> reason."""
        out, self._failures = self._failures, {}
        return out

    def running(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def started(self) -> list[str]:
        """Every name started and not stopped, running or exited."""
        return list(self.procs)

    def exited(self) -> list[str]:
        """The started workers whose process has ended on its own."""
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def close(self) -> None:
        """Wait up to grace_s for the workers to exit on their own, then stop the rest."""
        deadline = time.monotonic() + self.grace_s
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        for name in list(self.procs):
            if self.ledger is not None and self.procs[name].poll() is not None:
                self.ledger.down(name)  # exited on its own
                del self.procs[name]
            self.stop(name)

    # ------------------------------------------------------------------ the fleet commands (no learner needed)

    @classmethod
    def fleet_status(cls, machines: list[Machine]) -> dict[str, str]:
        """name -> "running (pid N)" when the recorded process is still that worker, else "gone"."""
        return {m.name: f"running (pid {m.handle['pid']})" if _same_process(m) else "gone" for m in machines}

    @classmethod
    def fleet_down(cls, machines: list[Machine]) -> dict[str, str]:
        """Terminate each recorded worker process that is still the one the run started: name -> "down"."""
        out = {}
        for m in machines:
            if _same_process(m):
                try:
                    os.kill(int(m.handle["pid"]), 15)
                except ProcessLookupError:
                    pass
            out[m.name] = "down"
        deadline = time.monotonic() + 10
        while any(_same_process(m) for m in machines) and time.monotonic() < deadline:
            time.sleep(0.1)
        for m in machines:
            if _same_process(m):
                os.kill(int(m.handle["pid"]), 9)
        return out


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first); None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def process_started(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22); None when unknown."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _same_process(m: Machine) -> bool:
    """The ledger's process is alive and is that worker: same pid and start time, not a zombie, ours (same uid)
    and running `echo2sdk.cli worker ... --id NAME` (a ledger line cannot point fleet down at another process)."""
    pid = m.handle.get("pid")
    if not isinstance(pid, int) or pid <= 1 or not isinstance(m.handle.get("started"), int):
        return False
    proc, fields = Path(f"/proc/{pid}"), _stat(pid)
    if fields is None:
        return False
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        uid = proc.stat().st_uid
    except OSError:
        return False
    worker = b"echo2sdk.cli" in argv and b"worker" in argv and m.name.encode() in argv
    return fields[0] != "Z" and int(fields[19]) == m.handle["started"] and uid == os.getuid() and worker
