"""Hand-driven peers for the security tests: fake coordinators, raw clients, frame-level proxies."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

from echo2sdk.core.records import pack
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.protocol.groups import encode_groups
from echo2sdk.runtime.protocol.messages import Hello, Trajectories, to_header
from echo2sdk.runtime.trust.tls import Identity, client_context, server_context
from echo2sdk.runtime.protocol.wire import MAX_HEADER, PREFIX_BYTES, TAG_BYTES, read_frame, write_frame

TOKEN = "the-real-token"


def wait(pred, timeout: float = 30.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def spawn_worker(port: int, token: str = TOKEN, *args: str, wid: str = "w-real") -> subprocess.Popen:
    cmd = [sys.executable, "-m", "echo2sdk.cli", "worker", "--connect", f"127.0.0.1:{port}", "--id", wid, *args]
    return subprocess.Popen(cmd, env=dict(os.environ, ECHO2_TOKEN=token), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(p: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str]:
    """(exit code, output) of a worker process, killed if it is still running after `timeout`."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate(timeout=10)
    return p.returncode, out


async def fake_coordinator(token: str, welcome: dict[str, Any], *, sealed: bool = True, tls: bool = True,
                           then: list[dict] = (), until: str | None = None, frames: list[dict] | None = None):
    """A server that speaks the handshake with `token` (the wrong one for an impostor) and answers every hello
    with `welcome` (sealed with the keys it derived, or plain). Returns (server, port, hellos seen). With `then`:
    those frames follow the welcome, sealed, and the worker's frames are appended to `frames` until one of type
    `until` came (then the connection is closed) or 30 s passed."""
    identity = Identity.generate() if tls else None
    fp = identity.fingerprint if identity else b""
    seen: list[dict] = []

    async def handle(reader, writer):
        try:
            nonce = session.new_nonce()
            await write_frame(writer, {"type": "challenge", "nonce": nonce})
            prefix = await reader.readexactly(PREFIX_BYTES)
            hlen = int.from_bytes(prefix[4:8], "big")
            body = await reader.readexactly(TAG_BYTES + hlen)
            raw = body[TAG_BYTES:]
            import msgpack

            hello = msgpack.unpackb(raw)
            seen.append(hello)
            keys = session.derive(token, session.CONTROL, nonce, hello["nonce"], fp, raw, server=True)
            await write_frame(writer, {"type": "welcome", "worker_id": hello["worker_id"], **welcome},
                              key=keys.send if sealed else None)
            if not then:
                await asyncio.wait_for(reader.read(), 30)
                return
            for frame in then:
                await write_frame(writer, frame, key=keys.send)
            async with asyncio.timeout(30):
                while True:
                    got = (await read_frame(reader, 0, key=keys.recv, max_header=MAX_HEADER))[0]
                    if frames is not None:
                        frames.append(got)
                    if got.get("type") == until:
                        return
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context(identity) if identity else None)
    return server, server.sockets[0].getsockname()[1], seen


class Client:
    """A hand-driven worker connection: TLS, the token handshake, then sealed frames."""

    def __init__(self, reader, writer, keys, answer):
        self.reader, self.writer, self.keys, self.answer = reader, writer, keys, answer

    @classmethod
    async def join(cls, port: int, token: str = TOKEN, *, tls: bool = True, local: str | None = None, **hello):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context() if tls else None, local_addr=(local, 0) if local else None
        )
        fields = Hello(nonce=session.new_nonce(), **hello).model_dump()
        keys, answer, sealed = await session.client_handshake(reader, writer, token, fields)
        client = cls(reader, writer, keys, answer)
        client.sealed = sealed  # whether the answer came sealed (a welcome, or a refusal after a verified hello)
        return client

    async def send(self, header: dict, payload: bytes = b"") -> None:
        await write_frame(self.writer, header, payload, key=self.keys.send)

    async def push(self, groups: list, *, rid: int | None = 1, batch: str | None = None) -> None:
        """A push of `groups` (wire maps), encoded as a worker encodes them (runtime/protocol/groups.py)."""
        p = encode_groups(groups)
        await self.send(to_header(Trajectories.of(p, rid=rid, batch=batch)), p.payload)

    async def recv(self) -> dict:
        return (await read_frame(self.reader, 0, key=self.keys.recv, max_header=MAX_HEADER))[0]

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        except (OSError, TimeoutError):
            pass


async def read_raw_frame(reader: asyncio.StreamReader) -> bytes:
    """One whole frame's bytes (plain or sealed), unparsed: what a proxy sees without the keys."""
    prefix = await reader.readexactly(PREFIX_BYTES)
    hlen, plen = int.from_bytes(prefix[4:8], "big"), int.from_bytes(prefix[8:16], "big")
    tag = TAG_BYTES if prefix[:4] == b"E2S1" else 0
    return prefix + await reader.readexactly(tag + hlen + plen)


def plain_frame(header: dict) -> bytes:
    h = pack(header)
    return b"E2F1" + len(h).to_bytes(4, "big") + (0).to_bytes(8, "big") + h


class LoopThread:
    """An asyncio loop on a thread, for servers a test talks to from blocking code."""

    def __init__(self):
        import threading

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def make_coordinator(**kw):
    """A started coordinator with an empty worker config (relay-only workers need none)."""
    from echo2sdk.core.buffer import StalenessBuffer
    from echo2sdk.runtime.coordinator import Coordinator
    from echo2sdk.testing import ToyAdapter

    args = dict(buffer=StalenessBuffer(staleness=2, group_size=2), tasks=ToyAdapter().tasks(0), worker_config={},
                vocab_size=256, max_len=64, token=TOKEN, heartbeat_s=0.2, worker_timeout_s=10.0)
    c = Coordinator(**{**args, **kw})
    c.start()
    return c
