"""The built-in ``local`` provider: rollout workers as local processes (``echo2 worker``).

Each started worker is ``python -m echo2sdk.cli worker --connect HOST:PORT --id NAME --price P`` (`worker_command`,
the command of the run's own local workers too), with the shared token in its environment (never on the command
line), its output appended to ``log_dir/NAME.log``, ``nice``, ``threads``, the plug-ins it may import (``allow``) and
``plaintext`` (run.tls = false). The run's own local workers (rollout.workers) start through this provider too.
``close`` first gives the workers ``grace_s`` to exit on their own (they leave when the coordinator sends its
shutdown), then terminates them. With ``run_dir`` every worker goes into the run ledger (``machines.jsonl``): the
launch before the process starts, its pid and start time after, so ``echo2 fleet down RUN_DIR`` can end a worker the
killed learner left behind, and only that process. Pid, start time, owner and command line are readable by anyone
(/proc), so a crafted ledger could name another run's worker with all of them: each worker is also given a random
nonce in its environment (``ECHO2_LEDGER_NONCE``; /proc/PID/environ is readable by its owner alone), the ledger holds
only the nonce's SHA-256, and ``fleet down`` signals a process only when its environment holds the nonce of that digest.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from echo2sdk.core import checks
from echo2sdk.errors import ConfigError
from echo2sdk.runtime.providers.ledger import Ledger, Machine

__all__ = ["LocalProvider", "worker_command", "worker_env", "process_started", "NONCE_ENV"]

NONCE_ENV = "ECHO2_LEDGER_NONCE"  # a local worker's proof of identity for `fleet down`; the ledger holds its digest
TERM_S = 10.0  # fleet down: how long a worker has to end on SIGTERM before SIGKILL
KILL_S = 5.0  # and to end on SIGKILL


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
        nonce = secrets.token_hex(32)
        env = {**worker_env(self.token, self.threads), NONCE_ENV: nonce}
        if self.ledger is not None:
            self.ledger.launching(name, {"host": "localhost", "nonce_sha256": _digest(nonce.encode())},
                                  {"price_per_hour": float(price_per_hour), "run": cmd})
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
        """name -> "running (pid N)" when the recorded process is provably that worker (:func:`_check`), "gone" when
        it no longer runs, "unverified (pid N): WHY" when a process runs under its pid and start time that is not
        provably it, "unknown: WHY" when no pid was recorded."""
        out = {}
        for m in machines:
            verdict, why = _check(m)
            pid = m.handle.get("pid")
            out[m.name] = {"ours": f"running (pid {pid})", "gone": "gone", "unknown": f"unknown: {why}"}.get(
                verdict, f"unverified (pid {pid}): {why}")
        return out

    @classmethod
    def fleet_down(cls, machines: list[Machine]) -> dict[str, str]:
        """SIGTERM each recorded worker process that is provably the one the run started (:func:`_check`), SIGKILL
        it after TERM_S. name -> "down" (it ended on SIGTERM), "killed" (it ended on SIGKILL), "gone" (it no longer
        ran: not signalled), or "refused ...", "unknown ..." or "failed ..." saying why it was not ended."""
        out: dict[str, str] = {}
        sent: list[Machine] = []
        for m in machines:
            verdict, why = _check(m)
            if verdict == "ours" and _signal(m, signal.SIGTERM):
                sent.append(m)
            elif verdict in ("ours", "gone"):
                out[m.name] = "gone"
            elif verdict == "unknown":
                out[m.name] = f"unknown: {why}; not signalled"
            else:
                out[m.name] = f"refused (pid {m.handle['pid']}): {why}; not signalled"
        _wait_ended(sent, TERM_S)
        killed = [m for m in sent if _signal(m, signal.SIGKILL)]
        _wait_ended(killed, KILL_S)
        for m in sent:
            if m not in killed:
                out[m.name] = "down"
            else:
                out[m.name] = "failed: still running after SIGKILL" if _running(m) else "killed"
        return out


def _digest(nonce: bytes) -> str:
    return hashlib.sha256(nonce).hexdigest()


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


def _running(m: Machine) -> bool:
    """A process with the recorded pid and start time runs (not a zombie): the same process, whatever it is."""
    fields = _stat(m.handle["pid"])
    return fields is not None and fields[0] != "Z" and int(fields[19]) == m.handle["started"]


def _signal(m: Machine, sig: int) -> bool:
    """Send `sig` to the recorded process if it still runs; False when it had ended."""
    if not _running(m):
        return False
    try:
        os.kill(m.handle["pid"], sig)
    except ProcessLookupError:
        return False
    return True


def _wait_ended(machines: list[Machine], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(_running(m) for m in machines) and time.monotonic() < deadline:
        time.sleep(0.1)


def _check(m: Machine) -> tuple[str, str]:
    """Whether the ledger's process is the worker this run started: ("ours", ""), ("gone", "") when no process runs
    with its pid and start time (it ended, or never started), ("unknown", why) when no pid was recorded, or
    ("foreign", why) when a process runs with them that is not provably that worker.

    Ours means: same pid and start time, not a zombie, same uid, running `echo2sdk.cli worker ... --id NAME`, and
    its environment holds the ECHO2_LEDGER_NONCE whose SHA-256 the ledger recorded. All but the nonce are readable
    by anyone from /proc, so a crafted ledger could match them; /proc/PID/environ is readable by the owner alone.
    An entry without the digest (a ledger of an older echo2) is never taken as ours."""
    pid, started = m.handle.get("pid"), m.handle.get("started")
    if m.state == "failed":
        return "gone", ""
    if not isinstance(pid, int) or pid <= 1 or not isinstance(started, int):
        return "unknown", "no pid recorded (the learner may have stopped while starting it)"
    if not _running(m):
        return "gone", ""
    proc = Path(f"/proc/{pid}")
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        uid = proc.stat().st_uid
    except OSError:
        return "gone", ""
    if uid != os.getuid():
        return "foreign", f"it belongs to uid {uid}"
    if not (b"echo2sdk.cli" in argv and b"worker" in argv and m.name.encode() in argv):
        return "foreign", f"its command line is not that of worker {m.name!r}"
    digest = m.handle.get("nonce_sha256")
    if not isinstance(digest, str):
        return "foreign", f"no nonce digest in the ledger (an older echo2 wrote it): end pid {pid} by hand if yours"
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError as e:
        return "foreign", f"its environment cannot be read ({e.strerror})"
    prefix = NONCE_ENV.encode() + b"="
    nonce = next((v[len(prefix):] for v in environ if v.startswith(prefix)), None)
    if nonce is None or not hmac.compare_digest(_digest(nonce).encode(), digest.encode()):
        return "foreign", f"its {NONCE_ENV} does not match the ledger's digest"
    return "ours", ""
