"""The session keys and per-frame MACs: bound to both nonces, the certificate and the purpose; a replayed,
reordered, reflected or tampered frame fails before its header is decoded. Relays pin their parent."""

from __future__ import annotations

import json
import os
import time

import pytest

from echo2sdk.core.broadcast.manifest import Signer, build_manifest
from echo2sdk.core.broadcast.planner import SOURCE
from echo2sdk.errors import AuthError, ProtocolError
from echo2sdk.runtime.trust import session
from echo2sdk.runtime.protocol.messages import Heartbeat, to_header
from echo2sdk.runtime.broadcast.relay import RelayNode, Upstream
from echo2sdk.runtime.protocol.wire import PREFIX_BYTES, decode_header, encode_frame, open_frame

TOKEN = "t0ken"
NC, NW, FP = b"c" * 32, b"w" * 32, b"f" * 32


def _pair(fp: bytes = FP) -> tuple[session.Session, session.Session]:
    hello = b"hello-bytes"
    server = session.derive(TOKEN, session.CONTROL, NC, NW, fp, hello, server=True)
    client = session.derive(TOKEN, session.CONTROL, NC, NW, fp, hello, server=False)
    return server, client


def _split(frame: bytes) -> tuple[bytes, bytes]:
    return frame[:PREFIX_BYTES], frame[PREFIX_BYTES:]


def test_frames_verify_in_order_only_and_never_in_the_other_direction():
    server, client = _pair()
    frames = [encode_frame({"type": "heartbeat", "version": i}, key=client.send) for i in range(3)]
    assert open_frame(*_split(frames[0]), server.recv)[0]["version"] == 0
    with pytest.raises(AuthError):
        open_frame(*_split(frames[0]), server.recv)  # replayed
    with pytest.raises(AuthError):
        open_frame(*_split(frames[2]), server.recv)  # reordered (frame 1 skipped)
    assert open_frame(*_split(frames[1]), server.recv)[0]["version"] == 1  # a failed check does not count
    reflected = encode_frame({"type": "heartbeat", "version": 9}, key=server.send)
    with pytest.raises(AuthError):
        open_frame(*_split(reflected), server.recv)  # our own frame sent back to us


def test_keys_are_bound_to_certificate_nonces_purpose_and_token():
    base = session.derive(TOKEN, session.CONTROL, NC, NW, FP, b"h", server=True).send.key
    for changed in (
        session.derive(TOKEN, session.CONTROL, NC, NW, b"", b"h", server=True),  # another certificate
        session.derive(TOKEN, session.CONTROL, b"x" * 32, NW, FP, b"h", server=True),  # another challenge
        session.derive(TOKEN, session.CONTROL, NC, b"y" * 32, FP, b"h", server=True),  # another client nonce
        session.derive(TOKEN, session.RELAY, NC, NW, FP, b"h", server=True),  # a relay session
        session.derive(TOKEN, session.CONTROL, NC, NW, FP, b"h2", server=True),  # another hello
        session.derive("other", session.CONTROL, NC, NW, FP, b"h", server=True),  # another token
    ):
        assert changed.send.key != base
    assert session.hello_key(TOKEN, session.CONTROL, NC, FP).key != session.hello_key(TOKEN, session.RELAY, NC, FP).key


def test_the_mac_is_checked_before_the_header_is_decoded():
    server, client = _pair()
    frame = bytearray(encode_frame({"type": "heartbeat", "version": 1}, key=client.send))
    frame[-1] ^= 0xFF  # the last header byte: now garbage msgpack, and a wrong MAC
    with pytest.raises(AuthError, match="MAC does not verify"):
        open_frame(*_split(bytes(frame)), server.recv)
    plain = encode_frame({"type": "welcome", "worker_id": "w", "config": {}})
    with pytest.raises(ProtocolError, match="unsealed 'welcome' frame after authentication"):
        open_frame(*_split(plain), server.recv, plain=("refused",))


def test_headers_decode_under_limits():
    with pytest.raises(ProtocolError, match="undecodable"):
        decode_header(b"\xdd" + (2 << 20).to_bytes(4, "big") + b"\x80" * (2 << 20))  # 2M-element array
    with pytest.raises(ProtocolError, match="undecodable"):
        decode_header(b"\xc7\x01\x05x")  # an extension type
    assert decode_header(b"\x81\xa4type\xa1x") == {"type": "x"}


def test_a_child_refuses_a_parent_whose_certificate_is_not_the_pinned_one(caplog):
    data = os.urandom(4 * (64 << 10))
    m = build_manifest(data, 1, 64 << 10, Signer())
    src, child = RelayNode(TOKEN, node_id=SOURCE), RelayNode(TOKEN, node_id="child")
    impostor = RelayNode("not-the-token", node_id="x")
    try:
        src.publish(m, data)
        impostor.publish(m, data)
        wrong_pin = Upstream("mitm", src.host, src.port, b"\x01" * 32)
        no_token = Upstream("x", impostor.host, impostor.port, impostor.fingerprint)
        r = child.fetch(m, [wrong_pin, no_token, Upstream(SOURCE, src.host, src.port, src.fingerprint)])
        assert r.ok and r.parent == SOURCE and bytes(child.assembly(1).view) == data
        reasons = [rep["reason"] for rep in r.repairs]
        assert reasons == ["authentication", "refused"]  # the kind travels; the details stay in the child's log
        assert "authentication: relay 'mitm' presented certificate" in caplog.text
        assert impostor.refused == 1 and src.refused == 0
    finally:
        for n in (src, child, impostor):
            n.close()


def test_per_frame_mac_cost_on_the_control_path():
    """Not a timed assertion: prints what sealing and checking a heartbeat costs next to plain framing."""
    server, client = _pair()
    header = to_header(Heartbeat(version=12, rollouts=3456, rollouts_per_s=12.5))
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        open_frame(*_split(encode_frame(header)), None)
    plain = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        open_frame(*_split(encode_frame(header, key=client.send)), server.recv)
    sealed = (time.perf_counter() - t0) / n
    print(json.dumps({"measure": "frame_us", "plain": round(plain * 1e6, 2), "sealed": round(sealed * 1e6, 2),
                      "mac_overhead_us": round((sealed - plain) * 1e6, 2), "header_bytes": len(encode_frame(header))}))
    assert sealed > 0
