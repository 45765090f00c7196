"""Machine providers: how the scheduler starts and stops rollout workers.

A provider is anything with the :class:`Provider` methods, registered in the entry-point group
``echo2sdk.providers`` (the built-in ``local`` provider registers there exactly as a third party
would: a cloud API, SLURM, Kubernetes). The scheduler (:mod:`echo2sdk.core.scheduler`) only decides;
the trainer's live loop calls ``start(name)`` for an activation that needs a machine and ``stop(name)``
when a machine is to be given back. A worker the scheduler merely *releases* stays registered with the
coordinator and idle; it is stopped only when the run is configured to (``scheduler.stop_released``).

Built in: ``local`` (processes on the learner's host) and ``skypilot`` (one SkyPilot cluster per worker, any cloud;
extra ``echo2sdk[skypilot]``). Both record every machine in the run ledger (:mod:`.ledger`) before launching it;
``echo2 fleet status|down RUN_DIR`` (:func:`fleet_status`, :func:`fleet_down`) read it back through the provider's
``fleet_status`` / ``fleet_down`` class methods, with no learner running.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Protocol, runtime_checkable

from echo2sdk.errors import ConfigError

__all__ = ["Provider", "PROVIDERS", "ENDED", "load_provider", "fleet_status", "fleet_down"]

PROVIDERS = "echo2sdk.providers"
# what a provider's fleet_down says of a machine that no longer runs: ended by it ("down", "killed" where it took
# SIGKILL) or found already ended ("gone"); the ledger records these down, and nothing else
ENDED = ("down", "killed", "gone")
_METHODS = ("start", "stop", "running", "close")


@runtime_checkable
class Provider(Protocol):
    """Starts and stops worker machines by name.

    ``start(name, price_per_hour)`` brings up a worker that joins the coordinator with worker id `name`
    and announces `price_per_hour`; it returns at once (the worker joins when it is ready).
    ``stop(name)`` ends it (no-op when it is not running). ``running()`` lists the names it started
    that are still up. ``close()`` stops everything it started.

    Optional: ``failures()`` returns (and forgets) the launches that failed since the last call, name -> reason
    (the live loop reports them to the scheduler, which retries on the next-cheapest machine type).
    """

    def start(self, name: str, price_per_hour: float = 0.0) -> None: ...

    def stop(self, name: str) -> None: ...

    def running(self) -> list[str]: ...

    def close(self) -> None: ...


def load_provider(name: str, run: dict[str, Any] | None = None, **options: Any) -> Provider:
    """Build the provider registered as `name` (or a "pkg.mod:Class" reference) with `options`, plus those of the
    run's own settings `run` (connect, token, run_dir, allow, plaintext, machines, ...) that its factory names as
    parameters (a provider that needs no token is never given one); validated against the Provider methods."""
    from echo2sdk.plugins import load_object

    factory = load_object(PROVIDERS, name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    given = {k: v for k, v in (run or {}).items() if k in params and k not in options}
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if params and not open_ended and (unknown := sorted(set(options) - set(params))):
        raise ConfigError(f"provider {name!r}: unknown scheduler.provider_options {unknown}; it takes "
                          f"{', '.join(k for k in params if k != 'self')}")
    try:
        provider = factory(**given, **options)
    except TypeError as e:
        raise ConfigError(f"provider {name!r} rejected options {sorted(options)}: {e}") from e
    missing = [m for m in _METHODS if not callable(getattr(provider, m, None))]
    if missing:
        raise ConfigError(f"provider plug-in {name!r} ({factory!r}) in group {PROVIDERS!r} lacks {missing}")
    return provider


def _by_provider(run_dir: str | os.PathLike) -> dict[str, list[Any]]:
    from echo2sdk.runtime.providers.ledger import read_ledger

    groups: dict[str, list[Any]] = {}
    for m in read_ledger(run_dir).values():
        groups.setdefault(m.provider, []).append(m)
    return groups


def _provider_class(name: str) -> Any:
    """The registered provider `name` (a ledger names providers; only installed entry points are taken from it,
    never a "pkg.mod:Attr" reference)."""
    from importlib.metadata import entry_points

    from echo2sdk.plugins import load_object

    registered = {ep.name for ep in entry_points(group=PROVIDERS)}
    if name not in registered:
        raise ConfigError(f"the run ledger names provider {name!r}, not one registered in {PROVIDERS!r} "
                          f"({', '.join(sorted(registered))})")
    cls = load_object(PROVIDERS, name)
    if not callable(getattr(cls, "fleet_down", None)):
        raise ConfigError(f"provider {name!r} ({cls!r}) has no fleet_down: end its machines by hand")
    return cls


def fleet_status(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every machine in the run ledger of `run_dir`: its ledger state and what its provider says of it now."""
    rows = []
    for provider, machines in _by_provider(run_dir).items():
        live = _provider_class(provider).fleet_status([m for m in machines if not m.down])
        for m in machines:
            key = m.handle.get("cluster", m.name)
            rows.append({"machine": m.name, "provider": provider, "ledger": m.state, "now": live.get(key, "down"),
                         "type": m.spec.get("type", ""), "price_per_hour": m.spec.get("price_per_hour"),
                         "launched_at": m.launched_at, "reason": m.reason})
    return rows


def fleet_down(run_dir: str | os.PathLike, force: bool = False) -> dict[str, str]:
    """End every machine of the run ledger of `run_dir` not recorded as down, through the provider that started it,
    and record in the ledger those that no longer run (:data:`ENDED`). Returns name -> what the provider said: one of
    ENDED, or why the machine was not ended. Refused while the run's learner still holds the folder (its scheduler
    would launch again), unless `force`."""
    from echo2sdk.runtime.providers.ledger import Ledger, holder

    if not force and (pid := holder(run_dir)) is not None:
        raise ConfigError(f"{str(run_dir)!r}: the run is still going (process {pid} holds its .fleet.lock); stop "
                          "it (its machines go down when it closes), or end them anyway with --force")

    out: dict[str, str] = {}
    for provider, machines in _by_provider(run_dir).items():
        todo = [m for m in machines if not m.down]
        if not todo:
            continue
        result = _provider_class(provider).fleet_down(todo)
        ledger = Ledger(run_dir, provider)
        for m in todo:
            said = result.get(m.handle.get("cluster", m.name), "not attempted")
            if said in ENDED:
                ledger.down(m.name)
            out[m.name] = said
    return out
