"""A small, flat hierarchy of errors. Each message says what was wrong, with what value, and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "Echo2Error",
    "ConfigError",
    "AdapterError",
    "BackendError",
    "ProtocolError",
    "AuthError",
    "CapacityError",
    "NameNotFound",
    "DependencyNotInstalled",
    "TrajectoryRejected",
]


class Echo2Error(Exception):
    """Base class of every error echo2sdk raises on purpose."""


class ConfigError(Echo2Error):
    """A configuration value is missing, unknown or out of range."""


class AdapterError(Echo2Error):
    """A task adapter misbehaved or could not be loaded."""


class BackendError(Echo2Error):
    """An inference backend failed, or refused a snapshot."""


class ProtocolError(Echo2Error):
    """A peer sent a malformed or unexpected message."""


class AuthError(ProtocolError):
    """A peer failed authentication (wrong or missing token)."""


class CapacityError(Echo2Error):
    """Capacity inputs describe an infeasible configuration."""


class NameNotFound(Echo2Error):
    """A plug-in name (adapter, backend, env scheme) is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        listing = ", ".join(known) if known else "none installed"
        super().__init__(f"unknown {kind} {name!r}.{hint} Registered: {listing}.")
        self.kind, self.name, self.known = kind, name, known


class DependencyNotInstalled(Echo2Error):
    """An optional dependency is missing; the message names the pip command."""

    def __init__(self, package: str, extra: str):
        super().__init__(f"{package} is not installed: run  pip install \"echo2sdk[{extra}]\"")
        self.package, self.extra = package, extra


class TrajectoryRejected(Echo2Error):
    """A trajectory failed validation on intake. `reason` is a short counter key."""

    def __init__(self, reason: str, field: str, value: object, detail: str = ""):
        try:
            shown = repr(value)
        except RecursionError:  # a peer's value nested deeper than repr goes
            shown = f"<{type(value).__name__} nested too deep to show>"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = f"trajectory rejected ({reason}): field {field!r} = {shown}"
        super().__init__(msg + (f"; {detail}" if detail else ""))
        self.reason, self.field, self.value = reason, field, value
