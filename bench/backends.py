"""Inference backends side by side: generation throughput and snapshot install latency.

For each backend and dtype (each in a fresh process: vLLM pins threads and patches torch process-wide):

* tokens/s at batch 8, 16 and 64: math-task chat prompts (the main job's), temperature 0.8, natural
  stopping (end-of-sequence, or max_new_tokens); the rate is
  all generated tokens / all wall time over --repeats calls (each a different seed) after one warm-up
  call: with natural stopping a call lasts as long as its longest row, so single calls vary a lot;
* install latency: from the snapshot's last byte being in memory (install() called with the bytes) to the
  first token generated under the new version (a 1-token generate after install() returns), median of
  --repeats installs of a learner-style bfloat16 snapshot of the same model.

The baseline is the hf backend at float32 in the same run; each vLLM line carries its speed-up over it.
Prints one JSON line per measurement, with its parameters.

    .venv/bin/python bench/backends.py                       # hf float32, vllm bfloat16 and float32
    .venv/bin/python bench/backends.py --backends vllm --dtypes bfloat16 --batches 16
    .venv/bin/python bench/backends.py --backends openai     # starts `vllm serve` on loopback
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    from echo2sdk.plugins import load_adapter

    adapter = load_adapter("math", {"difficulty": 1})
    tasks = adapter.tasks(seed)
    return [list(next(tasks).messages) for _ in range(n)]


def _serve(folder: str, dtype: str, threads: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_LOGGING_LEVEL="WARNING", OMP_NUM_THREADS=str(threads))
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--enforce-eager",
        "--kv-cache-memory-bytes", str(1 << 30), "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm", "--worker-extension-cls", "echo2sdk.backends.vllm.Echo2WorkerExtension",
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192",  # seeded requests on CPU
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return proc, url
        except OSError:
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("vllm serve did not start")


def measure(backend: str, dtype: str, model: str, batches: list[int], repeats: int, max_new: int, threads: int) -> None:
    """One backend and dtype, in this process; prints its JSON lines."""
    import torch

    from echo2sdk.core.contracts import SamplingParams
    from echo2sdk.core.snapshot import snapshot_bytes
    from echo2sdk.weights import folder_state, resolve_model
    from echo2sdk.plugins import load_backend_class
    from echo2sdk.testing.backend_check import _perturbed

    folder = resolve_model(model)
    server = None
    options: dict = {"dtype": dtype}
    if backend in ("hf", "vllm"):
        options["threads"] = threads
    if backend == "openai":
        server, url = _serve(folder, dtype, threads)
        options = {"base_url": url}
    base = {"backend": backend, "dtype": dtype, "model": model, "threads": threads, "max_new_tokens": max_new}
    try:
        t0 = time.perf_counter()
        be = load_backend_class(backend)(folder, **options)
        print(json.dumps({**base, "metric": "start_s", "value": round(time.perf_counter() - t0, 2)}), flush=True)
        chats = _prompts(max(batches))
        prompts = [be.encode_chat(c) for c in chats]
        for batch in batches:
            rates, lengths, tokens_all, wall_all = [], [], 0, 0.0
            for r in range(repeats + 1):  # the first call warms up
                params = SamplingParams(max_new_tokens=max_new, temperature=0.8, seed=1000 * batch + r)
                t0 = time.perf_counter()
                samples = be.generate(prompts[:batch], params)
                dt = time.perf_counter() - t0
                if r:
                    tokens = sum(len(s.token_ids) for s in samples)
                    rates.append(tokens / dt)
                    lengths.append(tokens / batch)
                    tokens_all, wall_all = tokens_all + tokens, wall_all + dt
                    stopped = sum(s.finish_reason == "stop" for s in samples) / batch
            print(json.dumps({
                **base, "metric": "tokens_per_s", "batch": batch, "value": round(tokens_all / wall_all, 1),
                "runs": [round(x, 1) for x in rates], "mean_tokens": round(statistics.mean(lengths), 1),
                "stopped_share": round(stopped, 2), "temperature": 0.8,
            }), flush=True)  # fmt: skip
        snapshot = snapshot_bytes(_perturbed(folder_state(folder)), dtype="bfloat16")  # what the learner publishes
        one = SamplingParams(max_new_tokens=1, temperature=0.8, seed=7)
        latencies, installs = [], []
        for r in range(repeats):
            t0 = time.perf_counter()
            be.install(be.version + 1, snapshot)
            t1 = time.perf_counter()
            be.generate(prompts[:1], one)
            latencies.append(time.perf_counter() - t0)
            installs.append(t1 - t0)
        print(json.dumps({
            **base, "metric": "install_to_first_token_s", "value": round(statistics.median(latencies), 3),
            "runs": [round(x, 3) for x in latencies], "install_s": round(statistics.median(installs), 3),
            "snapshot_mb": round(len(snapshot) / 2**20, 1), "snapshot_dtype": "bfloat16",
        }), flush=True)  # fmt: skip
        be.close()
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    del torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--backends", default="hf,vllm", help="comma-separated: hf, vllm, openai, sglang")
    p.add_argument("--dtypes", default=None, help="comma-separated; default: hf float32, others bfloat16 and float32")
    p.add_argument("--batches", default="8,16,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--one", nargs=2, metavar=("BACKEND", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.one:
        measure(args.one[0], args.one[1], args.model, batches, args.repeats, args.max_new_tokens, args.threads)
        return
    runs = []
    for backend in args.backends.split(","):
        dtypes = args.dtypes.split(",") if args.dtypes else (["float32"] if backend == "hf" else ["bfloat16", "float32"])
        runs += [(backend, d) for d in dtypes]
    rows = []
    for backend, dtype in runs:
        cmd = [sys.executable, __file__, "--one", backend, dtype, "--model", args.model, "--batches", args.batches,
               "--repeats", str(args.repeats), "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]  # fmt: skip
        env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
        with tempfile.TemporaryFile("w+") as errors:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT)
            got = []
            assert proc.stdout is not None
            for line in proc.stdout:  # streamed: each measurement is printed as soon as it is made
                if line.startswith("{"):
                    got.append(json.loads(line))
                    print(line.strip(), flush=True)
            if proc.wait():
                errors.seek(0)
                print(json.dumps({"backend": backend, "dtype": dtype, "error": errors.read()[-2000:]}), flush=True)
        rows += got
    baseline = {r["batch"]: r["value"] for r in rows if r.get("metric") == "tokens_per_s" and r["backend"] == "hf" and r["dtype"] == "float32"}
    for r in rows:
        if r.get("metric") == "tokens_per_s" and r["backend"] != "hf" and r["batch"] in baseline:
            print(json.dumps({
                "metric": "speedup_vs_hf_float32", "backend": r["backend"], "dtype": r["dtype"], "batch": r["batch"],
                "value": round(r["value"] / baseline[r["batch"]], 2), "model": r["model"],
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
