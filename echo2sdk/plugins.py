"""Plug-in discovery through entry points (groups echo2sdk.adapters, echo2sdk.envs, echo2sdk.backends).

Built-ins register in pyproject.toml exactly as third parties do. A name may also be a direct
"package.module:Attr" reference. Nothing is imported until the plug-in is asked for.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from echo2sdk.core.contracts import InferenceBackend, TaskAdapter
from echo2sdk.errors import AdapterError, BackendError, NameNotFound

__all__ = ["registered", "import_reference", "load_object", "load_backend_class", "load_adapter", "resolve_adapter",
           "Resolved", "adapter_guard"]

ADAPTERS = "echo2sdk.adapters"
BACKENDS = "echo2sdk.backends"
ENVS = "echo2sdk.envs"
SANDBOX = "sandbox"  # the adapter that env URLs ("scheme://id") load
#: Schemes with a meaning reserved by echo2sdk even when no plug-in for them is installed (adapters.registry
#: names the package to install; load_adapter lets them through to it).
RESERVED_SCHEMES = {"moba": "lane-battle MOBA sandboxes (moba://lane_1v1_v1); pip install -e contrib/moba (echo2-moba)"}


@cache
def registered(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


#: What a reference looks like (runtime/trust/plugin_policy.py checks the same pattern before a worker imports one).
REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def import_reference(ref: str) -> Any:
    """The object a "pkg.mod:Attr" (or "pkg.mod:Outer.Inner") reference names, imported now.
    Raises ImportError or AttributeError as the import or the attribute lookup does; ImportError, before any
    import, for a string that is not of that form."""
    if not REFERENCE.fullmatch(ref):
        raise ImportError(f"{ref!r} is not a 'package.module:attribute' reference")
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_object(group: str, name: str) -> Any:
    """Load a registered plug-in by name, or a "pkg.mod:Attr" reference."""
    if ":" in name:
        try:
            return import_reference(name)
        except (ImportError, AttributeError) as e:
            raise NameNotFound(group, name, registered(group)) from e
    eps = registered(group)
    if name not in eps:
        raise NameNotFound(group.rsplit(".", 1)[-1].rstrip("s"), name, eps)
    return eps[name].load()


_BACKEND_METHODS = ("encode_chat", "generate", "install", "close")
_ADAPTER_METHODS = ("tasks", "score")


def _missing(cls: Any, methods: tuple[str, ...]) -> list[str]:
    return [m for m in methods if not callable(getattr(cls, m, None))]


def load_backend_class(name: str) -> type[InferenceBackend]:
    cls = load_object(BACKENDS, name)
    if missing := _missing(cls, _BACKEND_METHODS):
        raise BackendError(f"backend plug-in {name!r} ({cls!r}) in group {BACKENDS!r} lacks {missing}")
    return cls


@dataclass(frozen=True)
class Resolved:
    """What `load_adapter(name, options)` loads, worked out before anything is imported: `name` the registered
    adapter (None for an unregistered "pkg.mod:Attr"), `target` what is imported (the entry point's value, or
    the reference) and `options` the factory is called with (an env URL's `env` included). Whatever way an
    adapter is named - an env URL, its registered name, its entry point's value - it resolves to the same."""

    name: str | None
    target: str
    options: dict[str, Any]


def resolve_adapter(name: str, options: dict[str, Any] | None = None) -> Resolved:
    """The adapter that `name` with `options` loads (see Resolved); NameNotFound or AdapterError when none would."""
    options = dict(options or {})
    if "://" in name:
        if "env" in options and options["env"] != name:
            raise AdapterError(f"adapter {name!r}: options.env = {options['env']!r} contradicts the adapter URL")
        options["env"] = name
        scheme = name.split("://", 1)[0]
        if scheme not in registered(ADAPTERS) and scheme not in registered(ENVS) and scheme not in RESERVED_SCHEMES:
            schemes = [n for n in registered(ADAPTERS) if n != SANDBOX] + list(registered(ENVS))
            raise NameNotFound("URL scheme (an adapter's, or an env plug-in's)", scheme, schemes)
        name = scheme if scheme in registered(ADAPTERS) else SANDBOX  # verifiers://ENV is the `verifiers` adapter
    eps = registered(ADAPTERS)
    if name in eps:
        return Resolved(name, eps[name].value, options)
    if ":" in name:
        by_value = [ep.name for ep in eps.values() if ep.value == name]
        return Resolved(by_value[0] if by_value else None, name, options)
    raise NameNotFound("adapter", name, eps)


#: The judge of what is about to load (the worker's plug-in policy, runtime/trust/plugin_policy.py): while it is
#: set, every adapter load_adapter builds - a mixture's components included - is shown to it first.
adapter_guard: ContextVar[Callable[[Resolved], None] | None] = ContextVar("adapter_guard", default=None)


def load_adapter(name: str, options: dict[str, Any] | None = None) -> TaskAdapter:
    """A task adapter by registered name, "pkg.mod:Class", or an env URL such as "poker://nlhe_headsup_v1"
    (which loads the registered `sandbox` adapter with env=URL; the scheme picks the env plug-in)."""
    resolved = resolve_adapter(name, options)
    if (guard := adapter_guard.get()) is not None:
        guard(resolved)
    name, options = resolved.name or resolved.target, resolved.options
    factory = load_object(ADAPTERS, name)
    try:
        adapter = factory(**options)
    except TypeError as e:
        raise AdapterError(f"adapter {name!r} rejected options {options!r}: {e}") from e
    missing = _missing(adapter, ("tasks",))
    if not callable(getattr(adapter, "start", None)):  # single-turn adapters score; episodic ones start
        missing += _missing(adapter, _ADAPTER_METHODS[1:])
    if missing:
        raise AdapterError(f"adapter plug-in {name!r} in group {ADAPTERS!r} lacks {missing} (needs tasks and score, or tasks and start)")
    return adapter
