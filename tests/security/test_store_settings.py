"""What a worker does with the snapshot store a welcome names (runtime/trust/store_policy.py).

An attacker's probe (a coordinator holding the run's token, 2026-12-07) found the worker handing the welcome's
store URL and options to the storage library as they came: with container-credential options naming a file and an
endpoint, the worker read the file and sent its contents as an Authorization header to the impostor's HTTP server;
with AWS variables set, a redirected endpoint received the key id and session token over plain HTTP; a
credentials file ending in a newline made the library panic past the worker's `except Exception` (no refusal, no
push fallback). Each probe runs here against a real `echo2 worker`, a local HTTP server standing in for the
attacker; every address is on loopback."""

from __future__ import annotations

import http.server
import os
import threading

import pytest
from _calls import calls
from _peers import TOKEN, fake_coordinator, finish, spawn_worker

from echo2sdk.errors import ConfigError
from echo2sdk.runtime.protocol.messages import StoreInfo
from echo2sdk.runtime.trust.store_policy import store_allowances, store_settings

pytest.importorskip("obstore")

SECRET = "probe-secret-4f1c"


class Attacker:
    """An HTTP server on loopback that records every request (method, path, headers) and answers 404."""

    def __init__(self, body: bytes = b""):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                seen.append((self.command, self.path, dict(self.headers)))
                self.send_response(403 if body else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_HEAD = _any

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def heard(self, text: str) -> bool:
        return any(text in f"{m} {p} {h}" for m, p, h in self.seen)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker():
    a = Attacker()
    yield a
    a.close()


def _probe(loop, options: dict, url: str = "s3://bucket/run", *args: str, env: dict | None = None) -> tuple[int, str, list]:
    """A real worker (no allowances unless `args`) welcomed by a coordinator that holds the token, whose welcome
    names the store `url` with `options`, and which then says the snapshot is in the store. Returns the worker's
    exit code, its output and the frames it sent (a snapshot_rejected among them: the push fallback)."""
    welcome = {"config": {"adapter": "toy", "backend": "mock"},
               "broadcast": {"public_key": b"k" * 32, "store": {"url": url, "options": options}}}
    frames: list[dict] = []
    server, port, seen = loop.run(fake_coordinator(TOKEN, welcome, then=[{"type": "snapshot_in_store", "version": 1}],
                                                   until="snapshot_rejected", frames=frames))
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})  # the worker inherits it (spawn_worker copies os.environ)
    try:
        rc, out = finish(spawn_worker(port, TOKEN, "--reconnect-s", "0", *args), timeout=90)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        loop.loop.call_soon_threadsafe(server.close)
    assert seen, out
    return rc, out, frames


def _rejected(frames: list[dict]) -> str:
    reasons = [f["reason"] for f in frames if f.get("type") == "snapshot_rejected" and f.get("from_store")]
    assert reasons, frames
    return reasons[0]


@pytest.mark.integration
def test_container_credential_options_send_no_local_file_anywhere(loop, attacker, tmp_path):
    secret = tmp_path / "token"
    secret.write_text(SECRET)
    options = {"aws_container_credentials_full_uri": f"{attacker.url}/creds",
               "aws_container_authorization_token_file": str(secret), "endpoint": attacker.url,
               "region": "us-east-1", "allow_http": "true"}
    rc, out, frames = _probe(loop, options)
    assert not attacker.seen, attacker.seen  # before: GET /creds with "Authorization: probe-secret-4f1c"
    reason = _rejected(frames)
    assert "aws_container_authorization_token_file" in reason and "--allow-plugin store." in reason, reason
    assert "Traceback" not in out and SECRET not in out


@pytest.mark.integration
def test_a_redirected_endpoint_gets_none_of_this_machines_credentials(loop, attacker):
    env = {"AWS_ACCESS_KEY_ID": "AKIDPROBE", "AWS_SECRET_ACCESS_KEY": "probe-secret", "AWS_SESSION_TOKEN": SECRET}
    rc, out, frames = _probe(loop, {"endpoint": attacker.url, "allow_http": "true", "region": "us-east-1"}, env=env)
    assert not attacker.heard("AKIDPROBE") and not attacker.heard(SECRET), attacker.seen  # before: both, plain HTTP
    reason = _rejected(frames)
    assert "decides where this worker's credentials go" in reason and f"store.endpoint={attacker.url}" in reason


@pytest.mark.integration
def test_a_metadata_endpoint_option_is_refused(loop, attacker):
    rc, out, frames = _probe(loop, {"aws_metadata_endpoint": attacker.url, "endpoint": attacker.url,
                                    "allow_http": "true"})
    assert not any("/latest/" in p for _, p, _ in attacker.seen), attacker.seen
    assert "aws_metadata_endpoint" in _rejected(frames)


@pytest.mark.integration
def test_a_panic_of_the_storage_library_is_a_refusal_and_the_push_fallback(loop, attacker, tmp_path):
    """The operator allowed the container-credential options; the token file ends in a newline, which obstore
    puts in a header and panics on (pyo3's PanicException is no Exception). The worker refuses, reports it (the
    coordinator pushes the snapshot whole) and lives on."""
    secret = tmp_path / "token"
    secret.write_text(SECRET + "\n")
    options = {"aws_container_credentials_full_uri": f"{attacker.url}/creds",
               "aws_container_authorization_token_file": str(secret), "endpoint": attacker.url,
               "region": "us-east-1", "allow_http": "true"}
    allow = [a for name in options for a in ("--allow-plugin", f"store.{name}")]
    rc, out, frames = _probe(loop, options, "s3://bucket/run", *allow)
    reason = _rejected(frames)
    assert "PanicException" in reason, reason
    assert "Task exception was never retrieved" not in out, out


@pytest.mark.integration
def test_a_local_folder_store_needs_the_operator_and_is_never_made(loop, tmp_path):
    folder = tmp_path / "made-by-the-coordinator"
    rc, out, frames = _probe(loop, {}, f"file://{folder}")
    assert not folder.exists()  # before: obstore made it (mkdir) wherever the welcome said
    assert "--allow-plugin store.local" in _rejected(frames)


@pytest.mark.integration
def test_what_a_server_answers_stays_on_the_worker(loop):
    """An unsigned worker may read from an endpoint the coordinator names (nothing secret goes), but the library's
    error quotes the server's answer: it stays in the worker's log, and the refusal that travels names its kind."""
    answer = b'{"Code":"Success","AccessKeyId":"ASIAINTERNAL","SecretAccessKey":"' + SECRET.encode() + b'"}'
    internal = Attacker(body=answer)  # an internal service the worker can reach and the coordinator cannot
    try:
        rc, out, frames = _probe(loop, {"endpoint": internal.url, "allow_http": "true", "region": "us-east-1"},
                                 env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""})
    finally:
        internal.close()
    assert internal.seen and not any("authorization" in h for _, _, h in internal.seen)  # read, unsigned
    reason = _rejected(frames)
    assert SECRET not in reason and "ASIAINTERNAL" not in reason and "log has" in reason, reason


# -- the policy itself ------------------------------------------------------------------------------------
def _info(url="s3://b/r", **options) -> StoreInfo:
    return StoreInfo(url=url, options=options)


NO_CREDENTIALS: dict[str, str] = {}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}


@pytest.mark.parametrize("info, env, allowed, refused", [
    (_info(region="eu-west-1"), CREDENTIALS, [], None),
    (_info(endpoint="http://a:1", allow_http="true"), NO_CREDENTIALS, [], None),  # unsigned: nothing secret goes
    (_info(endpoint="http://a:1"), CREDENTIALS, [], "store.endpoint=http://a:1"),
    (_info(endpoint="http://a:1"), CREDENTIALS, ["store.endpoint=http://a:1"], None),
    (_info(endpoint="http://a:1"), CREDENTIALS, ["store.endpoint=http://b:1"], "store.endpoint=http://a:1"),
    (_info(endpoint="http://a:1"), CREDENTIALS, ["store.endpoint"], None),  # any value
    (_info(endpoint="http://a:1"), {**CREDENTIALS, "AWS_ENDPOINT": "http://a:1"}, [], None),  # this machine's own
    (_info(endpoint="http://a:1"), NO_CREDENTIALS, ["store.metadata"], "store.endpoint=http://a:1"),  # signs then
    (_info(aws_web_identity_token_file="/etc/passwd"), NO_CREDENTIALS, [], "store.aws_web_identity_token_file="),
    (_info(url="file:///x"), NO_CREDENTIALS, [], "store.local"),
    (_info(url="file:///x"), NO_CREDENTIALS, ["store.local"], None),
    (_info(url="http://a:1/x"), NO_CREDENTIALS, ["store.local"], "scheme 'http' is not one a worker reads"),
    (_info(url="memory://x"), NO_CREDENTIALS, [], "scheme 'memory'"),
    # obstore builds host names from these (https://s3.{region}.amazonaws.com): a value with '@' or '/' moves the
    # signed request to another host (found by the attacker review)
    (_info(region="x@attacker.example:443/"), CREDENTIALS, [], "region = 'x@attacker.example:443/' is not of the form"),
    (_info(url="az://c/r", account_name="a@attacker.example/"), {"AZURE_STORAGE_SAS_TOKEN": "sv=1"}, [], "account_name"),
    (_info(endpoint="http://a:1/path?x#"), NO_CREDENTIALS, [], "endpoint = 'http://a:1/path?x#' is not of the form"),
    (_info(endpoint="http://169.254.169.254"), NO_CREDENTIALS, [], "link-local or metadata address"),
    (_info(endpoint="http://metadata.google.internal"), NO_CREDENTIALS, [], "link-local or metadata address"),
    (_info(endpoint="http://[fe80::1]:80"), NO_CREDENTIALS, [], "link-local or metadata address"),
])
def test_what_a_worker_takes_of_a_welcomes_store(info, env, allowed, refused):
    if refused is None:
        assert store_settings(info, allowed, env)[:2] == (info.url, dict(info.options))
    else:
        with pytest.raises(ConfigError, match=refused.replace(".", r"\.").replace("?", r"\?")):
            store_settings(info, allowed, env)


def test_the_learner_gives_its_own_workers_exactly_what_its_store_needs():
    info = _info(endpoint="http://127.0.0.1:9000", allow_http="true", region="us-east-1")
    needs = store_allowances(info, env=CREDENTIALS)
    assert needs == ["store.allow_http=true", "store.endpoint=http://127.0.0.1:9000"]
    store_settings(info, needs, CREDENTIALS)
    assert store_allowances(_info(url="file:///runs/s"), metadata=True, env={}) == ["store.local", "store.metadata"]
    assert store_allowances(None) == []


def test_a_store_without_credentials_never_asks_the_metadata_service(attacker, monkeypatch):
    """obstore asks the instance-metadata service (169.254.169.254) for credentials when the environment has none;
    here its address points at a loopback server (AWS_METADATA_ENDPOINT), so the question would be heard. Without
    the operator's word (metadata) the store is read unsigned and nothing asks; with it, the question comes."""
    import obstore

    from echo2sdk.runtime.broadcast.store import open_object_store

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"{attacker.url}/metadata")
    options = {"endpoint": attacker.url, "allow_http": "true", "region": "us-east-1", "timeout": "5s"}
    for metadata in (False, True):
        store = open_object_store("s3://bucket/run", options, metadata=metadata)
        assert (store.config.get("skip_signature") == "true") is not metadata
        with pytest.raises(Exception):  # noqa: B017 - the server answers 404 to everything
            list(obstore.list(store))
        asked = any(p.startswith("/metadata") for _, p, _ in attacker.seen)
        assert asked is metadata, attacker.seen
        attacker.seen.clear()


def test_stores_are_built_in_one_place():
    """The metadata guard lives in runtime/broadcast/store.open_object_store: a storage client built anywhere else
    in the package would go without it."""
    built = {"from_url", "S3Store", "GCSStore", "AzureStore", "LocalStore", "HTTPStore", "MemoryStore"}
    found = [f"{module}:{call.lineno}" for module, _, call in calls(built)]
    assert [f.split(":")[0] for f in found] == ["runtime/broadcast/store.py"], found


def test_the_learners_own_workers_are_allowed_its_store(monkeypatch):
    """build.worker_allowances: what the learner's local (and provider-started) workers get for the configured store."""
    from types import SimpleNamespace

    from echo2sdk.config import load_config
    from echo2sdk.runtime.learner.build import worker_allowances

    coordinator = SimpleNamespace(worker_config={"adapter": "math", "backend": "hf"})
    for name in ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    assert worker_allowances(load_config(None, ['broadcast.store="/tmp/snapshots"']), coordinator) == ["store.local"]
    cfg = load_config(None, ['broadcast.store="s3://b/r"', 'broadcast.store_metadata=true',
                             'broadcast.store_options={endpoint="http://127.0.0.1:9000"}'])
    assert worker_allowances(cfg, coordinator) == ["store.endpoint=http://127.0.0.1:9000", "store.metadata"]
    assert worker_allowances(load_config(None, []), coordinator) == []
