"""A recording fake of the SkyPilot SDK calls the skypilot provider makes (no cloud is reachable from CI).

It implements exactly what echo2sdk.runtime.providers.skypilot uses: ``Task``, ``Resources``, ``launch``,
``down``, ``status``, ``get``, ``api_cancel`` and ``ClusterDoesNotExist``, with SkyPilot 0.14's client-server
shape (every call returns a request id, ``get`` waits for it). Its clusters live in a folder (``clusters.json``,
``calls.jsonl``) so that several processes see the same fleet: a learner that launches and is killed, then
``echo2 fleet down`` in another process. Knobs (``config.json`` in the folder, or ``FakeSky(..., **knobs)``):

- ``launch_s``: seconds a launch takes (the cluster is INIT meanwhile, then UP);
- ``submit_s``: seconds ``launch`` takes to return its request id; ``record_s``: seconds into the launch before
  the cluster exists (SkyPilot writes its record after the optimizer: a ``down`` before then finds nothing);
- ``fail``: regexes of worker names (the cluster name without its ``e2-XXXXXX-`` prefix) whose launch fails
  (after ``launch_s``), as a cloud out of capacity does;
- ``hang``: regexes of worker names whose launch never finishes (until cancelled);
- ``exec``: run the task's ``run`` command as a real local process in its own session (envs and secrets in its
  environment, never written down), so an echo2 worker really joins; ``down`` and ``preempt`` kill it.

Secrets are recorded by name only, as SkyPilot redacts them. ``FakeSky.preempt(name)`` ends a cluster as a spot
preemption does. In a subprocess, a ``sky`` package that re-exports a FakeSky on FAKE_SKY_DIR stands in for the
real one (``shim``).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class ClusterDoesNotExist(ValueError):
    pass


class StatusRefreshMode:
    NONE, AUTO, FORCE = "NONE", "AUTO", "FORCE"


class Resources:
    def __init__(self, **kw: Any):
        self.kw = kw


class Task:
    def __init__(self, name: str | None = None, *, setup: str | None = None, run: str | None = None,
                 envs: dict | None = None, secrets: dict | None = None, **kw: Any):
        self.name, self.setup, self.run = name, setup, run
        self.envs, self.secrets, self.kw = dict(envs or {}), dict(secrets or {}), kw
        self.resources: Resources | None = None

    def set_resources(self, r: Resources) -> Task:
        self.resources = r
        return self

    def record(self) -> dict[str, Any]:
        """What the fake writes down: everything but the secrets' values."""
        return {"name": self.name, "setup": self.setup, "run": self.run, "envs": self.envs,
                "secrets": sorted(self.secrets), "resources": self.resources.kw if self.resources else None}


class FakeSky:
    def __init__(self, folder: str | os.PathLike, **knobs: Any):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        if knobs:
            (self.dir / "config.json").write_text(json.dumps(knobs))
        self.Task, self.Resources, self.ClusterDoesNotExist = Task, Resources, ClusterDoesNotExist
        self.StatusRefreshMode = StatusRefreshMode
        self._ids = itertools.count(1)
        self._requests: dict[str, threading.Thread | Any] = {}
        self._results: dict[str, Any] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ shared state

    @property
    def knobs(self) -> dict[str, Any]:
        p = self.dir / "config.json"
        return json.loads(p.read_text()) if p.is_file() else {}

    @contextmanager
    def _clusters(self):
        with open(self.dir / "clusters.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.dir / "clusters.json"
            clusters = json.loads(path.read_text()) if path.is_file() else {}
            yield clusters
            path.write_text(json.dumps(clusters))

    def clusters(self) -> dict[str, dict[str, Any]]:
        with self._clusters() as c:
            return dict(c)

    def _record(self, call: str, **data: Any) -> None:
        with open(self.dir / "calls.jsonl", "a") as fh:
            fh.write(json.dumps({"t": time.time(), "pid": os.getpid(), "call": call, **data}) + "\n")

    def calls(self, call: str | None = None) -> list[dict[str, Any]]:
        p = self.dir / "calls.jsonl"
        rows = [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []
        return [r for r in rows if call is None or r["call"] == call]

    # ------------------------------------------------------------------ requests

    def _submit(self, fn: Any, *args: Any) -> str:
        rid = f"req-{os.getpid()}-{next(self._ids)}"

        def run() -> None:
            try:
                self._results[rid] = ("ok", fn(rid, *args))
            except BaseException as e:  # noqa: BLE001
                self._results[rid] = ("error", e)

        th = threading.Thread(target=run, daemon=True)
        self._requests[rid] = th
        th.start()
        return rid

    def get(self, request_id: str) -> Any:
        self._requests[request_id].join()
        kind, value = self._results.pop(request_id)
        if kind == "error":
            raise value
        return value

    def api_cancel(self, request_ids: Any = None, **kw: Any) -> str:
        ids = request_ids if isinstance(request_ids, list) else [request_ids]
        self._record("api_cancel", requests=ids)
        self._cancelled.update(ids)
        return self._submit(lambda rid: ids)

    # ------------------------------------------------------------------ the SDK calls

    def launch(self, task: Task, cluster_name: str | None = None, **kw: Any) -> str:
        self._record("launch", cluster=cluster_name, options=kw, task=task.record())
        rid = self._submit(self._launch, task, cluster_name)
        time.sleep(float(self.knobs.get("submit_s", 0.0)))
        return rid

    def _launch(self, rid: str, task: Task, name: str) -> None:
        knobs = self.knobs
        worker = re.sub(r"^e2-[0-9a-f]{6}-", "", name)
        hang = any(re.search(p, worker) for p in knobs.get("hang", []))
        start, record_s = time.monotonic(), float(knobs.get("record_s", 0.0))
        deadline = start + (float("inf") if hang else float(knobs.get("launch_s", 0.0)))
        recorded = False
        while not recorded or time.monotonic() < deadline:
            if rid in self._cancelled:
                raise RuntimeError(f"request {rid} cancelled")
            if not recorded and time.monotonic() - start >= record_s:
                with self._clusters() as c:
                    c[name] = {"status": "INIT", "pid": None, "launched_at": time.time()}
                recorded = True
            time.sleep(0.02)
        if any(re.search(p, worker) for p in knobs.get("fail", [])):
            raise RuntimeError(f"ResourcesUnavailableError: no capacity for {name} in any region (fake)")
        pid = None
        if knobs.get("exec"):
            env = dict(os.environ, **task.envs, **task.secrets)
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
            log = open(self.dir / f"{name}.log", "a")
            pid = subprocess.Popen(["bash", "-c", task.run or "true"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True).pid
        with self._clusters() as c:
            if name not in c:  # downed while launching
                if pid:
                    _kill(pid)
                raise RuntimeError(f"cluster {name} was torn down during its launch")
            c[name] = {**c[name], "status": "UP", "pid": pid}

    def status(self, cluster_names: list[str] | None = None, refresh: str = "NONE", **kw: Any) -> str:
        self._record("status", clusters=cluster_names, refresh=refresh)

        def listing(rid: str) -> list[dict[str, Any]]:
            c = self.clusters()
            return [{"name": n, "status": s["status"]} for n, s in c.items() if cluster_names is None or n in cluster_names]

        return self._submit(listing)

    def down(self, cluster_name: str, **kw: Any) -> str:
        self._record("down", cluster=cluster_name)
        return self._submit(self._down, cluster_name)

    def _down(self, rid: str, name: str) -> None:
        with self._clusters() as c:
            info = c.pop(name, None)
        if info is None:
            raise ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if info.get("pid"):
            _kill(info["pid"])

    def preempt(self, name: str) -> None:
        """End a cluster as a spot preemption does: its machine is gone, nobody asked."""
        self._record("preempt", cluster=name)
        with self._clusters() as c:
            info = c.pop(name, None)
        if info and info.get("pid"):
            _kill(info["pid"])


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


SHIM = '''"""A stand-in for the sky package: a FakeSky on $FAKE_SKY_DIR (tests/runtime/providers/fake_sky.py)."""
import os, sys
sys.path.insert(0, {here!r})
from fake_sky import FakeSky, ClusterDoesNotExist
_fake = FakeSky(os.environ["FAKE_SKY_DIR"])
Task, Resources, StatusRefreshMode = _fake.Task, _fake.Resources, _fake.StatusRefreshMode
launch, down, status, get, api_cancel, preempt = _fake.launch, _fake.down, _fake.status, _fake.get, _fake.api_cancel, _fake.preempt
'''


def shim(folder: str | os.PathLike) -> Path:
    """Write a ``sky`` package into `folder` (put it first on PYTHONPATH of a subprocess); returns `folder`."""
    pkg = Path(folder) / "sky"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(SHIM.format(here=str(Path(__file__).parent)))
    return Path(folder)
