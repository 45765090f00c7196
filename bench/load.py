"""Intake under load: N synthetic authenticated workers push groups of records into one coordinator.

The coordinator runs in a process of its own (this script with --serve), so its CPU time and memory are its
own (/proc/PID/stat, /proc/PID/status). The workers are asyncio connections in this process speaking the
real protocol over real TCP on loopback: TLS (or plaintext), the token handshake, sealed frames; each asks
for a task and pushes one GRPO group of valid records per period, and waits for the ack. The load generator
shares the machine's cores with the coordinator: its CPU is reported separately.

Phases (each a fresh coordinator, in the same run): by default 1 worker with TLS (the latency baseline),
64 workers with TLS, 64 workers in plaintext (the cost of TLS).

    .venv/bin/python bench/load.py [--seconds 60] [--rate 2] [--phases tls:1,tls:64,plain:64]

One JSON line per phase: records sent, acknowledged and held by the buffer (lost = sent - acknowledged),
p50/p99 intake latency (push sent to its ack), coordinator CPU seconds and share of one core over the window,
its RSS at the end and at peak, the load generator's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import subprocess
import sys
import time

TOKEN = "load-bench-token"
GROUP = 4
VOCAB = 49152
TICK = os.sysconf("SC_CLK_TCK")


# -- the coordinator's process ---------------------------------------------------------------------------
def serve(tls: bool) -> None:
    """Run a coordinator; print its port; answer each stdin line with its counters; stop at EOF."""
    from echo2sdk.core.buffer import StalenessBuffer
    from echo2sdk.runtime.coordinator import Coordinator
    from echo2sdk.testing import ToyAdapter

    logging.getLogger("echo2sdk").setLevel(logging.ERROR)  # each worker leaving at the end would log a warning

    coord = Coordinator(buffer=StalenessBuffer(staleness=2, group_size=GROUP), tasks=ToyAdapter().tasks(0),
                        worker_config={}, vocab_size=VOCAB, max_len=512, token=TOKEN, heartbeat_s=5.0,
                        worker_timeout_s=60.0, tls=tls)
    coord.start()
    print(json.dumps({"port": coord.port}), flush=True)
    for _ in sys.stdin:
        b = coord.buffer.stats()
        print(json.dumps({"admitted": b["admitted"], "held": b["held"], "filtered": b["filtered"],
                          "rejected": sum(coord.rejected.values()), "protocol_errors": coord.protocol_errors,
                          "workers_alive": len(coord.alive_workers())}), flush=True)
    coord.stop()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key + ":")) / 1024


# -- the synthetic workers -------------------------------------------------------------------------------
def _group(worker: str, gid: str, prompt_len: int, response_len: int) -> list[dict]:
    from echo2sdk.core.records import Meta, Trajectory

    out = []
    for i in range(GROUP):
        meta = Meta(group_id=gid, prompt_ids=tuple(range(1, prompt_len + 1)), response_ids=tuple(range(response_len)),
                    logprobs=(-0.5,) * response_len, worker=worker)
        out.append(Trajectory(prompt="q", response="a", reward=float(i % 2), version=0, meta=meta).to_wire())
    return out


async def worker(i: int, port: int, tls: bool, until: float, rate: float, stats: dict, sizes: tuple[int, int]) -> None:
    from echo2sdk.runtime.trust import session
    from echo2sdk.runtime.protocol.messages import Hello
    from echo2sdk.runtime.trust.tls import client_context
    from echo2sdk.runtime.protocol.groups import encode_groups
    from echo2sdk.runtime.protocol.messages import Trajectories, to_header
    from echo2sdk.runtime.protocol.wire import MAX_HEADER, read_frame, write_frame

    # one loopback address per worker, as 64 machines would have (admission caps pending handshakes per IP)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context() if tls else None,
                                                   local_addr=(f"127.0.{1 + i // 250}.{1 + i % 250}", 0))
    hello = Hello(nonce=session.new_nonce(), worker_id=f"load-{i}", session=f"s{i}").model_dump()
    keys, answer, _ = await session.client_handshake(reader, writer, TOKEN, hello)
    wid = answer["worker_id"]
    stats["joined"] += 1

    async def call(header: dict, payload: bytes = b"") -> dict:
        await write_frame(writer, header, payload, key=keys.send)
        return (await read_frame(reader, 0, key=keys.recv, max_header=MAX_HEADER))[0]

    n, period = 0, 1.0 / rate
    next_t = time.monotonic() + period * (i % 16) / 16  # spread the first pushes
    while (now := time.monotonic()) < until:
        await asyncio.sleep(max(0.0, next_t - now))
        next_t += period
        await call({"type": "get_tasks", "n": 1, "rid": 2 * n})
        push = encode_groups([_group(wid, f"{wid}-{n}", *sizes)])  # as a worker encodes it, before the clock
        t0 = time.perf_counter()
        stats["sent"] += GROUP
        ack = await call(to_header(Trajectories.of(push, rid=2 * n + 1, batch=f"{wid}:{n}")), push.payload)
        stats["latency"].append(time.perf_counter() - t0)
        stats["acked"] += ack["accepted"]
        n += 1
    writer.close()
    await writer.wait_closed()


async def load(port: int, tls: bool, workers: int, seconds: float, rate: float, sizes, on_start) -> dict:
    stats = {"sent": 0, "acked": 0, "joined": 0, "latency": []}
    until = time.monotonic() + seconds
    on_start()
    results = await asyncio.gather(*(worker(i, port, tls, until, rate, stats, sizes) for i in range(workers)),
                                   return_exceptions=True)
    stats["errors"] = [repr(r) for r in results if isinstance(r, BaseException)]
    return stats


# -- one phase -------------------------------------------------------------------------------------------
def phase(tls: bool, workers: int, args: argparse.Namespace) -> dict:
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--tls", str(int(tls))], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["port"]
        mark: dict[str, float] = {}

        def on_start() -> None:
            mark.update(cpu=_cpu_s(server.pid), t=time.monotonic(), gen=_self_cpu())

        stats = asyncio.run(load(port, tls, workers, args.seconds, args.rate, (args.prompt, args.response), on_start))
        window = time.monotonic() - mark["t"]
        cpu = _cpu_s(server.pid) - mark["cpu"]
        server.stdin.write("stats\n")
        server.stdin.flush()
        counters = json.loads(server.stdout.readline())
        rss, peak = _mib(server.pid, "VmRSS"), _mib(server.pid, "VmHWM")
    finally:
        server.stdin.close()
        server.wait(30)
    lat = sorted(stats["latency"]) or [float("nan")]
    return {
        "measure": "intake_load", "tls": tls, "workers": workers, "joined": stats["joined"], "seconds": args.seconds,
        "rate_per_worker": args.rate,
        "group_size": GROUP, "prompt_tokens": args.prompt, "response_tokens": args.response,
        "sent": stats["sent"], "acknowledged": stats["acked"], "in_buffer": counters["held"],
        "admitted": counters["admitted"], "lost": stats["sent"] - stats["acked"], "rejected": counters["rejected"],
        "protocol_errors": counters["protocol_errors"], "worker_errors": len(stats["errors"]),
        "first_error": stats["errors"][:1],
        "pushes_per_s": round(len(stats["latency"]) / window, 1),
        "p50_ms": round(1e3 * lat[len(lat) // 2], 2),
        "p99_ms": round(1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "coordinator_cpu_s": round(cpu, 2), "coordinator_cpu_pct": round(100 * cpu / window, 1),
        "coordinator_rss_mib": round(rss, 1), "coordinator_peak_rss_mib": round(peak, 1),
        "loadgen_cpu_s": round(_self_cpu() - mark["gen"], 2), "cores": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="load window per phase")
    p.add_argument("--rate", type=float, default=2.0, help="pushes per second per worker (one group each)")
    p.add_argument("--phases", default="tls:1,tls:64,plain:64", help="comma-separated tls|plain:WORKERS")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per record")
    p.add_argument("--response", type=int, default=64, help="response tokens per record")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tls", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(bool(args.tls))
        return
    for spec in args.phases.split(","):
        mode, _, n = spec.partition(":")
        print(json.dumps(phase(mode == "tls", int(n), args)), flush=True)


if __name__ == "__main__":
    main()
