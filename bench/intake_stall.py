"""How long one big authenticated push stalls the coordinator's event loop (issue 34).

A coordinator runs in its own process (bench/intake_memory.py's --serve: the main job's buffer and max_len). A
probe worker asks for tasks every `--probe-ms` and times each answer (a get_tasks round trip: what every other
worker's heartbeats, tasks and acks wait behind). After `--quiet-s` of probing, a second worker sends one push of
about `--mib` MiB: `maps` (a header of empty maps, the most objects per byte msgpack decodes) or `text` (groups of
4 records whose responses fill it). The probe goes on until the push's answer (or the connection's end) and
`--quiet-s` more.

    .venv/bin/python bench/intake_stall.py [--mib 12] [--kinds maps,text] [--probe-ms 10]

One JSON line per kind: the probe's p50 round trip before the push and its worst round trip during it (the
stall), how long the push took to be answered (or closed), the push's frame bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from intake_memory import TOKEN  # noqa: E402  (the same coordinator, token and buffer)


async def _join(port: int, name: str, ip: str):
    from echo2sdk.runtime.protocol.messages import Hello
    from echo2sdk.runtime.trust import session
    from echo2sdk.runtime.trust.tls import client_context

    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(), local_addr=(ip, 0))
    hello = Hello(nonce=session.new_nonce(), worker_id=name, session=name).model_dump()
    keys, answer, _ = await session.client_handshake(reader, writer, TOKEN, hello)
    return reader, writer, keys, answer["worker_id"]


def _header(kind: str, mib: float, wid: str) -> dict:
    if kind == "maps":  # 1 byte per empty map: the most Python objects per byte of header
        per_group = 1 << 20  # msgpack's per-container limit (wire.MAX_ARRAY)
        n = int(mib * (1 << 20))
        return {"type": "trajectories", "rid": 1, "batch": "stall", "groups": [[{}] * per_group] * (n // per_group)}
    text = "x" * int(mib * (1 << 20) / 4)
    group = [{"prompt": "q", "response": text, "reward": float(i % 2), "version": 0,
              "meta": {"group_id": "stall", "prompt_ids": [1, 2, 3], "response_ids": list(range(16)),
                       "logprobs": [-0.5] * 16, "worker": wid}} for i in range(4)]
    return {"type": "trajectories", "rid": 1, "batch": "stall", "groups": [group]}


async def measure(port: int, kind: str, args: argparse.Namespace) -> dict:
    from echo2sdk.runtime.protocol.wire import MAX_HEADER, encode_frame, read_frame

    pr, pw, pkeys, _ = await _join(port, "probe", "127.0.0.21")
    ar, aw, akeys, awid = await _join(port, "pusher", "127.0.0.22")
    rtts: list[tuple[float, float]] = []  # (sent at, round trip)
    done = asyncio.Event()

    async def probe() -> None:
        rid = 0
        while not done.is_set():
            rid += 1
            t0 = time.monotonic()
            pw.write(encode_frame({"type": "get_tasks", "n": 1, "rid": rid}, key=pkeys.send))
            await pw.drain()
            await read_frame(pr, 0, key=pkeys.recv, max_header=MAX_HEADER)
            rtts.append((t0, time.monotonic() - t0))
            await asyncio.sleep(args.probe_ms / 1000)

    task = asyncio.create_task(probe())
    await asyncio.sleep(args.quiet_s)
    frame = encode_frame(_header(kind, args.mib, awid), key=akeys.send)
    t_push = time.monotonic()
    aw.write(frame)
    await aw.drain()
    try:
        answer = (await read_frame(ar, 0, key=akeys.recv, max_header=MAX_HEADER))[0]["type"]
    except (asyncio.IncompleteReadError, ConnectionError):
        answer = "closed"
    t_answer = time.monotonic() - t_push
    await asyncio.sleep(args.quiet_s)
    done.set()
    await task
    for w in (pw, aw):
        w.close()
    before = [r for t, r in rtts if t < t_push]
    during = [r for t, r in rtts if t_push - 0.05 <= t <= t_push + t_answer + 0.05]
    return {"bench": "intake_stall", "kind": kind, "frame_mib": round(len(frame) / 2**20, 2), "probe_ms": args.probe_ms,
            "answer": answer, "push_answered_s": round(t_answer, 3),
            "probe_p50_before_ms": round(1000 * statistics.median(before), 2),
            "probe_worst_during_ms": round(1000 * max(during, default=0.0), 1), "probes_during": len(during)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=12.0, help="the push's size in MiB (under the 16 MiB header cap)")
    p.add_argument("--kinds", default="maps,text")
    p.add_argument("--probe-ms", type=float, default=10.0)
    p.add_argument("--quiet-s", type=float, default=1.0)
    args = p.parse_args()
    for kind in args.kinds.split(","):
        server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "intake_memory.py"), "--serve", "bounds"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = json.loads(server.stdout.readline())["port"]
            print(json.dumps({**asyncio.run(measure(port, kind, args)), "mib": args.mib}), flush=True)
        finally:
            server.stdin.close()
            server.wait(30)


if __name__ == "__main__":
    main()
