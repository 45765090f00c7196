"""A coordinator - an impostor, or one that knows the token - can make a worker import nothing but the
plug-ins registered on the worker's machine or allowed by its operator (`echo2 worker --allow-plugin`)."""

from __future__ import annotations

import pytest
from _peers import TOKEN, LoopThread, fake_coordinator, finish, spawn_worker

from echo2sdk.errors import ConfigError
from echo2sdk.runtime.protocol.messages import WorkerConfig
from echo2sdk.runtime.trust.plugin_policy import check_plugins

pytestmark = pytest.mark.integration


def _run(loop: LoopThread, token: str, welcome: dict, *args: str, sealed: bool = True) -> tuple[int, str, list]:
    server, port, seen = loop.run(fake_coordinator(token, welcome, sealed=sealed))
    try:
        rc, out = finish(spawn_worker(port, TOKEN, "--reconnect-s", "0", *args), timeout=90)
    finally:
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
    return rc, out, seen


def _popen_welcome(marker) -> dict:
    return {"config": {"adapter": "subprocess:Popen", "adapter_options": {"args": ["touch", str(marker)]},
                       "backend": "os:system", "model": f"touch {marker}"}}


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed-with-a-wrong-token", "unsealed"])
def test_an_impostor_coordinator_runs_nothing_and_is_named(loop, tmp_path, sealed):
    marker = tmp_path / "pwned"
    rc, out, seen = _run(loop, "not-the-token", _popen_welcome(marker), sealed=sealed)
    assert seen, out  # the worker did talk to it
    assert rc == 2 and not marker.exists(), out
    assert "failed authentication" in out if sealed else "unsealed 'welcome' frame" in out
    assert "Traceback" not in out


def test_a_coordinator_that_knows_the_token_cannot_name_an_import(loop, tmp_path):
    marker = tmp_path / "pwned"
    rc, out, _ = _run(loop, TOKEN, _popen_welcome(marker))
    assert rc == 2 and not marker.exists(), out
    assert "refusing the coordinator's worker config" in out
    assert "adapter 'subprocess:Popen', which is not registered in group 'echo2sdk.adapters'" in out
    assert "--allow-plugin subprocess:Popen" in out and "Traceback" not in out


def test_a_backend_or_an_option_naming_an_import_is_refused_too(loop, tmp_path):
    marker = tmp_path / "pwned"
    welcome = {"config": {"adapter": "math", "backend": "os:system", "model": f"touch {marker}"}}
    rc, out, _ = _run(loop, TOKEN, welcome)
    assert rc == 2 and not marker.exists() and "backend 'os:system'" in out, out
    welcome = {"config": {"adapter": "gym://FrozenLake-v1", "adapter_options": {"serializer": "os:system"},
                          "backend": "mock"}}
    rc, out, _ = _run(loop, TOKEN, welcome)
    assert rc == 2 and "adapter_options name 'os:system'" in out, out


def test_options_an_allowed_plugin_rejects_are_a_clean_refusal(loop):
    welcome = {"config": {"adapter": "echo2sdk.testing:ToyAdapter", "adapter_options": {"bogus": 1},
                          "backend": "mock"}}
    rc, out, _ = _run(loop, TOKEN, welcome)  # registered as `toy`: no --allow-plugin needed
    assert rc == 2 and "rejected options" in out and "bogus" in out and "Traceback" not in out, out


# -- the policy itself ------------------------------------------------------------------------------------
def _cfg(**kw) -> WorkerConfig:
    return WorkerConfig(**{"adapter": "math", **kw})


def test_registered_names_and_their_entry_point_values_load_without_a_flag():
    check_plugins(_cfg(adapter="math", backend="mock"))
    check_plugins(_cfg(adapter="sandbox", backend="echo2sdk.testing:MockBackend"))  # the value "mock" is registered as
    check_plugins(_cfg(adapter="gym://FrozenLake-v1", adapter_options={"serializer": "text"}, backend="hf"))
    check_plugins(_cfg(adapter="math", backend="unregistered-plain-name"))  # looked up, never imported: NameNotFound later
    with pytest.raises(ConfigError, match="adapter '' loads nothing here"):
        check_plugins(_cfg(adapter=""))  # resolved as load_adapter resolves it: nothing to load is a refusal


@pytest.mark.parametrize(
    "cfg,match",
    [
        (dict(adapter="echo2sdk.testing:CheckResult"), "adapter 'echo2sdk.testing:CheckResult'"),
        (dict(backend="builtins:eval"), "backend 'builtins:eval'"),
        (dict(adapter="nosuch://x"), "unknown URL scheme .* 'nosuch'"),
        (dict(adapter="math", adapter_options={"a": [{"b": ("x", "os.path:join")}]}), "'os.path:join'"),
        (dict(backend_options={"factory": "pkg.mod:Outer.Inner"}), "'pkg.mod:Outer.Inner'"),
    ],
)
def test_unregistered_references_need_the_operators_allowance(cfg, match):
    with pytest.raises(ConfigError, match=match):
        check_plugins(_cfg(**cfg))
    refs = [v for v in (cfg.get("adapter"), cfg.get("backend")) if v and ":" in v and "://" not in v]
    refs += ["os.path:join", "pkg.mod:Outer.Inner"]
    if "nosuch" not in str(cfg):
        check_plugins(_cfg(**cfg), allowed=refs)  # allowed by exact string: fine


def test_ordinary_option_strings_are_not_mistaken_for_imports():
    check_plugins(_cfg(adapter="math", adapter_options={"url": "http://x:8000/v1", "t": "12:30", "role": "a : b"}))


def test_allowances_name_exactly_what_a_config_needs():
    from echo2sdk.runtime.trust.plugin_policy import allowances

    cfg = {"adapter": "echo2sdk.testing:CheckResult", "backend": "echo2sdk.testing:MockBackend",
           "adapter_options": {"serializer": "my.pkg:Ser", "n": 3}, "backend_options": {}}
    assert allowances(cfg) == ["echo2sdk.testing:CheckResult", "my.pkg:Ser"]  # MockBackend, ToyAdapter are registered
    check_plugins(WorkerConfig.from_mapping(cfg), allowances(cfg))
    assert allowances({"adapter": "math", "backend": "hf"}) == []


@pytest.mark.parametrize("adapter,env", [("verifiers", "verifiers://echo2_wire_probe"),
                                         ("echo2sdk.adapters.verifiers:verifiers_adapter", "echo2_wire_probe"),
                                         ("verifiers://echo2_wire_probe", None)])  # the one-line config form
def test_a_verifiers_env_is_an_import_too(tmp_path, monkeypatch, adapter, env):
    """The verifiers adapter imports the module its env names and calls its load_environment(**env_args): a
    module that is on the worker's path but no installed verifiers environment needs the operator's allowance."""
    (tmp_path / "echo2_wire_probe.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n"
        "def load_environment(**kw):\n    raise RuntimeError('called')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    options = {"env_args": {"cmd": "x"}} | ({"env": env} if env is not None else {})
    cfg = _cfg(adapter=adapter, adapter_options=options)
    with pytest.raises(ConfigError, match="--allow-plugin verifiers://echo2_wire_probe"):
        check_plugins(cfg)
    assert not (tmp_path / "imported").exists()
    from echo2sdk.runtime.trust.plugin_policy import allowances

    assert allowances(cfg) == ["verifiers://echo2_wire_probe"]
    check_plugins(cfg, allowed=allowances(cfg))  # the operator's (or the learner's own) allowance


@pytest.mark.parametrize("options, needs", [
    ({"engine_options": {"worker_extension_cls": "os.path.join"}}, "backend_options.engine_options"),
    ({"engine_options": {"trust_remote_code": True}}, "backend_options.engine_options"),
    ({"dtype": "float32", "trust_remote_code": True}, "trust_remote_code"),
])
def test_engine_pass_through_and_remote_code_need_the_operators_allowance(options, needs):
    """vllm and sglang hand `engine_options` to their engine as they are: vLLM imports the dotted class names
    some of them hold (worker_extension_cls, worker_cls, scheduler_cls, logits_processors), and
    trust_remote_code runs the model repository's Python. A coordinator sets neither on its own."""
    from echo2sdk.runtime.trust.plugin_policy import allowances

    cfg = _cfg(adapter="math", backend="vllm", model="someone/model", backend_options=options)
    with pytest.raises(ConfigError, match=f"--allow-plugin {needs}"):
        check_plugins(cfg)
    assert needs in allowances(cfg)
    check_plugins(cfg, allowed=allowances(cfg))  # the operator's (or the learner's own) allowance
    check_plugins(_cfg(adapter="math", backend="vllm", backend_options={"engine_options": {},
                                                                          "trust_remote_code": False}))


def test_an_env_id_that_names_a_module_needs_the_operators_allowance():
    """gymnasium reads an id "module:Env" as an import of `module` (issue 34: gym://module:Env passed the policy,
    and only the gym plug-in's registry check stopped it). The policy refuses a ':' in any env id."""
    for name in ("gym://os:system", "gym://evil.pkg:Env-v0"):
        with pytest.raises(ConfigError, match=rf"env '{name}' has a ':' in its env id.*--allow-plugin {name}"):
            check_plugins(_cfg(adapter=name))
        check_plugins(_cfg(adapter=name), allowed=[name])  # the operator allowed that exact env
    check_plugins(_cfg(adapter="gym://ALE/Pong-v5"))  # a namespaced id without ':' is a registry lookup


@pytest.mark.parametrize("name, value", [("base_url", "http://10.0.0.5/admin/reset?confirm=yes#"),
                                         ("snapshot_dir", "/any/folder")])
def test_where_a_backend_connects_or_writes_needs_the_operator(name, value):
    """The openai backend's server and snapshot folder (found by the attacker review: a coordinator sent a worker's
    requests to an internal address and made it create a folder anywhere); its default is a server on this machine."""
    from echo2sdk.runtime.trust.plugin_policy import allowances

    cfg = _cfg(backend="openai", backend_options={name: value})
    with pytest.raises(ConfigError, match=f"--allow-plugin backend_options.{name}"):
        check_plugins(cfg)
    assert allowances(cfg) == [f"backend_options.{name}"]
    check_plugins(cfg, allowed=allowances(cfg))
