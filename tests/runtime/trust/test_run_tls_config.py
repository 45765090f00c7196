"""run.tls and run.tls_dir: what a run's coordinator, learner relay and local workers get from them."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from echo2sdk.config import load_config  # noqa: E402
from echo2sdk.errors import ConfigError  # noqa: E402
from echo2sdk.runtime.broadcast.chain import ChainBroadcast  # noqa: E402
from echo2sdk.runtime.trust.tls import Identity  # noqa: E402
from echo2sdk.runtime.learner import build  # noqa: E402
from echo2sdk.runtime.providers.local import worker_command  # noqa: E402


def test_tls_is_on_by_default_with_a_certificate_per_run_or_the_kept_one():
    cfg = load_config(None)
    assert cfg.run.tls and cfg.run.tls_dir is None and build.coordinator_tls(cfg, {}) == {}
    kept = Identity.generate()
    tls = build.coordinator_tls(cfg, {"tls-cert.pem": kept.cert_pem, "tls-key.pem": kept.key_pem})["tls"]
    assert tls.fingerprint == kept.fingerprint
    assert "--plaintext" not in worker_command("127.0.0.1", 1, "w", 0)


def test_tls_dir_gives_the_coordinator_the_certificate_echo2_keys_made(tmp_path):
    made = Identity.generate().save(tmp_path / "keys")
    cfg = load_config(None, [f'run.tls_dir="{made}"'])
    kept = Identity.generate()  # a configured folder wins over a checkpoint's certificate
    tls = build.coordinator_tls(cfg, {"tls-cert.pem": kept.cert_pem, "tls-key.pem": kept.key_pem})["tls"]
    assert tls.fingerprint == Identity.load(made).fingerprint
    with pytest.raises(ConfigError, match=r"TLS identity in .*missing.*echo2 keys --out"):
        build.coordinator_tls(load_config(None, [f'run.tls_dir="{tmp_path / "missing"}"']), {})


def test_plaintext_is_an_opt_in_that_reaches_the_learner_relay_and_the_local_workers():
    cfg = load_config(None, ["run.tls=false", 'broadcast.topology="chain"'])
    assert build.coordinator_tls(cfg, {}) == {"tls": False}
    assert "--plaintext" in worker_command("127.0.0.1", 1, "w", 0, plaintext=not cfg.run.tls)
    delivery = build.delivery(cfg, "t" * 32)
    try:
        assert isinstance(delivery, ChainBroadcast) and delivery.source.fingerprint == b""
    finally:
        delivery.close()


def test_standby_workers_the_local_provider_starts_get_plaintext_and_the_allowed_plugins(tmp_path, monkeypatch):
    """scheduler.standby machines from the `local` provider are started like the run's own workers: a
    coordinator without TLS needs --plaintext on them too, and the run's pkg.mod:Attr plug-ins --allow-plugin."""
    import subprocess

    from echo2sdk.runtime.providers import load_provider

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: started.append((cmd, kw["env"])))
    provider = load_provider("local", connect="127.0.0.1:7", token="tok", log_dir=tmp_path, allow=["m.n:A"],
                             plaintext=True)
    provider.start("standby-0", 0.25)
    (cmd, env), = started
    assert cmd[cmd.index("--connect") + 1] == "127.0.0.1:7" and "--plaintext" in cmd
    assert cmd[cmd.index("--allow-plugin") + 1] == "m.n:A" and cmd[cmd.index("--price") + 1] == "0.25"
    assert env["ECHO2_TOKEN"] == "tok" and "tok" not in cmd
    load_provider("local", connect="127.0.0.1:7", token="tok", log_dir=tmp_path).start("standby-1")
    assert "--plaintext" not in started[1][0] and "--allow-plugin" not in started[1][0]
