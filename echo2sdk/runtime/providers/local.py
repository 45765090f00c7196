"""The built-in ``local`` provider: rollout workers as local processes (``echo2 worker``).

Each started worker is ``python -m echo2sdk.cli worker --connect HOST:PORT --id NAME --price P`` (`worker_command`,
the command of the run's own local workers too), with the shared token in its environment (never on the command
line), its output appended to ``log_dir/NAME.log``, ``nice``, ``threads``, the plug-ins it may import (``allow``) and
``plaintext`` (run.tls = false). The run's own local workers (rollout.workers) start through this provider too.
``close`` first gives the workers ``grace_s`` to exit on their own (they leave when the coordinator sends its
shutdown), then terminates them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from echo2sdk.errors import ConfigError

__all__ = ["LocalProvider", "worker_command", "worker_env"]


def worker_command(
    host: str, port: int, worker_id: str, nice: int, allow: Sequence[str] = (), plaintext: bool = False,
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
        nice: int = 0,
        python: str | None = None,
        allow: Sequence[str] = (),
        plaintext: bool = False,
        grace_s: float = 0.0,
    ):
        if not token:
            raise ConfigError("local provider: a token is required (workers must authenticate)")
        self.connect, self.token = connect, token
        self.log_dir = Path(log_dir)
        self.threads, self.nice = int(threads), int(nice)
        self.python = python or sys.executable
        self.allow, self.plaintext = tuple(allow), bool(plaintext)
        self.grace_s = float(grace_s)
        self.procs: dict[str, subprocess.Popen] = {}  # name -> process, in the order they were started

    def start(self, name: str, price_per_hour: float = 0.0) -> None:
        if name in self.running():
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        host, _, port = self.connect.rpartition(":")
        cmd = worker_command(host, int(port), name, self.nice, self.allow, self.plaintext, self.python)
        cmd += ["--price", repr(float(price_per_hour))]
        env = worker_env(self.token, self.threads)
        with open(self.log_dir / f"{name}.log", "a") as fh:
            self.procs[name] = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)

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
            self.stop(name)
