"""Env URLs and component names -> objects.

An env URL is `scheme://id`, parsed by one regex. The scheme names an entry point in the group
`echo2sdk.envs` (built-ins `gym` and `pettingzoo` register there exactly as `poker` does from its own
distribution); the plug-in is loaded once per process and validated against `SandboxPlugin` on load.
Unknown names raise `NameNotFound` with close-match suggestions. A reserved scheme (`moba`, from the
`echo2-moba` package in contrib/moba) that is not installed raises an error naming what to install.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from echo2sdk.adapters.components import BUILTIN, KINDS
from echo2sdk.adapters.contracts import SandboxPlugin
from echo2sdk.errors import AdapterError, ConfigError, NameNotFound
from echo2sdk.plugins import ENVS, RESERVED_SCHEMES, import_reference, load_object, registered

__all__ = ["ENV_URL", "RESERVED_SCHEMES", "parse_env", "load_env_plugin", "resolve_component", "component_names"]

ENV_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9_+.-]*)://(?P<id>[A-Za-z0-9_][A-Za-z0-9_./:+-]*)$")


_PLUGIN_ATTRS = ("scheme", "default_serializer", "default_penalty")
_PLUGIN_METHODS = ("env_ids", "check", "make", "components")


def parse_env(url: object) -> tuple[str, str]:
    """'poker://nlhe_headsup_v1' -> ('poker', 'nlhe_headsup_v1'); ConfigError naming the value otherwise."""
    m = ENV_URL.match(url) if isinstance(url, str) else None
    if m is None:
        raise ConfigError(
            f"env = {url!r}: expected an env URL 'scheme://id', e.g. 'poker://nlhe_headsup_v1' or 'gym://FrozenLake-v1'"
        )
    return m["scheme"], m["id"]


@cache
def load_env_plugin(scheme: str) -> SandboxPlugin:
    """The env plug-in registered for `scheme` in group echo2sdk.envs, validated on load."""
    eps = registered(ENVS)
    if scheme not in eps:
        if scheme in RESERVED_SCHEMES:
            raise NameNotFound(f"env scheme (reserved: {RESERVED_SCHEMES[scheme]})", scheme, eps)
        raise NameNotFound("env scheme", scheme, eps)
    try:
        obj = load_object(ENVS, scheme)
    except Exception as e:  # ImportError of an optional dependency, a broken plug-in
        if isinstance(e, NameNotFound):
            raise
        raise AdapterError(f"env plug-in {scheme!r} in group {ENVS!r} failed to load: {type(e).__name__}: {e}") from e
    plugin = obj() if isinstance(obj, type) else obj
    missing = [a for a in _PLUGIN_ATTRS if not hasattr(plugin, a)]
    missing += [m for m in _PLUGIN_METHODS if not callable(getattr(plugin, m, None))]
    if missing:
        raise AdapterError(f"env plug-in {scheme!r} in group {ENVS!r} ({obj!r}) lacks {missing}")
    if plugin.scheme != scheme:
        raise AdapterError(f"env plug-in registered as {scheme!r} in group {ENVS!r} says its scheme is {plugin.scheme!r}")
    return plugin


def component_names(kind: str, plugin: SandboxPlugin | None = None) -> list[str]:
    names = set(BUILTIN[kind])
    if plugin is not None:
        names |= set(plugin.components().get(kind, {}))
    return sorted(names)


def resolve_component(kind: str, name: object, plugin: SandboxPlugin | None = None) -> Any:
    """A named component: the env plug-in's own first, then the built-ins, then 'package.module:attr'."""
    if kind not in KINDS:
        raise ValueError(f"unknown component kind {kind!r}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind} = {name!r}: expected a component name, e.g. {next(iter(BUILTIN[kind]))!r}")
    if plugin is not None and name in plugin.components().get(kind, {}):
        return plugin.components()[kind][name]
    if name in BUILTIN[kind]:
        return BUILTIN[kind][name]
    if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", name):
        try:
            obj = import_reference(name)
        except (ImportError, AttributeError) as e:
            raise NameNotFound(kind.replace("_", " "), name, component_names(kind, plugin)) from e
        return obj() if isinstance(obj, type) else obj
    raise NameNotFound(kind.replace("_", " "), name, component_names(kind, plugin))
