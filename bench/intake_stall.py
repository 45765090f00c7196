"""How long one big authenticated push stalls the coordinator's event loop (issue 34).

A coordinator runs in its own process (bench/intake_memory.py's --serve: the main job's buffer and max_len). A
probe worker asks for tasks every `--probe-ms` and times each answer (a get_tasks round trip: what every other
worker's heartbeats, tasks and acks wait behind). After `--quiet-s` of probing, a second worker sends one push:

- `maps`: a header of about `--mib` MiB of empty maps (the most objects per byte msgpack decodes); a worker's
  header is capped at 256 KiB (wire.MAX_WORKER_HEADER), so over the cap it is refused from its prefix
- `maps-cap`: the same, just under the cap: the most header decoding a worker can cause
- `text`: one group of 4 records whose responses fill about `--mib` MiB of payload
- `records`: `--mib` MiB of payload in as many small valid records as a push may hold (groups.MAX_RECORDS)

The probe goes on until the push's answer (or the connection's end) and `--quiet-s` more.

    .venv/bin/python bench/intake_stall.py [--mib 16] [--kinds maps,maps-cap,text,records] [--probe-ms 10]

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


def _frame(kind: str, mib: float, wid: str) -> tuple[dict, bytes]:
    """The push's header and payload."""
    from echo2sdk.runtime.protocol.groups import MAX_PUSH_BYTES, MAX_RECORDS, encode_groups, encode_record
    from echo2sdk.runtime.protocol.messages import MAX_BATCH, Trajectories, to_header
    from echo2sdk.runtime.protocol.wire import MAX_WORKER_HEADER

    if kind in ("maps", "maps-cap"):  # 1 byte per empty map: the most Python objects per byte of header
        n = int(mib * (1 << 20)) if kind == "maps" else MAX_WORKER_HEADER - 64
        per_group = min(n, 1 << 20)  # msgpack's per-container limit (wire.MAX_ARRAY)
        return {"type": "trajectories", "rid": 1, "batch": "stall", "groups": [[{}] * per_group] * (n // per_group)}, b""

    def rec(i: int, text: str) -> dict:
        return {"prompt": "q", "response": text, "reward": float(i % 2), "version": 0,
                "meta": {"group_id": f"stall-{i // 4}", "prompt_ids": [1, 2, 3], "response_ids": list(range(16)),
                         "logprobs": [-0.5] * 16, "worker": wid}}

    budget = min(int(mib * (1 << 20)), MAX_PUSH_BYTES)
    if kind == "text":
        push = encode_groups([[rec(i, "x" * ((budget - 4096) // 4)) for i in range(4)]])
    else:  # records: as many as fit (groups of 4, larger past MAX_BATCH groups: those are decoded, then refused)
        one = len(encode_record(rec(MAX_RECORDS, "")))  # the longest group id
        n = min(MAX_RECORDS, budget // one)
        per = max(4, -(-n // MAX_BATCH))
        push = encode_groups([[rec(i, "") for i in range(g, min(g + per, n))] for g in range(0, n, per)])
    return to_header(Trajectories.of(push, rid=1, batch="stall")), push.payload


async def measure(port: int, kind: str, args: argparse.Namespace) -> dict:
    from echo2sdk.runtime.protocol.wire import MAX_HEADER, PREFIX_BYTES, TAG_BYTES, encode_frame, read_frame

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
    header, payload = _frame(kind, args.mib, awid)
    frame = encode_frame(header, payload, key=akeys.send)
    t_push = time.monotonic()
    aw.write(frame)
    aw.write(payload)
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
    return {"bench": "intake_stall", "kind": kind, "frame_mib": round((len(frame) + len(payload)) / 2**20, 2),
            "header_bytes": len(frame) - PREFIX_BYTES - TAG_BYTES, "records": sum(header.get("groups", ())) if payload else 0,
            "probe_ms": args.probe_ms,
            "answer": answer, "push_answered_s": round(t_answer, 3),
            "probe_p50_before_ms": round(1000 * statistics.median(before), 2),
            "probe_worst_during_ms": round(1000 * max(during, default=0.0), 1), "probes_during": len(during)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=16.0, help="the push's size in MiB (a payload is capped at 16 MiB)")
    p.add_argument("--kinds", default="maps,maps-cap,text,records")
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
