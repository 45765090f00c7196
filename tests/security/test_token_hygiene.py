"""Token hygiene: the token from a file or the environment rather than argv (a warning there), a 128-bit
minimum for tokens users give the run, and errors that name the source and the length, never the token."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from _peers import finish, make_coordinator, wait

from echo2sdk.config import load_config
from echo2sdk.errors import ConfigError
from echo2sdk.runtime.trust.credentials import MIN_TOKEN_BITS, check_token, given_token, new_token, read_token_file, token_bits

STRONG = new_token()  # never starts with '-', which argv would read as an option


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`echo2 ARGS` with this environment, $ECHO2_TOKEN only if `env` gives it."""
    env = {k: v for k, v in os.environ.items() if k != "ECHO2_TOKEN"} | (env or {})
    return subprocess.run([sys.executable, "-m", "echo2sdk.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_strength_is_length_times_alphabet_bits():
    assert token_bits(secrets.token_urlsafe(16)) >= MIN_TOKEN_BITS  # 22 url-safe base64 characters
    assert token_bits(secrets.token_hex(16)) == MIN_TOKEN_BITS  # 32 hex digits
    drawn = [new_token() for _ in range(2000)]  # 1 in 64 url-safe tokens starts with "-": new_token redraws those
    assert not any(t.startswith("-") for t in drawn) and len(set(drawn)) == 2000 and token_bits(drawn[0]) >= 192
    assert token_bits("x" * 21) == 126 < MIN_TOKEN_BITS
    assert token_bits("f" * 31) == 124 and token_bits("x" * 22) == 132
    with pytest.raises(ConfigError, match=r"run.token: the token is 6 characters, about 36 bits; the minimum is 128") as e:
        check_token("s3cret", "run.token")
    assert "s3cret" not in str(e.value)


def test_a_weak_token_is_refused_by_the_run_from_every_source(tmp_path):
    with pytest.raises(ConfigError, match=r"run.token: the token is 12 characters") as e:
        load_config(None, ['run.token="hunter2hunte"'])
    assert "hunter2hunte" not in str(e.value)
    weak = tmp_path / "weak"
    weak.write_text("0123abcd\n")
    with pytest.raises(ConfigError, match=r"run.token_file .*weak.: the token is 8 characters, about 32 bits"):
        check_token(*given_token(None, weak, {}))
    with pytest.raises(ConfigError, match=r"\$ECHO2_TOKEN: the token is 5 characters"):
        check_token(*given_token(None, None, {"ECHO2_TOKEN": "short"}))
    with pytest.raises(ConfigError, match=r"give the token once"):
        given_token(STRONG, weak, {})
    assert given_token(None, None, {}) is None
    good = tmp_path / "good"
    good.write_text(f"  {STRONG}\n")
    assert given_token(None, good, {"ECHO2_TOKEN": "ignored"}) == (STRONG, f"run.token_file {str(good)!r}")
    with pytest.raises(ConfigError, match=r"cannot read it"):
        read_token_file(tmp_path / "missing")
    (tmp_path / "two").write_text("one two\n")
    with pytest.raises(ConfigError, match=r"one token on one line"):
        read_token_file(tmp_path / "two")


def test_a_token_file_other_users_can_read_is_read_with_a_warning(tmp_path, caplog):
    path = tmp_path / "token"
    path.write_text(STRONG)
    path.chmod(0o600)
    with caplog.at_level("WARNING", logger="echo2sdk.credentials"):
        assert read_token_file(path) == STRONG
    assert not caplog.records
    path.chmod(0o644)
    with caplog.at_level("WARNING", logger="echo2sdk.credentials"):
        assert read_token_file(path) == STRONG
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "mode 0644" in msg and "chmod 600" in msg and STRONG not in msg


def test_echo2_run_warns_about_a_token_on_argv_and_refuses_a_weak_one(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("")
    r = _cli("run", str(config), "--out", str(tmp_path / "out"), "--set", 'run.token="tooshort"')
    assert r.returncode == 2, r.stderr
    assert "--set run.token: the token is on the command line" in r.stderr and "--token-file PATH" in r.stderr
    assert "run.token: the token is 8 characters, about 48 bits; the minimum is 128 bits" in r.stderr
    r = _cli("run", str(config), "--out", str(tmp_path / "out"), env={"ECHO2_TOKEN": "tooshort"})
    assert r.returncode == 2 and "$ECHO2_TOKEN: the token is 8 characters" in r.stderr, r.stderr
    assert "command line" not in r.stderr
    weak = tmp_path / "weak"
    weak.write_text("0123456789abcdef0123456789abcde\n")  # 31 hex digits: 124 bits
    r = _cli("run", str(config), "--out", str(tmp_path / "out"), "--token-file", str(weak))
    assert r.returncode == 2 and f"run.token_file {str(weak)!r}: the token is 31 characters, about 124 bits" in r.stderr
    assert not (tmp_path / "out").exists()  # refused before the run made its folder


@pytest.mark.integration
def test_a_worker_joins_with_token_file_and_warns_about_token_on_argv(tmp_path):
    c = make_coordinator(token=STRONG)
    secret = tmp_path / "token"
    secret.write_text(STRONG + "\n")
    secret.chmod(0o600)
    base = ["worker", "--connect", f"127.0.0.1:{c.port}", "--relay-only", "--reconnect-s", "0"]
    env = {k: v for k, v in os.environ.items() if k != "ECHO2_TOKEN"}
    procs = {
        "from-file": subprocess.Popen([sys.executable, "-m", "echo2sdk.cli", *base, "--id", "from-file",
                                       "--token-file", str(secret)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True),
        "from-argv": subprocess.Popen([sys.executable, "-m", "echo2sdk.cli", *base, "--id", "from-argv",
                                       "--token", STRONG], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True),
    }
    try:
        assert wait(lambda: {"from-file", "from-argv"} <= set(c.workers), 60), [finish(p, 1)[1] for p in procs.values()]
    finally:
        c.stop()
        out = {w: finish(p, 30)[1] for w, p in procs.items()}
    assert "the token is on the command line" in out["from-argv"] and "--token-file PATH" in out["from-argv"]
    assert "command line" not in out["from-file"]
    missing = _cli("worker", "--connect", "127.0.0.1:9", "--token-file", str(tmp_path / "nope"), env=env)
    assert missing.returncode == 2 and "token file" in missing.stderr and "nope" in missing.stderr
    weak = _cli("worker", "--connect", "127.0.0.1:9", "--connect-timeout-s", "0", env={"ECHO2_TOKEN": "abc"})
    assert "$ECHO2_TOKEN) is 3 characters, about 12 bits: under the 128 bits a run requires" in weak.stderr
