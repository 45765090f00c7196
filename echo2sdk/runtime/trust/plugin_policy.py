"""What a rollout worker may load because a coordinator's welcome names it.

A welcome names the task adapter and the inference backend a worker loads, with their options. Names
that came over the wire are never imported as such: a worker loads

- a plug-in registered on *this* machine through entry points (groups echo2sdk.adapters,
  echo2sdk.backends; an env URL "scheme://id" needs its scheme registered in echo2sdk.envs, and an id without
  ':', which env registries such as gymnasium's read as "module:Env" and import), also when named by the exact
  "pkg.mod:Attr" value it is registered under;
- any other "pkg.mod:Attr" reference only when the worker's operator allowed it, by that exact string,
  with `echo2 worker --allow-plugin pkg.mod:Attr` (repeatable).

A mixture (`mixture`, a config's [[task.mix]]) loads each of its components as an adapter: each is checked as
the adapter itself is. A reasoning-gym generator whose verifier evaluates the model's answer as Python
(adapters.reasoning_gym.EVALUATES_ANSWER) needs `--allow-plugin reasoning-gym://NAME`. The same holds for reference-like strings anywhere in the options (a sandbox adapter resolves its
serializer, renderer and specs from such strings), and for the environment of the `verifiers` adapter, which
imports the module its env id names (`vf-x` -> `vf_x`) and calls its `load_environment(**env_args)`: that env
must be an installed verifiers environment package here (a distribution that requires verifiers), or allowed
with `--allow-plugin verifiers://ID`. Two kinds of options load code without naming an import the way the
above does, so a coordinator sets them only with the operator's allowance: a backend's `engine_options` (vllm
and sglang hand them to their engine as they are; vLLM imports the dotted class names some of them hold) needs
`--allow-plugin backend_options.engine_options`, and a true `trust_remote_code` anywhere (it runs the model
repository's Python) needs `--allow-plugin trust_remote_code`. Options themselves go to the plug-in, which
validates them: a factory that rejects them (TypeError) is a clean refusal, not a crash.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from echo2sdk.adapters.reasoning_gym import evaluates_answer
from echo2sdk.errors import ConfigError
from echo2sdk.plugins import ADAPTERS, BACKENDS, ENVS, REFERENCE, SANDBOX, registered
from echo2sdk.runtime.protocol.messages import WorkerConfig, shown

__all__ = ["check_plugins", "allowances", "REFERENCE"]

PASS_THROUGH = "backend_options.engine_options"  # vllm / sglang: the engine's own keyword arguments, as they are
REMOTE_CODE = "trust_remote_code"
MIXTURE = "mixture"  # the adapter (adapters/mixture.py) whose options name adapters it loads: each is checked
VERIFIERS = "verifiers"  # the adapter (adapters/verifiers.py) whose env id names a module it imports
# REFERENCE (plugins): what plugins.import_reference imports; it refuses any other string before importing
_MAX_ADAPTERS = 256  # adapters a mixture may name (each is checked)
_MAX_WALK = 100_000  # option values inspected (the welcome's size bounds them anyway)


def check_plugins(cfg: WorkerConfig, allowed: Collection[str] = ()) -> None:
    """ConfigError naming the first plug-in or option of `cfg` this worker must not load; None when all are
    registered here or allowed by the operator."""
    allowed = frozenset(allowed)
    for adapter, options in _adapters(cfg):
        _check_name(ADAPTERS, "adapter", adapter, allowed)
        env = _verifiers_env(adapter, options)
        if env is not None and env not in allowed and not _installed_verifiers_env(env):
            raise ConfigError(
                f"the coordinator's verifiers adapter names env {shown(env)}, whose module it would import; it is "
                f"not an installed verifiers environment package on this worker: pip install it, or start the worker "
                f"with  --allow-plugin {shown(env)[1:-1]}"
            )
    _check_name(BACKENDS, "backend", cfg.backend, allowed)
    for what in _code_options(cfg):
        if what not in allowed:
            raise ConfigError(
                f"the coordinator sets {what}, which lets the backend load code; this worker takes it only when "
                f"started with  --allow-plugin {what}"
            )
    for field in ("adapter_options", "backend_options"):
        for ref in _references(getattr(cfg, field)):
            if ref not in allowed:
                raise ConfigError(
                    f"the coordinator's {field} name {shown(ref)}, an import reference; this worker imports "
                    f"one only when started with  --allow-plugin {shown(ref)[1:-1]}"
                )


def allowances(cfg: WorkerConfig | Any) -> list[str]:
    """The `--allow-plugin` values a worker needs for `cfg` (a WorkerConfig or the trainer's mapping): what the
    learner's operator configured, for the workers the learner starts itself. Sorted, no duplicates."""
    cfg = cfg if isinstance(cfg, WorkerConfig) else WorkerConfig.from_mapping(cfg)
    out = set()
    named = [(ADAPTERS, adapter) for adapter, _ in _adapters(cfg)] + [(BACKENDS, cfg.backend)]
    for group, name in named:
        try:
            _check_name(group, "plug-in", name, frozenset())
        except ConfigError:
            if "://" not in name or evaluates_answer(name):
                out.add(name)
    for field in ("adapter_options", "backend_options"):
        out.update(_references(getattr(cfg, field)))
    for adapter, options in _adapters(cfg):
        env = _verifiers_env(adapter, options)
        if env is not None and not _installed_verifiers_env(env):
            out.add(env)
    out.update(_code_options(cfg))
    return sorted(out)


def _check_name(group: str, kind: str, name: str, allowed: frozenset[str]) -> None:
    if "://" in name and group == ADAPTERS:
        scheme = name.partition("://")[0]
        if scheme in registered(ADAPTERS):  # verifiers://ENV: that adapter (plugins.load_adapter); its env: below
            if evaluates_answer(name) and name not in allowed:
                raise ConfigError(
                    f"the coordinator's adapter {shown(name)} scores answers by evaluating them as Python (reasoning-"
                    f"gym's verifier for it calls eval or sympy's parse_expr); this worker takes it only when started "
                    f"with  --allow-plugin {shown(name)[1:-1]}"
                )
            return
        if scheme not in registered(ENVS) or SANDBOX not in registered(ADAPTERS):
            known = ", ".join(sorted(registered(ENVS))) or "none"
            raise ConfigError(
                f"the coordinator's adapter {shown(name)} needs env scheme {shown(scheme)}, which is not "
                f"registered in group {ENVS!r} on this worker (registered: {known})"
            )
        env_id = name.partition("://")[2]
        if ":" in env_id and name not in allowed:  # gymnasium imports "module:Env" ids' module: an import by name
            raise ConfigError(
                f"the coordinator's adapter {shown(name)} has a ':' in its env id, which env registries read as "
                f"'module:Env' and import; this worker takes it only when started with  --allow-plugin "
                f"{shown(name)[1:-1]}"
            )
        return
    eps = registered(group)
    if ":" not in name or name in allowed or name in eps or name in {ep.value for ep in eps.values()}:
        return  # a plain name is looked up among the entry points only, never imported as such
    raise ConfigError(
        f"the coordinator named {kind} {shown(name)}, which is not registered in group {group!r} on this worker; "
        f"a 'pkg.mod:Attr' {kind} is imported only when the worker is started with  --allow-plugin {shown(name)[1:-1]}"
    )


def _code_options(cfg: WorkerConfig) -> Iterator[str]:
    """The allowances `cfg`'s options need because they load code: a non-empty engine pass-through, a true
    trust_remote_code anywhere in the options."""
    if cfg.backend_options.get("engine_options"):
        yield PASS_THROUGH
    if any(isinstance(o, dict) and o.get(REMOTE_CODE) for o in _walk(cfg.adapter_options, cfg.backend_options)):
        yield REMOTE_CODE


def _adapters(cfg: WorkerConfig) -> list[tuple[str, dict[str, Any]]]:
    """The adapters `cfg` makes a worker load, with their options: its adapter, and a mixture's components (each
    loaded as an adapter of its own: echo2sdk.adapters.mixture). A component that is not a table with a string
    adapter is the mixture's to refuse; it loads nothing."""
    out: list[tuple[str, dict[str, Any]]] = []
    ep = registered(ADAPTERS).get(MIXTURE)
    todo = [(cfg.adapter, cfg.adapter_options)]
    while todo and len(out) < _MAX_ADAPTERS:  # a mixture refuses a mixture component; walked all the same
        adapter, options = todo.pop(0)
        out.append((adapter, options))
        mix = options.get("mix") if adapter == MIXTURE or (ep is not None and adapter == ep.value) else None
        for part in mix if isinstance(mix, list) else ():
            if isinstance(part, dict) and isinstance(part.get("adapter"), str):
                options = part.get("options")
                todo.append((part["adapter"], options if isinstance(options, dict) else {}))
    if todo:
        raise ConfigError(f"the coordinator's mixture names more than {_MAX_ADAPTERS} adapters; refusing it")
    return out


def _verifiers_env(adapter: str, options: dict[str, Any]) -> str | None:
    """`verifiers://ID` when `adapter` is the verifiers adapter (by name, entry-point value or URL) and
    its env is a string (anything else the adapter refuses before it imports); else None."""
    ep = registered(ADAPTERS).get(VERIFIERS)
    if adapter.startswith(f"{VERIFIERS}://"):
        env: Any = adapter
    elif adapter == VERIFIERS or (ep is not None and adapter == ep.value):
        env = options.get("env")
    else:
        return None
    if not isinstance(env, str):
        return None
    return env if "://" in env else f"{VERIFIERS}://{env}"


def _installed_verifiers_env(env: str) -> bool:
    """Whether the module `env` (verifiers://ID) imports belongs to an installed distribution requiring verifiers."""
    from echo2sdk.adapters.verifiers import installed_envs

    module = env.partition("://")[2].replace("-", "_").split("/")[-1]
    return module in {name.replace("-", "_").replace(".", "_").lower() for name in installed_envs()}


def _references(options: Any) -> Iterator[str]:
    """Every string in `options` (keys and values, nested) that an import would resolve."""
    return (o for o in _walk(options) if isinstance(o, str) and REFERENCE.fullmatch(o))


def _walk(*roots: Any) -> Iterator[Any]:
    """Every value in `roots`: nested maps' keys and values, sequences' items; ConfigError past _MAX_WALK."""
    stack, seen = list(roots), 0
    while stack and seen < _MAX_WALK:
        obj = stack.pop()
        seen += 1
        yield obj
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    if stack:
        raise ConfigError(f"the coordinator's options hold more than {_MAX_WALK} values; refusing them")
