"""Every way a welcome can name a gated adapter is judged by the worker's plug-in policy (runtime/trust/
plugin_policy.py), before anything is imported or constructed.

An attacker's probe (a coordinator holding the run's token) named reasoning-gym's countdown generator, whose
verifier runs the answer through sympy's parse_expr (an eval), three ways the policy did not judge: the
`reasoning-gym` adapter with the generator in its options, the adapter's import path with the same option,
and a mixture component written that way. The worker scored an answer of the impostor's choosing and a marker
file appeared. Here each gated item is named in each form, at each depth, and must be refused."""

from __future__ import annotations

import importlib
import re

import pytest
from _calls import calls
from _peers import TOKEN, fake_coordinator, finish, spawn_worker

from echo2sdk.errors import ConfigError
from echo2sdk.plugins import ADAPTERS, ENVS, adapter_guard, load_adapter, registered, resolve_adapter
from echo2sdk.runtime.protocol.messages import WorkerConfig
from echo2sdk.runtime.trust.plugin_policy import allowances, check_plugins, enforced

pytest.importorskip("reasoning_gym")

EVIL = "<answer>(lambda: __import__('pathlib').Path({marker!r}).touch())()</answer>"

#: (the env a gated adapter opens, which is also the `--allow-plugin` value that admits it; the adapter it loads)
GATED = [
    ("reasoning-gym://countdown", "reasoning-gym"),  # its verifier evals the answer
    ("reasoning-gym://composite", "reasoning-gym"),  # can hold any generator
    ("gym://os:system", "sandbox"),  # gymnasium imports an id's "module:" part
    ("verifiers://echo2_wire_probe", "verifiers"),  # imports the module the env names
]


def forms(env: str, entry: str) -> dict[str, tuple[str, dict]]:
    """Every way of naming adapter `entry` opening `env`: the URL, the registered name with env in its
    options, the import path it is registered under with the same option."""
    ep = registered(ADAPTERS)[entry]
    return {"url": (env, {}), "name": (entry, {"env": env}), "import-path": (ep.value, {"env": env})}


def depths(adapter: str, options: dict) -> dict[str, tuple[str, dict]]:
    """`adapter` at the top, and as a mixture's component (the mixture itself named either way), two deep."""
    mixture = registered(ADAPTERS)["mixture"].value
    part = {"adapter": adapter, "options": options}
    harmless = {"adapter": "reasoning-gym://chain_sum", "options": {"config": {"max_terms": 2}}}
    return {
        "top": (adapter, options),
        "mixture": ("mixture", {"mix": [harmless, part]}),
        "mixture-by-import-path": (mixture, {"mix": [part]}),
        "mixture-in-a-mixture": ("mixture", {"mix": [{"adapter": mixture, "options": {"mix": [part]}}]}),
    }


CASES = [(env, f"{form}-{depth}", *named)
         for env, entry in GATED
         for form, (adapter, options) in forms(env, entry).items()
         for depth, named in depths(adapter, options).items()]


@pytest.mark.parametrize("env, how, adapter, options", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_naming_form_of_a_gated_adapter_is_judged(env, how, adapter, options):
    cfg = WorkerConfig(adapter=adapter, adapter_options=options, backend="mock")
    with pytest.raises(ConfigError, match=re.escape(f"--allow-plugin {env}")):
        check_plugins(cfg)
    assert env in allowances(cfg)  # what the learner passes its own local workers
    check_plugins(cfg, allowed=allowances(cfg))  # the operator's word admits it, by that exact string


@pytest.mark.parametrize("env, entry", GATED)
def test_the_load_time_guard_refuses_every_form_before_constructing(env, entry, monkeypatch):
    """The second line: under `enforced`, load_adapter shows each adapter it is about to build to the judge, a
    mixture's components included; the gated factory is never called."""
    ep = registered(ADAPTERS)[entry]
    module, _, attr = ep.value.partition(":")

    original = getattr(importlib.import_module(module), attr)

    def constructed(*args, **kwargs):
        if kwargs.get("env") == env:
            raise AssertionError(f"{ep.value} was constructed with env {env}")
        return original(*args, **kwargs)  # the mixture's harmless component

    monkeypatch.setattr(importlib.import_module(module), attr, constructed)
    for form, (adapter, options) in forms(env, entry).items():
        for depth, (name, opts) in depths(adapter, options).items():
            if depth == "mixture-in-a-mixture":
                continue  # the mixture refuses a mixture component itself (covered by the walk above)
            with enforced(()), pytest.raises(ConfigError, match=re.escape(f"--allow-plugin {env}")):
                load_adapter(name, opts)


def test_every_registered_adapter_resolves_the_same_by_each_name_and_every_load_is_judged():
    """A new way of naming an adapter, or a new load path that skips the judge, fails here: for every adapter
    registered on this machine, its name and its import path (and its URL, for a scheme) resolve to the same
    target and options, and load_adapter calls the guard before it imports or constructs anything."""
    eps = registered(ADAPTERS)
    assert {"sandbox", "reasoning-gym", "verifiers", "mixture"} <= set(eps)
    for name, ep in eps.items():
        options = {"env": f"{name}://x"}
        named = [resolve_adapter(name, options), resolve_adapter(ep.value, options)]
        if name not in ("sandbox", "mixture"):
            named.append(resolve_adapter(f"{name}://x"))  # an adapter URL: the adapter with env = the URL
        assert {(r.name, r.target, tuple(r.options.items())) for r in named} == {(name, ep.value, (("env", f"{name}://x"),))}
        for adapter in (name, ep.value):
            seen = []

            def refuse(resolved, seen=seen):
                seen.append(resolved)
                raise ConfigError("judged")

            token = adapter_guard.set(refuse)
            try:
                with pytest.raises(ConfigError, match="judged"):
                    load_adapter(adapter, options)
            finally:
                adapter_guard.reset(token)
            assert [r.target for r in seen] == [ep.value], adapter
    for scheme in registered(ENVS):  # an env URL loads the sandbox adapter
        r = resolve_adapter(f"{scheme}://x")
        assert (r.name, r.options) == ("sandbox", {"env": f"{scheme}://x"})


#: Modules that build an adapter themselves, and why the judge need not see it.
BUILT_ELSEWHERE = {
    "adapters/sandbox.py": "a stream of itself, with the options it was judged with",
    "adapters/evaluate.py": "echo2 evaluate: the operator's own config, never a welcome",
}


def test_gated_adapters_are_built_only_through_load_adapter():
    """The judge sees what load_adapter builds. A module that built a gated adapter (or loaded an adapter's
    entry point) any other way would bypass it: a new one fails here until it is judged or listed with a why."""
    import ast

    gated = {"ReasoningGymAdapter", "SandboxAdapter", "verifiers_adapter", "MixtureAdapter"}
    found = {module for module, name, call in calls(gated | {"load_object"})
             if name in gated or "ADAPTERS" in ast.unparse(call)}
    assert found - {"plugins.py"} == set(BUILT_ELSEWHERE), found


@pytest.mark.parametrize("how", ["name", "import-path", "mixture"])
def test_the_worker_path_scores_no_answer_of_an_impostors_choosing(how, tmp_path):
    """The probe's three forms through the worker's own _setup: refused, nothing scored, no marker. (Before the
    policy judged resolved adapters, _setup loaded countdown and scoring the answer created the marker.)"""
    from echo2sdk.runtime.worker.process import RolloutWorker

    named = forms("reasoning-gym://countdown", "reasoning-gym")
    adapter, options = named["import-path" if how == "import-path" else "name"]
    if how == "mixture":
        adapter, options = depths(adapter, options)["mixture"]
    cfg = WorkerConfig(adapter=adapter, adapter_options=options, backend="mock", model="tiny")
    worker = RolloutWorker("127.0.0.1:1", TOKEN)
    marker = tmp_path / "pwned"
    try:
        worker._setup(cfg)
        refused = ""
    except ConfigError as e:
        refused = str(e)
    else:  # loaded: score the impostor's answer as the worker would
        adapter = worker.adapter
        if how == "mixture":
            adapter = next(a for name, a in adapter._adapters.items() if name != "chain_sum")
        adapter.score(next(iter(adapter.tasks(0))), EVIL.format(marker=str(marker)))
    assert not marker.exists(), "the impostor's answer ran on the worker"
    assert "--allow-plugin reasoning-gym://countdown" in refused


def test_an_allowed_evaluating_generator_still_loads(tmp_path):
    """The operator's allowance is what admits it (the learner's own local workers get it from allowances())."""
    from echo2sdk.runtime.worker.process import RolloutWorker

    cfg = WorkerConfig(adapter="reasoning-gym", adapter_options={"env": "reasoning-gym://countdown"},
                       backend="mock", model="tiny")
    worker = RolloutWorker("127.0.0.1:1", TOKEN, allow_plugins=["reasoning-gym://countdown"])
    worker._setup(cfg)
    assert type(worker.adapter).__name__ == "ReasoningGymAdapter"


@pytest.mark.integration
@pytest.mark.parametrize("how", ["name", "import-path", "mixture"])
def test_a_coordinator_with_the_token_cannot_name_an_evaluating_generator(how, loop):
    """The probe itself: a real `echo2 worker` (no --allow-plugin) and a coordinator that holds the token."""
    adapter, options = forms("reasoning-gym://countdown", "reasoning-gym")["import-path" if how == "import-path" else "name"]
    if how == "mixture":
        adapter, options = depths(adapter, options)["mixture"]
    welcome = {"config": {"adapter": adapter, "adapter_options": options, "backend": "mock", "model": "tiny"}}
    server, port, seen = loop.run(fake_coordinator(TOKEN, welcome))
    try:
        rc, out = finish(spawn_worker(port, TOKEN, "--reconnect-s", "0"), timeout=90)
    finally:
        loop.loop.call_soon_threadsafe(server.close)
    assert seen, out
    assert rc == 2 and "refusing the coordinator's worker config" in out, out
    assert "--allow-plugin reasoning-gym://countdown" in out and "Traceback" not in out, out
