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
import shlex
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from echo2sdk.errors import ConfigError
from echo2sdk.runtime.providers.ledger import Ledger, Machine

__all__ = ["SkyPilotProvider", "RESOURCE_KEYS", "machine_type"]

log = logging.getLogger("echo2sdk.providers.skypilot")

NAME = "skypilot"
# sky.Resources keywords a machine type may set (the relay port is added; autostop comes from the provider)
RESOURCE_KEYS = ("accelerators", "infra", "region", "zone", "instance_type", "cpus", "memory", "use_spot", "disk_size",
                 "disk_tier", "network_tier", "image_id", "labels", "any_of")
RELAY_PORT = 7420
UP = ("UP", "INIT")  # sky.status states of a cluster that exists


def machine_type(name: str) -> str:
    """The machine type of worker `name` ("l4-3" -> "l4"; a name without an index is its own type)."""
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


def _import_sky() -> Any:
    try:
        import sky
    except ImportError as e:
        raise ConfigError(f"provider 'skypilot' needs SkyPilot: pip install 'echo2sdk[skypilot]' ({e})") from None
    return sky


class SkyPilotProvider:
    """See the module docstring. `machines`: machine type -> its sky.Resources keywords; `connect`: the learner's
    address as the workers reach it; `token`: the run token (each machine gets a credential derived from it)."""

    def __init__(
        self,
        connect: str,
        token: str = "",
        *,
        machines: dict[str, dict[str, Any]] | None = None,
        run_dir: str = ".",
        setup: str | None = None,
        packages: Sequence[str] = (),
        secret: str = "credential",
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
        self.machines = {t: self._resources(t, r) for t, r in (machines or {}).items()}
        self.connect, self.token, self.secret = str(connect), token, secret
        self.setup, self.packages = setup, tuple(packages)
        self.allow, self.plaintext, self.relay_port, self.bootstrap = tuple(allow), bool(plaintext), int(relay_port), bootstrap
        self.envs = {str(k): str(v) for k, v in (envs or {}).items()}
        self.autostop_minutes = int(autostop_minutes)
        self.launch_timeout_s, self.down_timeout_s = float(launch_timeout_s), float(down_timeout_s)
        self.ledger = Ledger(run_dir, NAME)
        self._sky = sky
        self._lock = threading.Lock()
        self._state: dict[str, str] = {}  # name -> launching | up | failed | stopping | down
        self._since: dict[str, float] = {}  # name -> when its launch began (monotonic)
        self._requests: dict[str, Any] = {}  # name -> the launch's request id
        self._failures: dict[str, str] = {}  # failed launches not yet reported by failures()
        self._threads: list[threading.Thread] = []

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
        """What runs once on a new machine before the worker (the `setup` option, else pip installs echo2sdk)."""
        if self.setup is not None:
            return self.setup
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("echo2sdk")
        except PackageNotFoundError:  # a source tree that is not installed
            from echo2sdk import __version__ as v
        pkgs = [f"echo2sdk[hf]=={v}", *self.packages]
        return "pip install " + " ".join(shlex.quote(p) for p in pkgs)

    def _secrets(self, name: str) -> dict[str, str]:
        if not self.token:
            raise ConfigError(f"provider 'skypilot': no run token to give worker {name!r}")
        if self.secret == "token":
            return {"ECHO2_TOKEN": self.token}
        from echo2sdk.runtime.trust.worker_keys import issue

        return {"ECHO2_CREDENTIAL": str(issue(self.token, name))}

    def resources_for(self, name: str) -> dict[str, Any]:
        kind = machine_type(name)
        if kind not in self.machines:
            raise ConfigError(f"provider 'skypilot': worker {name!r} is of machine type {kind!r}, not among "
                              f"[[scheduler.machines]] ({sorted(self.machines)})")
        return {**self.machines[kind], "ports": [self.relay_port]}

    def spec(self, name: str, price_per_hour: float) -> dict[str, Any]:
        """The launch's public description (the ledger's and --dry-run's): no secret, only secret names."""
        return {"cluster": name, "type": machine_type(name), "price_per_hour": float(price_per_hour),
                "resources": self.resources_for(name), "setup": self.setup_script(),
                "run": shlex.join(self.command(name, price_per_hour)), "envs": dict(self.envs),
                "secrets": ["ECHO2_TOKEN" if self.secret == "token" else "ECHO2_CREDENTIAL"],
                "autostop": {"idle_minutes": self.autostop_minutes, "down": True}}

    def task(self, name: str, price_per_hour: float) -> Any:
        """The sky.Task of worker `name` (built with the installed SkyPilot, which validates it)."""
        sky = self.sky
        t = sky.Task(name=name, setup=self.setup_script(), run=shlex.join(self.command(name, price_per_hour)),
                     envs=dict(self.envs), secrets=self._secrets(name))
        t.set_resources(sky.Resources(**self.resources_for(name)))
        return t

    # ------------------------------------------------------------------ the Provider methods

    def start(self, name: str, price_per_hour: float = 0.0) -> None:
        """Launch cluster `name` in the background (no-op while it is launching or up)."""
        with self._lock:
            if self._state.get(name) in ("launching", "up"):
                return
            task = self.task(name, price_per_hour)  # errors in the config surface here, in the caller
            self.ledger.launching(name, {"cluster": name}, self.spec(name, price_per_hour))
            self._state[name], self._since[name] = "launching", time.monotonic()
            self._failures.pop(name, None)
        self._spawn(self._launch, name, task)

    def _spawn(self, fn: Any, *args: Any) -> threading.Thread:
        # daemon threads: a SkyPilot call that never returns must not hold the learner's exit
        th = threading.Thread(target=fn, args=args, name=f"echo2-sky-{fn.__name__}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [th]
        th.start()
        return th

    def _launch(self, name: str, task: Any) -> None:
        sky = self.sky
        t0 = time.monotonic()
        try:
            request = sky.launch(task, cluster_name=name, idle_minutes_to_autostop=self.autostop_minutes, down=True)
            with self._lock:
                self._requests[name] = request
            sky.get(request)
        except Exception as e:  # noqa: BLE001 - any SkyPilot failure is a failed launch, reported
            self._fail(name, f"launch failed after {time.monotonic() - t0:.0f} s: {type(e).__name__}: {e}")
            return
        with self._lock:
            if self._state.get(name) != "launching":  # stopped or timed out meanwhile: the down is under way
                return
            self._state[name] = "up"
        self.ledger.up(name, launch_s=round(time.monotonic() - t0, 1))
        log.info("cluster %s up after %.0f s", name, time.monotonic() - t0)

    def _fail(self, name: str, reason: str) -> None:
        with self._lock:
            if self._state.get(name) != "launching":
                return
            self._state[name] = "failed"
            self._failures[name] = reason
            request = self._requests.pop(name, None)
        log.warning("worker %s: %s; tearing its cluster down", name, reason)
        self.ledger.failed(name, reason)
        self._spawn(self._down, name, request)

    def _down(self, name: str, request: Any = None) -> None:
        sky = self.sky
        if request is not None:
            try:
                sky.get(sky.api_cancel(request))
            except Exception:  # noqa: BLE001 - a finished or unknown request: the down below still runs
                pass
        try:
            sky.get(sky.down(name))
        except Exception as e:  # noqa: BLE001
            if not _gone(e):
                log.warning("sky.down(%r) failed: %s; run `echo2 fleet down %s`", name, e, self.ledger.path.parent)
                return
        with self._lock:
            self._state[name] = "down"
        self.ledger.down(name)

    def stop(self, name: str) -> threading.Thread | None:
        """Tear cluster `name` down in the background (no-op when it is not ours or already going); the thread."""
        with self._lock:
            state = self._state.get(name)
            if state not in ("launching", "up", "failed"):
                return None
            self._state[name] = "stopping"
            request = self._requests.pop(name, None) if state == "launching" else None
        return self._spawn(self._down, name, request)

    def failures(self) -> dict[str, str]:
        """Launches that failed or timed out since the last call: worker -> reason (the live loop reads this)."""
        now = time.monotonic()
        with self._lock:
            late = [n for n, s in self._state.items() if s == "launching" and now - self._since[n] > self.launch_timeout_s]
        for n in late:
            self._fail(n, f"not up after launch_timeout_s = {self.launch_timeout_s:g} s")
        with self._lock:
            out, self._failures = self._failures, {}
        return out

    def running(self) -> list[str]:
        """The clusters of this run that SkyPilot reports as UP or INIT (one sky.status call), plus those whose
        launch has not yet created one. A cluster of ours that is gone is reported by failures() (preempted)."""
        with self._lock:
            ours = [n for n, s in self._state.items() if s in ("launching", "up")]
        if not ours:
            return []
        sky = self.sky
        listed = {str(r["name"]): _status(r) for r in sky.get(sky.status(cluster_names=ours, refresh=_refresh(sky)))}
        alive = [n for n in ours if listed.get(n) in UP]
        with self._lock:
            for n in ours:
                if self._state.get(n) == "up" and listed.get(n) not in UP:
                    self._state[n] = "failed"
                    self._failures[n] = f"cluster {listed.get(n, 'gone')} (preempted or ended outside the run)"
        return alive + [n for n in ours if n not in alive and self._state.get(n) == "launching"]

    def close(self) -> None:
        """Tear down every cluster this run started and wait up to down_timeout_s for SkyPilot to confirm."""
        with self._lock:
            names = [n for n, s in self._state.items() if s in ("launching", "up", "failed")]
            downs = [t for t in self._threads if t.is_alive() and t.name.endswith("_down")]  # under way already
        downs += [t for t in map(self.stop, names) if t is not None]
        deadline = time.monotonic() + self.down_timeout_s
        for th in downs:  # not the launches: a hung sky.get must not hold the learner's exit
            th.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = [n for n, s in self._state.items() if s != "down"]
        if left:
            log.warning("clusters not confirmed down: %s; run `echo2 fleet down %s`", left, self.ledger.path.parent)

    # ------------------------------------------------------------------ the fleet commands (no learner needed)

    @classmethod
    def fleet_status(cls, machines: Iterable[Machine], sky: Any = None) -> dict[str, str]:
        """What SkyPilot says of each recorded cluster now: name -> its status, or "gone"."""
        sky = sky or _import_sky()
        names = [m.handle.get("cluster", m.name) for m in machines]
        if not names:
            return {}
        listed = {str(r["name"]): _status(r) for r in sky.get(sky.status(cluster_names=names, refresh=_refresh(sky)))}
        return {n: listed.get(n, "gone") for n in names}

    @classmethod
    def fleet_down(cls, machines: Iterable[Machine], sky: Any = None) -> dict[str, str]:
        """sky.down every recorded cluster in parallel: name -> "down" or the error."""
        sky = sky or _import_sky()
        out: dict[str, str] = {}

        def down(cluster: str) -> None:
            try:
                sky.get(sky.down(cluster))
                out[cluster] = "down"
            except Exception as e:  # noqa: BLE001
                out[cluster] = "down" if _gone(e) else f"failed: {type(e).__name__}: {e}"

        threads = [threading.Thread(target=down, args=(m.handle.get("cluster", m.name),), daemon=True) for m in machines]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return out


def _refresh(sky: Any) -> Any:
    """Ask the clouds about spot and autostop clusters (ours are both), not SkyPilot's cached state."""
    return sky.StatusRefreshMode.AUTO


def _status(record: Any) -> str:
    s = record["status"] if isinstance(record, dict) else getattr(record, "status", None)
    return str(getattr(s, "value", s) or "gone")


def _gone(e: Exception) -> bool:
    """sky.down of a cluster that does not exist: it is down."""
    return type(e).__name__ == "ClusterDoesNotExist" or "does not exist" in str(e)
