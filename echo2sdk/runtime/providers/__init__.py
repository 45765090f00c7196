"""Machine providers: how the scheduler starts and stops rollout workers.

A provider is anything with the :class:`Provider` methods, registered in the entry-point group
``echo2sdk.providers`` (the built-in ``local`` provider registers there exactly as a third party
would: a cloud API, SLURM, Kubernetes). The scheduler (:mod:`echo2sdk.core.scheduler`) only decides;
the trainer's live loop calls ``start(name)`` for an activation that needs a machine and ``stop(name)``
when a machine is to be given back. A worker the scheduler merely *releases* stays registered with the
coordinator and idle; it is stopped only when the run is configured to (``scheduler.stop_released``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from echo2sdk.errors import ConfigError

__all__ = ["Provider", "PROVIDERS", "load_provider"]

PROVIDERS = "echo2sdk.providers"
_METHODS = ("start", "stop", "running", "close")


@runtime_checkable
class Provider(Protocol):
    """Starts and stops worker machines by name.

    ``start(name, price_per_hour)`` brings up a worker that joins the coordinator with worker id `name`
    and announces `price_per_hour`; it returns at once (the worker joins when it is ready).
    ``stop(name)`` ends it (no-op when it is not running). ``running()`` lists the names it started
    that are still up. ``close()`` stops everything it started.
    """

    def start(self, name: str, price_per_hour: float = 0.0) -> None: ...

    def stop(self, name: str) -> None: ...

    def running(self) -> list[str]: ...

    def close(self) -> None: ...


def load_provider(name: str, **options: Any) -> Provider:
    """Build the provider registered as `name` (or a "pkg.mod:Class" reference) with `options`;
    validated against the Provider methods on load."""
    from echo2sdk.plugins import load_object

    factory = load_object(PROVIDERS, name)
    try:
        provider = factory(**options)
    except TypeError as e:
        raise ConfigError(f"provider {name!r} rejected options {sorted(options)}: {e}") from e
    missing = [m for m in _METHODS if not callable(getattr(provider, m, None))]
    if missing:
        raise ConfigError(f"provider plug-in {name!r} ({factory!r}) in group {PROVIDERS!r} lacks {missing}")
    return provider
