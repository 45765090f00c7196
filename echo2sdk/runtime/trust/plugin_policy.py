"""What a rollout worker may load because a coordinator's welcome names it.

A welcome names the task adapter and the inference backend a worker loads, with their options. Names
that came over the wire are never imported as such: a worker loads

- a plug-in registered on *this* machine through entry points (groups echo2sdk.adapters,
  echo2sdk.backends; an env URL "scheme://id" needs its scheme registered in echo2sdk.envs, and an id without
  ':', which env registries such as gymnasium's read as "module:Env" and import), also when named by the exact
  "pkg.mod:Attr" value it is registered under;
- any other "pkg.mod:Attr" reference only when the worker's operator allowed it, by that exact string,
  with `echo2 worker --allow-plugin pkg.mod:Attr` (repeatable).

One rule judges every adapter, however it is named: `plugins.resolve_adapter` turns a name (an env URL, a
registered name, the "pkg.mod:Attr" an entry point is registered under) and its options into what will load
(the entry point and the options its factory gets, an env URL's `env` included), and the policy judges that:
`reasoning-gym://countdown`, `reasoning-gym` with `env = "reasoning-gym://countdown"` and the adapter's import
path with the same option are one adapter, judged once. A mixture (`mixture`, a config's [[task.mix]]) loads
each of its components as an adapter: each is resolved and judged the same way, at any depth. The judged items:

- a reasoning-gym generator whose verifier evaluates the model's answer as Python
  (adapters.reasoning_gym.EVALUATES_ANSWER) needs `--allow-plugin reasoning-gym://NAME`;
- the env a sandbox adapter opens needs its scheme registered here, and an id with ':' needs
  `--allow-plugin SCHEME://ID`;
- the env of the `verifiers` adapter, which imports the module its env id names (`vf-x` -> `vf_x`) and calls its
  `load_environment(**env_args)`, must be an installed verifiers environment package here (a distribution that
  requires verifiers), or allowed with `--allow-plugin verifiers://ID`;
- reference-like strings anywhere in the options (a sandbox adapter resolves its serializer, renderer and specs
  from such strings; a dataset's scorer) need `--allow-plugin pkg.mod:Attr` each.

Two kinds of options load code without naming an import the way the above does, so a coordinator sets them only
with the operator's allowance: a backend's `engine_options` (vllm and sglang hand them to their engine as they
are; vLLM imports the dotted class names some of them hold) needs `--allow-plugin backend_options.engine_options`,
and a true `trust_remote_code` anywhere (it runs the model repository's Python) needs `--allow-plugin
trust_remote_code`. Backend options that say where the worker connects or writes (`base_url`, `snapshot_dir`: the
openai backend's server and folder) need `--allow-plugin backend_options.NAME`. Options themselves go to the plug-in, which validates them: a factory that rejects them
(TypeError) is a clean refusal, not a crash.

The worker checks the whole welcome first (`check_plugins`, before anything is imported), then loads under
`enforced`, which shows every adapter `load_adapter` is about to build (a mixture's components included) to the
same judge: a form the walk missed is still refused before it is imported or constructed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

from echo2sdk.adapters.reasoning_gym import SCHEME as REASONING_GYM
from echo2sdk.adapters.reasoning_gym import evaluates_answer
from echo2sdk.errors import AdapterError, ConfigError, NameNotFound
from echo2sdk.plugins import (
    ADAPTERS,
    BACKENDS,
    ENVS,
    REFERENCE,
    SANDBOX,
    Resolved,
    adapter_guard,
    registered,
    resolve_adapter,
)
from echo2sdk.runtime.protocol.messages import WorkerConfig, shown

__all__ = ["check_plugins", "allowances", "enforced", "judge", "REFERENCE"]

PASS_THROUGH = "backend_options.engine_options"  # vllm / sglang: the engine's own keyword arguments, as they are
REMOTE_CODE = "trust_remote_code"
#: Backend options that say where a worker connects or writes (the openai backend's server, its snapshot folder):
#: a coordinator sets them only with the operator's word (else the backend's own default: a server on this machine)
REACH = ("base_url", "snapshot_dir")
MIXTURE = "mixture"  # the adapter (adapters/mixture.py) whose options name adapters it loads: each is checked
VERIFIERS = "verifiers"  # the adapter (adapters/verifiers.py) whose env id names a module it imports
# REFERENCE (plugins): what plugins.import_reference imports; it refuses any other string before importing
_MAX_ADAPTERS = 256  # adapters a mixture may name (each is checked)
_MAX_WALK = 100_000  # option values inspected (the welcome's size bounds them anyway)

#: One thing a config makes a worker load that needs its operator's word: (the `--allow-plugin` value that admits
#: it, or None when nothing does; the refusal's reason).
Need = tuple[str | None, str]


def check_plugins(cfg: WorkerConfig, allowed: Collection[str] = ()) -> None:
    """ConfigError naming the first plug-in or option of `cfg` this worker must not load; None when all are
    registered here or allowed by the operator."""
    _refuse_first(_needs(cfg), frozenset(allowed))


def allowances(cfg: WorkerConfig | Any) -> list[str]:
    """The `--allow-plugin` values a worker needs for `cfg` (a WorkerConfig or the trainer's mapping): what the
    learner's operator configured, for the workers the learner starts itself. Sorted, no duplicates."""
    cfg = cfg if isinstance(cfg, WorkerConfig) else WorkerConfig.from_mapping(cfg)
    return sorted({allowance for allowance, _ in _needs(cfg) if allowance is not None})


def judge(resolved: Resolved, allowed: Collection[str] = ()) -> None:
    """ConfigError when the adapter `resolved` (plugins.resolve_adapter) needs an allowance not in `allowed`."""
    _refuse_first(_adapter_needs(resolved), frozenset(allowed))


@contextmanager
def enforced(allowed: Collection[str] = ()) -> Iterator[None]:
    """Inside, every adapter plugins.load_adapter builds - a mixture's components at any depth included - is
    judged before it is imported or constructed: the worker's second line, behind check_plugins' walk."""
    allowed = frozenset(allowed)
    token = adapter_guard.set(lambda resolved: judge(resolved, allowed))
    try:
        yield
    finally:
        adapter_guard.reset(token)


def _refuse_first(needs: Iterator[Need], allowed: frozenset[str]) -> None:
    for allowance, why in needs:
        if allowance is None:
            raise ConfigError(why)
        if allowance not in allowed:
            raise ConfigError(f"{why}; this worker takes it only when started with  --allow-plugin {allowance}")


def _needs(cfg: WorkerConfig) -> Iterator[Need]:
    """Everything in `cfg` that loads code beyond the plug-ins registered here, in the order a worker loads it:
    each adapter (a mixture's components too) as it resolves, the backend, options that load code, and
    reference-like strings anywhere in the options."""
    for resolved in _adapters(cfg):
        if isinstance(resolved, str):  # the reason it resolves to nothing loadable
            yield None, resolved
        else:
            yield from _adapter_needs(resolved)
    yield from _backend_needs(cfg.backend)
    for what in _code_options(cfg):
        yield what, f"the coordinator sets {what}, which lets the backend load code"
    for name in REACH:
        if cfg.backend_options.get(name) is not None:
            yield f"backend_options.{name}", (f"the coordinator sets backend_options.{name} = "
                                              f"{shown(cfg.backend_options[name])}: where the backend connects or writes")
    for field in ("adapter_options", "backend_options"):
        for ref in _references(getattr(cfg, field)):
            yield ref, f"the coordinator's {field} name {shown(ref)}, an import reference"


def _is(resolved: Resolved, name: str) -> bool:
    """Whether `resolved` loads what is registered here as adapter `name` (by what it imports, however named)."""
    ep = registered(ADAPTERS).get(name)
    return ep is not None and resolved.target == ep.value


def _adapter_needs(r: Resolved) -> Iterator[Need]:
    """What loading the one adapter `r` needs (a mixture's components are adapters of their own: _adapters)."""
    if r.name is None:
        yield r.target, (f"the coordinator named adapter {shown(r.target)}, which is not registered in group "
                         f"{ADAPTERS!r} on this worker; a 'pkg.mod:Attr' adapter is an import")
        return
    env = r.options.get("env")
    if not isinstance(env, str):
        return  # the adapter refuses a missing or non-string env before it loads anything
    if _is(r, SANDBOX):
        yield from _env_needs(env)
    elif _is(r, REASONING_GYM) and evaluates_answer(env):
        yield env, (f"the coordinator's task {shown(env)} scores answers by evaluating them as Python (reasoning-"
                    f"gym's verifier for it calls eval or sympy's parse_expr)")
    elif _is(r, VERIFIERS):
        env = env if "://" in env else f"{VERIFIERS}://{env}"
        if not _installed_verifiers_env(env):
            yield env, (f"the coordinator's verifiers adapter names env {shown(env)}, whose module it would import; "
                        f"it is not an installed verifiers environment package on this worker (pip install it)")


def _env_needs(env: str) -> Iterator[Need]:
    """An env URL the sandbox adapter opens: its scheme must be registered here, and an id with ':' (which env
    registries such as gymnasium's read as "module:Env" and import) needs the operator's word."""
    scheme, _, env_id = env.partition("://")
    if scheme not in registered(ENVS):
        known = ", ".join(sorted(registered(ENVS))) or "none"
        yield None, (f"the coordinator's env {shown(env)} needs env scheme {shown(scheme)}, which is not registered "
                     f"in group {ENVS!r} on this worker (registered: {known})")
    elif ":" in env_id:
        yield env, (f"the coordinator's env {shown(env)} has a ':' in its env id, which env registries read as "
                    f"'module:Env' and import")


def _backend_needs(name: str) -> Iterator[Need]:
    eps = registered(BACKENDS)
    if ":" in name and name not in eps and name not in {ep.value for ep in eps.values()}:
        yield name, (f"the coordinator named backend {shown(name)}, which is not registered in group {BACKENDS!r} "
                     f"on this worker; a 'pkg.mod:Attr' backend is an import")
    # a plain name is looked up among the entry points only, never imported as such


def _adapters(cfg: WorkerConfig) -> Iterator[Resolved | str]:
    """Every adapter `cfg` makes a worker load, resolved as plugins.load_adapter resolves it: its adapter, and a
    mixture's components at any depth (each loaded as an adapter of its own, named in any form); the reason,
    as a string, for one that resolves to nothing. A component that is not a table with a string adapter is
    the mixture's to refuse; it loads nothing."""
    todo: list[tuple[str, Any]] = [(cfg.adapter, cfg.adapter_options)]
    seen = 0
    while todo:
        if seen == _MAX_ADAPTERS:
            yield f"the coordinator's mixture names more than {_MAX_ADAPTERS} adapters; refusing it"
            return
        name, options = todo.pop(0)
        seen += 1
        try:
            resolved = resolve_adapter(name, options if isinstance(options, dict) else {})
        except (NameNotFound, AdapterError) as e:
            yield f"the coordinator's adapter {shown(name)} loads nothing here: {e}"
            continue
        yield resolved
        mix = resolved.options.get("mix") if _is(resolved, MIXTURE) else None
        for part in mix if isinstance(mix, list) else ():
            if isinstance(part, dict) and isinstance(part.get("adapter"), str):
                todo.append((part["adapter"], part.get("options", {})))


def _installed_verifiers_env(env: str) -> bool:
    """Whether the module `env` (verifiers://ID) imports belongs to an installed distribution requiring verifiers."""
    from echo2sdk.adapters.verifiers import installed_envs

    module = env.partition("://")[2].replace("-", "_").split("/")[-1]
    return module in {name.replace("-", "_").replace(".", "_").lower() for name in installed_envs()}


def _code_options(cfg: WorkerConfig) -> Iterator[str]:
    """The allowances `cfg`'s options need because they load code: a non-empty engine pass-through, a true
    trust_remote_code anywhere in the options."""
    if cfg.backend_options.get("engine_options"):
        yield PASS_THROUGH
    if any(isinstance(o, dict) and o.get(REMOTE_CODE) for o in _walk(cfg.adapter_options, cfg.backend_options)):
        yield REMOTE_CODE


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
