"""A man in the middle between a real worker and the real coordinator: it may relay every frame, but it cannot
terminate TLS with a certificate of its own, swap a nonce, replay a frame or splice two sessions."""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest
from _peers import TOKEN, Client, finish, make_coordinator, read_raw_frame, spawn_worker, wait

from echo2sdk.runtime.trust.tls import Identity, client_context, server_context
from echo2sdk.runtime.protocol.wire import PREFIX_BYTES

pytestmark = pytest.mark.integration


async def _proxy(target: int, tamper=None, *, tls: Identity | None = None, route=None):
    """Forward frames between each client and its own connection to `target`. `tamper(conn, direction, i, frame)`
    returns the frames to send instead; `route(conn, direction, i)` may name another connection's upstream."""
    ids = itertools.count()
    uplinks: dict[int, asyncio.StreamWriter] = {}

    async def pipe(conn, src, dst, direction):
        for i in itertools.count():
            frame = await read_raw_frame(src)
            other = route(conn, direction, i) if route else None
            out = uplinks.get(other, dst) if other is not None else dst
            for f in tamper(conn, direction, i, frame) if tamper else [frame]:
                out.write(f)
            await out.drain()

    async def handle(wr, ww):
        conn = next(ids)
        cr, cw = await asyncio.open_connection("127.0.0.1", target, ssl=client_context() if tls else None)
        uplinks[conn] = cw
        pipes = [asyncio.ensure_future(pipe(conn, wr, cw, "up")), asyncio.ensure_future(pipe(conn, cr, ww, "down"))]
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)  # one side is gone: so is the other
        for t in pipes:
            t.cancel()
        for w in (ww, cw):
            w.close()
        await asyncio.gather(*pipes, *(w.wait_closed() for w in (ww, cw)), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context(tls) if tls else None)
    return server, server.sockets[0].getsockname()[1]


def test_a_tls_interceptor_with_its_own_certificate_is_refused(loop):
    """The interceptor decrypts and re-encrypts every byte, but the worker's hello is bound to the certificate
    it saw (the interceptor's), so the coordinator refuses it; nothing is registered."""
    coord = make_coordinator()
    server, port = loop.run(_proxy(coord.port, tls=Identity.generate()))
    try:
        rc, out = finish(spawn_worker(port, TOKEN, "--relay-only", "--reconnect-s", "0"), timeout=60)
        assert rc == 2 and "wrong token, or an interceptor in between" in out, out
        assert coord.refused >= 1 and not coord.workers
    finally:
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
        coord.stop()


def test_a_swapped_challenge_nonce_fails_the_hello(loop):
    coord = make_coordinator(tls=False)

    def swap(conn, direction, i, frame):
        if direction == "down" and i == 0:  # the challenge: same length, another nonce
            return [frame[:-32] + os.urandom(32)]
        return [frame]

    server, port = loop.run(_proxy(coord.port, swap))
    try:
        rc, out = finish(spawn_worker(port, TOKEN, "--plaintext", "--relay-only", "--reconnect-s", "0"), timeout=60)
        assert rc == 2 and "authentication failed" in out, out
        assert coord.refused == 1 and not coord.workers
    finally:
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
        coord.stop()


def test_a_replayed_frame_closes_the_session_and_is_never_acted_on(loop, caplog):
    coord = make_coordinator(tls=False)
    first = {}

    def replay(conn, direction, i, frame):
        if conn == 0 and direction == "up" and i == 2:  # a heartbeat after the hello: sent twice
            first["replayed"] = frame
            return [frame, frame]
        return [frame]

    server, port = loop.run(_proxy(coord.port, replay))
    p = spawn_worker(port, TOKEN, "--plaintext", "--relay-only", "--reconnect-s", "30")
    try:
        assert wait(lambda: coord.stats()["protocol_errors"] == 1, 30), finish(p, 1)[1]
        assert "frame MAC does not verify" in caplog.text
        assert wait(lambda: coord.workers.get("w-real") is not None and coord.workers["w-real"].rejoins == 1
                    and coord.workers["w-real"].alive, 30)  # it re-joins on a fresh connection
    finally:
        p.kill()
        finish(p, 10)
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
        coord.stop()


def test_two_spliced_sessions_both_fail(loop, caplog):
    """Two workers' handshakes are relayed faithfully; then each one's frames go into the other's session."""
    coord = make_coordinator(tls=False)
    server, port = loop.run(_proxy(coord.port, route=lambda conn, d, i: 1 - conn if d == "up" and i >= 1 else None))

    async def scenario():
        a = await Client.join(port, tls=False, worker_id="a", session="aaaa")
        b = await Client.join(port, tls=False, worker_id="b", session="bbbb")
        assert a.answer["type"] == b.answer["type"] == "welcome"
        await a.send({"type": "heartbeat", "version": 0})
        await b.send({"type": "heartbeat", "version": 0})
        closed = [await asyncio.wait_for(c.reader.read(), 10) == b"" for c in (a, b)]
        await a.close()
        await b.close()
        return closed

    try:
        assert loop.run(scenario()) == [True, True]
        assert wait(lambda: coord.stats()["protocol_errors"] == 2, 10)
        assert caplog.text.count("frame MAC does not verify") == 2
        assert not any(w.alive for w in coord.workers.values())
    finally:
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
        coord.stop()


def test_the_proxy_itself_is_transparent_when_it_only_relays(loop):
    """Control: the same proxy, relaying frames untouched, lets the worker join (the failures above are the
    tampering's, not the proxy's)."""
    coord = make_coordinator(tls=False)
    server, port = loop.run(_proxy(coord.port))
    p = spawn_worker(port, TOKEN, "--plaintext", "--relay-only")
    try:
        assert wait(lambda: "w-real" in coord.workers, 30), finish(p, 1)[1]
        assert PREFIX_BYTES == 16 and coord.refused == 0
    finally:
        p.kill()
        finish(p, 10)
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
        coord.stop()


def test_a_forged_refusal_of_a_re_join_does_not_end_the_worker(loop):
    """After its session is cut, the worker's re-joins are answered by an on-path party: a plain `refused` (twice),
    then garbage. None of it is the coordinator's word (unsealed), so the worker re-dials instead of exiting (it
    used to exit 2 at the first forged refusal) and re-joins once the path is clean; the coordinator's own,
    sealed refusals stay final (test_credentials, test_protocol)."""
    from echo2sdk.runtime.protocol.messages import Refused, to_header
    from echo2sdk.runtime.protocol.wire import encode_frame

    coord = make_coordinator(tls=False)

    def attack(conn, direction, i, frame):
        if conn == 0 and direction == "up" and i == 2:  # a replayed heartbeat: the coordinator cuts the session
            return [frame, frame]
        if conn in (1, 2) and direction == "down" and i == 1:  # the answer to the re-join's hello
            return [encode_frame(to_header(Refused(reason="worker w-real is revoked")))]
        if conn == 3 and direction == "down" and i == 0:  # the challenge: garbage of the same length
            return [os.urandom(len(frame))]
        return [frame]

    server, port = loop.run(_proxy(coord.port, attack))
    p = spawn_worker(port, TOKEN, "--plaintext", "--relay-only", "--reconnect-s", "60")
    try:
        w = lambda: coord.workers.get("w-real")  # noqa: E731
        # registered at the first join, at both forged refusals' hellos and at the clean re-join (the garbage
        # challenge came before a hello)
        assert wait(lambda: w() is not None and w().rejoins == 3 and w().alive, 60), finish(p, 1)[1]
        assert p.poll() is None  # still working
    finally:
        p.kill()
        rc, out = finish(p, 10)
        loop.loop.call_soon_threadsafe(server.close)  # on its loop: Server.close is not thread-safe
        coord.stop()
    assert out.count("not on the coordinator's word") == 3, out
    assert "unsealed: possibly not the coordinator" in out


def test_a_peer_that_accepts_and_stays_silent_cannot_hold_a_joining_worker(monkeypatch):
    """The handshake (TLS, challenge, hello, welcome) has one deadline, worker.JOIN_S: a peer that accepts the
    connection and never answers used to hold the worker forever (and a re-join past --reconnect-s)."""
    import socket
    import time

    from echo2sdk.runtime.worker import process as worker

    monkeypatch.setattr(worker, "JOIN_S", 1.0)
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody ever answers
    try:
        t0 = time.monotonic()
        code = worker.run_worker(f"127.0.0.1:{silent.getsockname()[1]}", TOKEN, relay_only=True, tls=False,
                                 reconnect_s=0, connect_timeout_s=5)
        assert code == 1 and time.monotonic() - t0 < 10
    finally:
        silent.close()
