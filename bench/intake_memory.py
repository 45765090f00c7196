"""Learner memory under big pushes: N token holders push groups whose records carry huge text (issue 34).

A coordinator runs in a process of its own (this script with --serve) with the main job's buffer
(`build.buffer_args` of examples/math_smollm2.toml: k x (S + 1) groups per worker, and the byte budgets) and its
max_len; N authenticated workers (real TLS, token handshake, sealed frames, one loopback address each) push
`--pushes` groups of 4 records each, every record carrying a `--text-kib` response. The coordinator's RSS is read
before and after (/proc/PID/status); rejections come from the acks, evictions from the buffer's counters.

Two modes in one run, each on a fresh coordinator: `bounds` (this code: text at most 64 characters per token of
max_len, byte budgets per worker, per credential and for the shared token) and `none` (the bounds switched off in
the coordinator process: no text limit, no byte budget, only the group caps: what the code did before).

    .venv/bin/python bench/intake_memory.py [--workers 4] [--pushes 24] [--text-kib 4096] [--modes bounds,none]

One JSON line per (mode, text size): parameters, RSS before/after/growth in MiB, records accepted, rejected by
reason, evicted by reason, held records and held bytes (records.held_bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

TOKEN = "intake-memory-bench-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[1]


def serve(mode: str) -> None:
    """A coordinator with the main job's buffer; prints its port, then the buffer's counters per stdin line."""
    from echo2sdk.config import load_config
    from echo2sdk.core import records
    from echo2sdk.core.buffer import StalenessBuffer
    from echo2sdk.runtime.coordinator import Coordinator
    from echo2sdk.runtime.learner.build import buffer_args
    from echo2sdk.testing import ToyAdapter

    logging.getLogger("echo2sdk").setLevel(logging.ERROR)
    cfg = load_config(ROOT / "examples" / "math_smollm2.toml")
    args = buffer_args(cfg)
    if mode == "none":  # what the intake did before: no text bound, no byte budget, no record size bound
        from echo2sdk.runtime.coordinator import intake
        from echo2sdk.runtime.protocol import groups

        records.MAX_CHARS_PER_TOKEN = 1 << 40
        groups.record_limit = intake.record_limit = lambda max_len: 1 << 40
        args.update(bytes_per_worker=None, bytes_per_pool=None)
    coord = Coordinator(buffer=StalenessBuffer(**args), tasks=ToyAdapter().tasks(0), worker_config={},
                        vocab_size=49152, max_len=cfg.learner.max_len, token=TOKEN, heartbeat_s=5.0,
                        worker_timeout_s=120.0)
    coord.start()
    print(json.dumps({"port": coord.port, "max_len": cfg.learner.max_len, "buffer": {
        k: args[k] for k in ("groups_per_worker", "bytes_per_worker", "bytes_per_pool")}}), flush=True)
    for _ in sys.stdin:
        b = coord.buffer.stats()
        print(json.dumps({"held": b["held"], "held_bytes": b["held_bytes"], "evicted": b["evicted_by_reason"],
                          "rejected": dict(coord.rejected), "heap_trims": coord.server.heap.trims}), flush=True)
    coord.stop()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def _group(worker: str, gid: str, text: str) -> list[dict]:
    return [{"prompt": "q", "response": text, "reward": float(i % 2), "version": 0,
             "meta": {"group_id": gid, "prompt_ids": [1, 2, 3], "response_ids": list(range(16)),
                      "logprobs": [-0.5] * 16, "worker": worker}} for i in range(4)]


async def push(i: int, port: int, pushes: int, text: str, out: dict) -> None:
    from echo2sdk.runtime.protocol.messages import Hello
    from echo2sdk.runtime.protocol.groups import encode_groups
    from echo2sdk.runtime.protocol.messages import Trajectories, to_header
    from echo2sdk.runtime.protocol.wire import MAX_HEADER, read_frame, write_frame
    from echo2sdk.runtime.trust import session
    from echo2sdk.runtime.trust.tls import client_context

    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(),
                                                   local_addr=(f"127.0.0.{10 + i}", 0))
    hello = Hello(nonce=session.new_nonce(), worker_id=f"big-{i}", session=f"s{i}").model_dump()
    keys, answer, _ = await session.client_handshake(reader, writer, TOKEN, hello)
    wid = answer["worker_id"]
    for n in range(pushes):
        p = encode_groups([_group(wid, f"{wid}-{n}", text)])
        await write_frame(writer, to_header(Trajectories.of(p, rid=n, batch=f"{wid}:{n}")), p.payload, key=keys.send)
        ack = (await read_frame(reader, 0, key=keys.recv, max_header=MAX_HEADER))[0]
        out["accepted"] += ack["accepted"]
        for reason in ack.get("rejected", ()):
            out["rejected"][reason] = out["rejected"].get(reason, 0) + 4
    writer.close()
    await writer.wait_closed()


def run(mode: str, text_kib: int, args: argparse.Namespace) -> dict:
    server = subprocess.Popen([sys.executable, __file__, "--serve", mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(server.stdout.readline())
        time.sleep(1.0)
        before = _rss_mib(server.pid)
        out: dict = {"accepted": 0, "rejected": {}}
        text = "x" * (text_kib << 10)
        t0 = time.monotonic()

        async def all_workers() -> None:
            await asyncio.gather(*(push(i, info["port"], args.pushes, text, out) for i in range(args.workers)))

        asyncio.run(all_workers())
        wall = time.monotonic() - t0
        time.sleep(args.settle_s)
        after = _rss_mib(server.pid)
        server.stdin.write("\n")
        server.stdin.flush()
        counters = json.loads(server.stdout.readline())
        return {"bench": "intake_memory", "mode": mode, "workers": args.workers, "pushes_per_worker": args.pushes,
                "records_per_push": 4, "text_kib": text_kib, "max_len": info["max_len"], "buffer": info["buffer"],
                "rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
                "rss_growth_mib": round(after - before, 1), "accepted": out["accepted"], "rejected": out["rejected"],
                "evicted": counters["evicted"], "held": counters["held"], "held_mib": round(counters["held_bytes"] / 2**20, 1),
                "heap_trims": counters["heap_trims"], "wall_s": round(wall, 1), "settle_s": args.settle_s}
    finally:
        server.stdin.close()
        server.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", metavar="MODE", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--pushes", type=int, default=24, help="pushes per worker, one group of 4 records each")
    p.add_argument("--text-kib", default="4096,60", help="response text per record in KiB, comma-separated "
                   "(4096: the review's attack; 60: just under the bound at max_len 1024)")
    p.add_argument("--modes", default="bounds,none")
    p.add_argument("--settle-s", type=float, default=3.0, help="seconds after the last ack before RSS is read")
    args = p.parse_args()
    if args.serve:
        serve(args.serve)
        return
    for kib in (int(x) for x in args.text_kib.split(",")):
        for mode in args.modes.split(","):
            print(json.dumps(run(mode, kib, args)), flush=True)


if __name__ == "__main__":
    main()
