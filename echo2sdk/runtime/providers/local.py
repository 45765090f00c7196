"""The built-in ``local`` provider: rollout workers as local processes (``echo2 worker``).

Each started worker is ``python -m echo2sdk.cli worker --connect HOST:PORT --id NAME --price P``, with
the shared token in its environment (never on the command line), its output in ``log_dir/NAME.log``,
``nice`` and ``threads`` as for the run's own local workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from echo2sdk.errors import ConfigError

__all__ = ["LocalProvider"]


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
    ):
        if not token:
            raise ConfigError("local provider: a token is required (workers must authenticate)")
        self.connect, self.token = connect, token
        self.log_dir = Path(log_dir)
        self.threads, self.nice = int(threads), int(nice)
        self.python = python or sys.executable
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, price_per_hour: float = 0.0) -> None:
        if name in self.running():
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, ECHO2_TOKEN=self.token, OMP_NUM_THREADS=str(self.threads),
                   MKL_NUM_THREADS=str(self.threads), TOKENIZERS_PARALLELISM="false")
        cmd = [self.python, "-m", "echo2sdk.cli", "worker", "--connect", self.connect, "--id", name,
               "--price", repr(float(price_per_hour)), "--nice", str(self.nice)]
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

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)
