"""The ``skypilot`` provider: one SkyPilot cluster per rollout worker, on any cloud, marketplace or Kubernetes.

Install with ``pip install 'echo2sdk[skypilot]'`` and configure the clouds with ``sky check``
(docs/provisioning.md). For worker ``NAME`` of machine type ``TYPE`` (worker ids are ``TYPE-0``, ``TYPE-1``, ...,
from ``[[scheduler.machines]]``) it launches cluster ``NAME``: a ``sky.Task`` whose ``setup`` installs echo2sdk and
whose ``run`` is ``echo2 worker --connect HOST:PORT --id NAME --price P --relay-port N --bootstrap`` (the machine
takes the model from the coordinator), on ``sky.Resources`` built from the type's ``resources`` (accelerators,
infra, region, use_spot, disk_size, ...) with the relay port opened (``ports``). The secret travels as a SkyPilot
*secret* (an environment variable SkyPilot redacts), never in argv, the setup script or a log: by default each
machine gets only its own worker credential (``ECHO2_CREDENTIAL``, ``echo2 keys worker NAME``), not the run token.
``autostop_minutes`` (with ``down``) is the safety net: a cluster idle that long after its worker left is torn down
by SkyPilot itself.

Launches and downs run on background threads and never block the training loop: ``start`` writes the run ledger
(:mod:`echo2sdk.runtime.providers.ledger`) and returns. A launch that raises or has not finished after
``launch_timeout_s`` is reported by :meth:`failures` (the live loop hands it to the scheduler, which retries on the
next-cheapest type) and its cluster is torn down. ``close`` downs every cluster the run started; what it cannot
confirm is left in the ledger for ``echo2 fleet down RUN_DIR``.

SkyPilot (0.14) is client-server: each SDK call returns a request id and ``sky.get(id)`` waits for its result. This
module only uses ``Task``, ``Resources``, ``launch``, ``down``, ``status``, ``get`` and ``api_cancel``; tests drive
it with a recording fake of exactly those (tests/runtime/providers/fake_sky.py).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from echo2sdk.errors import ConfigError, DependencyNotInstalled
from echo2sdk.runtime.providers.ledger import Ledger, Machine

__all__ = ["SkyPilotProvider", "RESOURCE_KEYS", "machine_type"]

log = logging.getLogger("echo2sdk.providers.skypilot")

NAME = "skypilot"
# sky.Resources keywords a machine type may set (the relay port is added; autostop comes from the provider)
RESOURCE_KEYS = ("accelerators", "infra", "region", "zone", "instance_type", "cpus", "memory", "use_spot", "disk_size",
                 "disk_tier", "network_tier", "image_id", "labels", "any_of")
RELAY_PORT = 7420
UP = ("UP", "INIT")  # sky.status states of a cluster that exists
CLUSTER = re.compile(r"e2-[0-9a-f]{6}-[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what cluster() makes
BACKEND_EXTRAS = {"hf": "hf", "vllm": "vllm", "sglang": "sglang", "openai": "openai"}
WHEEL_DIR = "/tmp/echo2-wheels"  # where `wheels` land on the machine (file_mounts)
FLEET_DOWN_S = 900.0  # `echo2 fleet down` waits this long for SkyPilot to confirm


def machine_type(name: str) -> str:
    """The machine type of worker `name` ("l4-3" -> "l4"; a name without an index is its own type)."""
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


def _import_sky() -> Any:
    try:
        import sky
    except ImportError:
        raise DependencyNotInstalled("skypilot (the skypilot provider's SkyPilot)", "skypilot") from None
    return sky


class SkyPilotProvider:
    """See the module docstring. `machines`: machine type -> its sky.Resources keywords; `connect`: the learner's
    address as the workers reach it; `token`: the run token (each machine gets a credential derived from it);
    `backend`: the run's rollout backend (the extra the setup installs)."""

    def __init__(
        self,
        connect: str,
        token: str = "",
        *,
        machines: dict[str, dict[str, Any]] | None = None,
        run_dir: str = ".",
        backend: str = "hf",
        setup: str | None = None,
        packages: Sequence[str] = (),
        wheels: Sequence[str] = (),
        secret: str = "credential",
        secret_envs: Sequence[str] = (),
        allow: Sequence[str] = (),
        plaintext: bool = False,
        relay_port: int = RELAY_PORT,
        bootstrap: bool = True,
        envs: dict[str, str] | None = None,
        autostop_minutes: int = 10,
        launch_timeout_s: float = 1800.0,
        down_timeout_s: float = 600.0,
        sky: Any = None,
    ):
        host, _, port = str(connect).rpartition(":")
        if not host or not port.isdigit() or host in ("0.0.0.0", "::", "[::]"):
            raise ConfigError(f"provider 'skypilot': connect = {connect!r}: give the learner's address as the rented "
                              "machines reach it, HOST:PORT (scheduler.provider_options.connect, with a fixed run.port)")
        if int(port) == 0:
            raise ConfigError(f"provider 'skypilot': connect = {connect!r}: the port is 0; set run.port to a fixed port")
        if secret not in ("credential", "token"):
            raise ConfigError(f"provider 'skypilot': secret = {secret!r}: 'credential' (each machine gets its own "
                              "worker credential) or 'token' (the run token)")
        if int(autostop_minutes) < 1:
            raise ConfigError(f"provider 'skypilot': autostop_minutes = {autostop_minutes!r}: at least 1 (the safety "
                              "net that downs a cluster whose worker is gone)")
        if missing := [n for n in secret_envs if n not in os.environ]:
            raise ConfigError(f"provider 'skypilot': secret_envs {missing} are not set in the learner's environment")
        self.machines = {t: self._resources(t, r) for t, r in (machines or {}).items()}
        self.connect, self.token, self.secret = str(connect), token, secret
        self.backend, self.setup, self.packages = str(backend), setup, tuple(packages)
        self.wheels = _wheel_files(wheels)
        self.secret_envs = {n: os.environ[n] for n in secret_envs}  # passed as SkyPilot secrets, named nowhere else
        self.allow, self.plaintext, self.relay_port, self.bootstrap = tuple(allow), bool(plaintext), int(relay_port), bootstrap
        self.envs = {str(k): str(v) for k, v in (envs or {}).items()}
        if clash := sorted(set(self.envs) & (set(self.secret_envs) | {"ECHO2_TOKEN", "ECHO2_CREDENTIAL"})):
            raise ConfigError(f"provider 'skypilot': envs {clash} are secrets: name them in secret_envs, not envs")
        self.autostop_minutes = int(autostop_minutes)
        self.launch_timeout_s, self.down_timeout_s = float(launch_timeout_s), float(down_timeout_s)
        self.ledger = Ledger(run_dir, NAME)
        self.prefix = f"e2-{os.urandom(3).hex()}-"  # cluster names of this learner: e2-RUN-WORKER, unique per run
        self._sky = sky
        self._lock = threading.Lock()
        self._state: dict[str, str] = {}  # name -> launching | up | failed | stopping | down
        self._since: dict[str, float] = {}  # name -> when its launch began (monotonic)
        self._requests: dict[str, Any] = {}  # name -> the running launch's request id
        self._failures: dict[str, str] = {}  # failed launches not yet reported by failures()
        self._restart: dict[str, float] = {}  # started again while its last cluster was going down: name -> price
        self._threads: dict[str, threading.Thread] = {}  # name -> the thread that owns its cluster now
        self._closed = False

    @staticmethod
    def _resources(kind: str, resources: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(resources, dict):
            raise ConfigError(f"machine type {kind!r}: resources = {resources!r} is not a table")
        if "ports" in resources:
            raise ConfigError(f"machine type {kind!r}: ports are the provider's (relay_port)")
        if unknown := sorted(set(resources) - set(RESOURCE_KEYS)):
            hint = " (give the cloud as infra = \"aws\" or \"aws/us-east-1\")" if "cloud" in unknown else ""
            raise ConfigError(f"machine type {kind!r}: unknown resources {unknown}{hint}; known: {', '.join(RESOURCE_KEYS)}")
        return dict(resources)

    @property
    def sky(self) -> Any:
        if self._sky is None:
            self._sky = _import_sky()
        return self._sky

    def cluster(self, name: str) -> str:
        """The SkyPilot cluster of worker `name` (this learner's prefix: a rerun or a teammate never shares one)."""
        return self.prefix + name

    # ------------------------------------------------------------------ what a launch is

    def command(self, name: str, price_per_hour: float) -> list[str]:
        """The worker's command line on the rented machine (no secret in it: ps shows argv)."""
        host, _, port = self.connect.rpartition(":")
        cmd = ["echo2", "worker", "--connect", f"{host}:{port}", "--id", name, "--price", repr(float(price_per_hour)),
               "--relay-port", str(self.relay_port)]
        cmd += ["--bootstrap"] if self.bootstrap else []
        cmd += ["--plaintext"] if self.plaintext else []
        for ref in self.allow:
            cmd += ["--allow-plugin", ref]
        return cmd

    def setup_script(self) -> str:
        """What runs once on a new machine before the worker: the `setup` option, else pip installs torch (the
        platform's default build: CUDA on a GPU machine), echo2sdk with the run's backend extra (from `wheels`
        uploaded with the task, else from the index at this version) and `packages`."""
        if self.setup is not None:
            return self.setup
        extra = BACKEND_EXTRAS.get(self.backend, "hf")
        if self.wheels:
            own = [f"{WHEEL_DIR}/{w.name}" for w in self.wheels]
            echo2 = next((f"{w}[{extra}]" for w in own if Path(w).name.startswith("echo2sdk-")), f"echo2sdk[{extra}]")
            pkgs = [echo2, *(w for w in own if not Path(w).name.startswith("echo2sdk-")), *self.packages]
        else:
            from importlib.metadata import PackageNotFoundError, version

            try:
                v = version("echo2sdk")
            except PackageNotFoundError:  # a source tree that is not installed
                from echo2sdk import __version__ as v
            pkgs = [f"echo2sdk[{extra}]=={v}", *self.packages]
        return "pip install torch && pip install " + " ".join(shlex.quote(p) for p in pkgs)

    def _secrets(self, name: str) -> dict[str, str]:
        if not self.token:
            raise ConfigError(f"provider 'skypilot': no run token to give worker {name!r}")
        if self.secret == "token":
            return {"ECHO2_TOKEN": self.token, **self.secret_envs}
        from echo2sdk.runtime.trust.worker_keys import issue

        return {"ECHO2_CREDENTIAL": str(issue(self.token, name)), **self.secret_envs}

    def resources_for(self, name: str) -> dict[str, Any]:
        kind = machine_type(name)
        if kind not in self.machines:
            raise ConfigError(f"provider 'skypilot': worker {name!r} is of machine type {kind!r}, not among "
                              f"[[scheduler.machines]] ({sorted(self.machines)})")
        return {**self.machines[kind], "ports": [self.relay_port]}

    def spec(self, name: str, price_per_hour: float) -> dict[str, Any]:
        """The launch's public description (the ledger's and --dry-run's): no secret, only secret names."""
        return {"cluster": self.cluster(name), "type": machine_type(name), "price_per_hour": float(price_per_hour),
                "resources": self.resources_for(name), "setup": self.setup_script(),
                "run": shlex.join(self.command(name, price_per_hour)), "envs": dict(self.envs),
                "files": [f"{WHEEL_DIR}/{w.name}" for w in self.wheels],
                "secrets": ["ECHO2_TOKEN" if self.secret == "token" else "ECHO2_CREDENTIAL", *self.secret_envs],
                "autostop": {"idle_minutes": self.autostop_minutes, "down": True}}

    def task(self, name: str, price_per_hour: float) -> Any:
        """The sky.Task of worker `name`, built with the installed SkyPilot, which validates it (an invalid
        resource is a ConfigError naming the machine type)."""
        sky = self.sky
        try:
            t = sky.Task(name=name, setup=self.setup_script(), run=shlex.join(self.command(name, price_per_hour)),
                         envs=dict(self.envs), secrets=self._secrets(name),
                         file_mounts={f"{WHEEL_DIR}/{w.name}": str(w) for w in self.wheels} or None)
            t.set_resources(sky.Resources(**self.resources_for(name)))
        except (ValueError, TypeError) as e:
            raise ConfigError(f"machine type {machine_type(name)!r}: SkyPilot refused its resources: "
                              f"{type(e).__name__}: {self._clean(str(e))}") from None
        return t

    def _clean(self, text: str) -> str:
        """`text` with every secret value this provider holds replaced (errors go to the ledger and the logs)."""
        for value in (self.token, *self.secret_envs.values()):
            if value:
                text = text.replace(value, "<secret>")
        return text

    # ------------------------------------------------------------------ the Provider methods

    def start(self, name: str, price_per_hour: float = 0.0) -> None:
        """Launch worker `name`'s cluster in the background (no-op while it is launching or up; after its
        cluster is confirmed down when that is under way)."""
        with self._lock:
            if self._closed:
                log.warning("provider closed: not launching %s", name)
                return
            state = self._state.get(name)
            if state in ("launching", "up"):
                return
            if name in self._threads and self._threads[name].is_alive():  # its last cluster is still going down
                self._restart[name] = price_per_hour
                return
        task = self.task(name, price_per_hour)  # errors in the config surface here, in the caller
        with self._lock:
            if self._closed or self._state.get(name) in ("launching", "up") or (
                    name in self._threads and self._threads[name].is_alive()):
                return  # another start() of the same name got here first
            self.ledger.launching(name, {"cluster": self.cluster(name)}, self.spec(name, price_per_hour))
            self._state[name], self._since[name] = "launching", time.monotonic()
            self._failures.pop(name, None)
            self._own(name, self._launch, name, task)

    def _own(self, name: str, fn: Any, *args: Any) -> None:
        """Under self._lock: run `fn` on a daemon thread that owns `name`'s cluster until it returns (one at a
        time: a launch tears down what it started; a down runs only where no launch is under way)."""
        th = threading.Thread(target=fn, args=args, name=f"echo2-sky-{fn.__name__}-{name}", daemon=True)
        self._threads[name] = th
        th.start()

    def _launch(self, name: str, task: Any) -> None:
        sky, cluster = self.sky, self.cluster(name)
        t0, request, error = time.monotonic(), None, ""
        try:
            request = sky.launch(task, cluster_name=cluster, idle_minutes_to_autostop=self.autostop_minutes, down=True)
            self.ledger.requested(name, str(request))  # `echo2 fleet down` cancels it if the learner dies now
            with self._lock:
                self._requests[name] = request
                go_on = self._state.get(name) == "launching"
            if go_on:
                sky.get(request)
        except Exception as e:  # noqa: BLE001 - any SkyPilot failure is a failed launch, reported
            error = f"launch failed after {time.monotonic() - t0:.0f} s: {type(e).__name__}: {self._clean(str(e))}"
        with self._lock:
            self._requests.pop(name, None)
            ok = not error and self._state.get(name) == "launching"
            if ok:
                self._state[name] = "up"
        if ok:
            self.ledger.up(name, launch_s=round(time.monotonic() - t0, 1))
            log.info("cluster %s up after %.0f s", cluster, time.monotonic() - t0)
            self._next(name)
            return
        if error:
            self._fail(name, error)
        self._teardown(name, request)  # failed, timed out or stopped while launching: leave nothing behind

    def _fail(self, name: str, reason: str) -> None:
        with self._lock:
            if self._state.get(name) != "launching":
                return
            self._state[name] = "failed"
            self._failures[name] = reason
        log.warning("worker %s: %s; tearing its cluster down", name, reason)
        self.ledger.failed(name, reason)

    def _teardown(self, name: str, request: Any = None) -> None:
        """End `name`'s cluster: its launch request ended first (_end_request), then sky.down."""
        if request is not None:
            _end_request(self.sky, request)
        error = _down(self.sky, self.cluster(name))
        if error is not None:
            log.warning("sky.down(%r) failed: %s; run `echo2 fleet down %s`", self.cluster(name),
                        self._clean(str(error)), self.ledger.path.parent)
            with self._lock:
                self._state[name] = "failed"  # close() tries again; the ledger still names it
            self._next(name)
            return
        with self._lock:
            self._state[name] = "down"
        self.ledger.down(name)
        self._next(name)

    def _next(self, name: str) -> None:
        """A start() that came while the cluster was going down: launch it now."""
        with self._lock:
            price = self._restart.pop(name, None)
            self._threads.pop(name, None)
        if price is not None and self._state.get(name) == "down":
            self.start(name, price)

    def stop(self, name: str) -> None:
        """End worker `name`'s cluster in the background (no-op when it is not ours or already going). A launch
        under way is cancelled; its thread then tears down what it started."""
        with self._lock:
            self._restart.pop(name, None)
            state = self._state.get(name)
            if state not in ("launching", "up", "failed"):
                return
            self._state[name] = "stopping"
            request = self._requests.get(name)
            owner = self._threads.get(name)
            if owner is None or not owner.is_alive():
                self._own(name, self._teardown, name)
                return
        if state == "launching" and request is not None:
            self._cancel_soon(request)

    def _cancel_soon(self, request: Any) -> None:
        """Cancel a launch request on a thread of its own: the launch thread's sky.get returns, and it tears
        down what it started."""
        sky = self.sky
        threading.Thread(target=_quietly, args=(lambda: sky.get(sky.api_cancel(request)),), daemon=True).start()

    def failures(self) -> dict[str, str]:
        """Launches that failed or timed out since the last call: worker -> reason (the live loop reads this)."""
        now = time.monotonic()
        with self._lock:
            late = [n for n, s in self._state.items() if s == "launching" and now - self._since[n] > self.launch_timeout_s]
        for n in late:
            request = self._requests.get(n)
            self._fail(n, f"not up after launch_timeout_s = {self.launch_timeout_s:g} s")
            if request is not None:
                self._cancel_soon(request)
        with self._lock:
            out, self._failures = self._failures, {}
        return out

    def running(self) -> list[str]:
        """The workers whose cluster SkyPilot reports as UP or INIT (one sky.status call), plus those whose launch
        has not yet created one. A cluster of ours that is gone is reported by failures() (preempted)."""
        with self._lock:
            ours = [n for n, s in self._state.items() if s in ("launching", "up")]
        if not ours:
            return []
        listed = _listing(self.sky, [self.cluster(n) for n in ours])
        now = {n: listed[self.cluster(n)] for n in ours}
        alive = [n for n in ours if now[n] in UP]
        with self._lock:
            for n in ours:
                if self._state.get(n) == "up" and now[n] not in UP:
                    self._state[n] = "failed"
                    self._failures[n] = f"cluster {now[n]} (preempted or ended outside the run)"
        return alive + [n for n in ours if n not in alive and self._state.get(n) == "launching"]

    def close(self) -> None:
        """End every cluster this run started (launches under way are cancelled) and wait up to down_timeout_s
        for SkyPilot to confirm; what is not confirmed stays in the ledger for `echo2 fleet down`."""
        with self._lock:
            self._closed = True
            names = [n for n, s in self._state.items() if s in ("launching", "up", "failed")]
        for n in names:
            self.stop(n)
        deadline = time.monotonic() + self.down_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                owners = [t for t in self._threads.values() if t.is_alive()]
            if not owners:
                break
            owners[0].join(min(1.0, max(0.0, deadline - time.monotonic())))
        with self._lock:
            left = [n for n, s in self._state.items() if s != "down"]
        if left:
            log.warning("clusters not confirmed down: %s; run `echo2 fleet down %s`", left, self.ledger.path.parent)

    # ------------------------------------------------------------------ the fleet commands (no learner needed)

    @classmethod
    def fleet_status(cls, machines: Iterable[Machine], sky: Any = None) -> dict[str, str]:
        """What SkyPilot says of each recorded cluster now: name -> its status, or "gone"."""
        sky = sky or _import_sky()
        names = [str(m.handle.get("cluster", "")) for m in machines]
        return _listing(sky, [n for n in names if CLUSTER.fullmatch(n)])

    @classmethod
    def fleet_down(cls, machines: Iterable[Machine], sky: Any = None) -> dict[str, str]:
        """sky.down every recorded cluster in parallel: name -> "down" or the error."""
        sky = sky or _import_sky()
        out: dict[str, str] = {}

        def down(cluster: str, request: str | None) -> None:
            if request:  # a launch the killed learner left running on the API server: end it first
                _end_request(sky, request)
            error = _down(sky, cluster)
            out[cluster] = "down" if error is None else f"failed: {type(error).__name__}: {error}"

        threads = []
        for m in machines:
            cluster = str(m.handle.get("cluster", ""))
            if not CLUSTER.fullmatch(cluster):
                out[cluster or m.name] = f"refused: {cluster!r} is not a cluster name this provider makes (e2-XXXXXX-NAME)"
                continue
            request = m.handle.get("request")
            threads.append(threading.Thread(target=down, args=(cluster, str(request) if request else None), daemon=True))
        for th in threads:
            th.start()
        deadline = time.monotonic() + FLEET_DOWN_S
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        return out


def _quietly(call: Any) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - cancelled, finished, failed or unknown: the request is over either way
        pass


def _end_request(sky: Any, request: Any) -> None:
    """Cancel a launch request and wait for it to end (SkyPilot writes the cluster's record during the launch:
    a down before the request is over finds nothing while the launch goes on)."""
    _quietly(lambda: sky.get(sky.api_cancel(request)))
    _quietly(lambda: sky.get(request))


def _down(sky: Any, cluster: str) -> Exception | None:
    """sky.down `cluster`; None once it is down (or never existed), else the error."""
    try:
        sky.get(sky.down(cluster))
    except Exception as e:  # noqa: BLE001
        return None if _gone(e) else e
    return None


def _listing(sky: Any, clusters: list[str]) -> dict[str, str]:
    """One sky.status call: each of `clusters` -> its status, or "gone". It asks the clouds about spot and
    autostop clusters (ours are both), not SkyPilot's cached state."""
    if not clusters:
        return {}
    listed = sky.get(sky.status(cluster_names=clusters, refresh=sky.StatusRefreshMode.AUTO))
    found = {str(r["name"]): _status(r) for r in listed}
    return {c: found.get(c, "gone") for c in clusters}


def _status(record: Any) -> str:
    s = record["status"] if isinstance(record, dict) else getattr(record, "status", None)
    return str(getattr(s, "value", s) or "gone")


def _gone(e: Exception) -> bool:
    """sky.down of a cluster that does not exist (sky.exceptions.ClusterDoesNotExist): it is down."""
    return type(e).__name__ == "ClusterDoesNotExist"


def _wheel_files(wheels: Sequence[str]) -> list[Path]:
    """The .whl files named by `wheels` (files, or folders holding them), checked now."""
    out: list[Path] = []
    for w in wheels:
        p = Path(w).expanduser()
        found = sorted(p.glob("*.whl")) if p.is_dir() else [p]
        if not found or not all(f.is_file() and f.suffix == ".whl" for f in found):
            raise ConfigError(f"provider 'skypilot': wheels: {w!r} is not a .whl file or a folder holding some "
                              "(build them with `pip wheel --no-deps . contrib/math -w dist/`)")
        out += found
    return out
