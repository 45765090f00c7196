"""A seeded frame mutator for the fuzz test, and the oracle that says what a server must do with each frame.

The mutator starts from a valid header of every message in `echo2sdk.runtime.protocol.messages` and replaces field
values with random msgpack values of the same type (out-of-range numbers, over-long strings, wrong-length
bytes) or of another type, drops and adds keys, changes the `type`; it flips, inserts and deletes bytes of a
packed header; and it lies in the frame prefix (magic, header length, payload length, oversize headers),
corrupts tags and replays or reorders frames. Sealing uses the real session keys, so a header mutated before
its MAC arrives validly MACed and semantically bad.

A push's records travel in its payload (runtime/protocol/groups.py): `groups` mutates records before they are
encoded (a value the typed layout cannot carry falls back to flipped bytes of a valid record's encoding) and
flips bytes of encoded records, and the push's SHA-256 covers what is sent, so those records arrive intact and
are rejected one group at a time; `payload_lie` changes a payload after its SHA-256 was sealed (fatal).

`fit` cuts or pads a frame to exactly the bytes the server reads for it (a claimed header or payload length is
filled with junk, a prefix that is refused is sent alone): the server never waits for bytes that will not come,
and never closes with unread bytes (which would reset the connection and lose its answer). `judge_*` then run
the server's own checks (wire.check_prefix, wire.open_frame, messages.parse, and a push's payload length and
SHA-256) on the fitted bytes: that is the fate the test expects to observe on the socket.
"""

from __future__ import annotations

import math
import random
import struct
from typing import Any

from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.protocol import messages as m
from echo2sdk.runtime.protocol.groups import MAX_PUSH_BYTES, Push, encode_groups, encode_record
from echo2sdk.runtime.trust.session import FrameKey
from echo2sdk.runtime.protocol.wire import (
    MAGIC, MAX_HEADER, MAX_WORKER_HEADER, PREAUTH_MAX_HEADER, PREFIX_BYTES, SEALED, TAG_BYTES, check_prefix,
    digest, open_frame,
)

_PREFIX = struct.Struct(">4sIQ")
INTS = (0, 1, -1, 2, 1023, 1024, 1025, 65535, 65536, 1 << 31, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1,
        -(1 << 63))
FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-300, 1e308, -1e308, math.nan, math.inf, -math.inf, 5e-324)
TEXT = "aZ09 _-:./\\\"'\n\t\x00é漢🙂"
TYPES = ("challenge", "hello", "refused", "welcome", "get_tasks", "tasks", "trajectories", "ack", "heartbeat",
         "snapshot", "snapshot_plan", "received", "installed", "snapshot_rejected", "shutdown", "fetch",
         "unavailable", "wait", "chunk")


def record(group: str, worker: str, version: int = 0) -> dict[str, Any]:
    """One valid trajectory record, as worker `worker` sends it."""
    meta = Meta(group_id=group, prompt_ids=(1, 2, 3), response_ids=(4, 5), logprobs=(-0.5, -1.0), worker=worker)
    return Trajectory(prompt="p", response="r", reward=1.0, version=version, meta=meta).to_wire()


def examples(group_size: int, from_worker: tuple[type[m.WireMessage], ...]) -> dict[str, dict[str, Any]]:
    """A valid header of every message type: the first six and any other of `from_worker` that needs no field
    are what a worker sends; the rest must be refused from one."""
    n32, n64, rec = bytes(32), bytes(64), record("g", "w")
    manifest = m.WireManifest(version=1, total_bytes=4096, chunk_bytes=4096, chunks=[n32], digest=n32, signature=n64)
    msgs = [
        m.GetTasks(n=2, rid=1), m.Trajectories.of(encode_groups([[rec] * group_size]), rid=2, batch="b"),
        m.Heartbeat(version=0, rollouts=3, rollouts_per_s=1.5), m.Installed(version=0, install_s=0.1),
        m.Received(version=1, ok=True, seconds=0.2, parent="p", served_bps={"p": 1e6},
                   repairs=[m.Repair(parent="p", reason="stalled", chunk=0, repair_s=0.1)]),
        m.SnapshotRejected(version=1, reason="bad"),
        m.Challenge(nonce=n32), m.Hello(nonce=n32, worker_id="w"), m.Refused(reason="no"),
        m.Welcome(worker_id="w", config=m.WorkerConfig()), m.Tasks(rid=1, tasks=[m.WireTask(id="t", messages=[])]),
        m.Ack(rid=1, accepted=1), m.Snapshot(version=1, nbytes=0, sha256="0" * 64),
        m.SnapshotPlan(manifest=manifest, upstream=[("n", "h", 1, b"")]), m.Shutdown(),
        m.Fetch(node_id="n", nonce=n32, version=1, start=0), m.Unavailable(version=1), m.Wait(), m.Chunk(i=0),
    ]
    known = {msg.type for msg in msgs}
    msgs += [cls() for cls in from_worker if cls.model_fields["type"].default not in known and _bare(cls)]
    return {msg.type: m.to_header(msg) for msg in msgs}


def _bare(cls: type[m.WireMessage]) -> bool:
    return all(not f.is_required() for f in cls.model_fields.values())


class Mutator:
    """Random values and mutations from one seed."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    # -- values ----------------------------------------------------------------------------------------
    def text(self) -> str:
        n = self.rng.choice((0, 1, 5, 40, 128, 129, 256, 257, 1024, 1025, 3000))
        return "".join(self.rng.choice(TEXT) for _ in range(n))

    def blob(self) -> bytes:
        return self.rng.randbytes(self.rng.choice((0, 1, 31, 32, 33, 63, 64, 65, 200)))

    def number(self, kind: type) -> int | float:
        r = self.rng
        if kind is int:
            return r.choice(INTS) if r.random() < 0.5 else r.randint(-5, 1 << r.choice((4, 10, 20, 40, 62)))
        return r.choice(FLOATS) if r.random() < 0.5 else r.uniform(-10, 1e6)

    def value(self, depth: int = 0) -> Any:
        """Any msgpack value."""
        r = self.rng
        kind = r.randrange(8 if depth < 2 else 6)
        if kind == 0:
            return r.choice((None, True, False))
        if kind in (1, 2):
            return self.number(int if kind == 1 else float)
        if kind == 3:
            return self.text()
        if kind == 4:
            return self.blob()
        if kind == 5:
            return self.text()[:8]
        if kind == 6:
            return [self.value(depth + 1) for _ in range(r.choice((0, 1, 2, 5)))]
        if r.random() < 0.1:
            return {r.randint(0, 9): self.value(depth + 1)}  # not a string key: decoding refuses it
        return {self.text()[:12]: self.value(depth + 1) for _ in range(r.choice((0, 1, 3)))}

    def same_type(self, v: Any, depth: int = 0) -> Any:
        """A random value of `v`'s msgpack type (bounds ignored)."""
        if isinstance(v, bool) or v is None:
            return self.value(depth)
        if isinstance(v, (int, float)):
            return self.number(type(v))
        if isinstance(v, str):
            return self.text()
        if isinstance(v, bytes):
            return self.blob()
        if isinstance(v, (list, tuple)):
            items = [self.mutate(x, depth + 1) for x in v]
            if items and self.rng.random() < 0.3:
                items = items * self.rng.choice((0, 2, 40))
            return items
        return self.header(v, depth + 1) if isinstance(v, dict) else self.value(depth)

    def mutate(self, v: Any, depth: int = 0) -> Any:
        """`v` kept (containers mutated inside), or a value of its type, or of another type."""
        r = self.rng.random()
        if r < 0.6:
            if isinstance(v, dict) and depth < 4:
                return {k: self.mutate(x, depth + 1) for k, x in v.items()}
            if isinstance(v, (list, tuple)) and depth < 4:
                return [self.mutate(x, depth + 1) for x in v]
            return v
        return self.same_type(v, depth) if r < 0.85 else self.value(depth)

    def header(self, base: dict[str, Any], depth: int = 0) -> dict[str, Any]:
        """1-3 edits of a map: a value replaced (same or other type), a key dropped or added, `type` changed."""
        d, r = dict(base), self.rng
        for _ in range(r.randint(1, 3)):
            op, keys = r.random(), list(d)
            if op < 0.6 and keys:
                k = r.choice(keys)
                d[k] = self.same_type(d[k], depth) if r.random() < 0.6 else self.value(depth)
            elif op < 0.7 and keys:
                del d[r.choice(keys)]
            elif op < 0.85:
                d[r.choice(("n", "rid", "version", "groups", "nonce", "x", self.text()[:10]))] = self.value(depth)
            elif depth == 0:
                d["type"] = r.choice(TYPES) if r.random() < 0.7 else self.value(1)
        return d

    def raw(self, data: bytes) -> bytes:
        """Bit flips, byte inserts and deletes, or a cut of packed bytes."""
        b, r = bytearray(data), self.rng
        for _ in range(r.randint(1, 4)):
            op = r.random()
            if op < 0.5 and b:
                b[r.randrange(len(b))] ^= 1 << r.randrange(8)
            elif op < 0.7:
                b.insert(r.randrange(len(b) + 1), r.randrange(256))
            elif op < 0.9 and b:
                del b[r.randrange(len(b))]
            else:
                del b[r.randrange(len(b) + 1):]
        return bytes(b)

    def groups(self, group_size: int, worker: str) -> Push:
        """A push of groups: mostly well formed, some records mutated before they are encoded, some encoded
        records with flipped bytes, some groups of the wrong size."""
        r, counts, blobs = self.rng, [], []
        for _ in range(r.choice((0, 1, 1, 2, 3))):
            gid = f"fz{r.getrandbits(48):x}"
            size = group_size if r.random() < 0.8 else r.choice((0, 1, group_size + 1))
            recs = [record(gid, worker) for _ in range(size)]
            mutated = r.random() < 0.3
            for rec in recs:
                blob = encode_record(rec)
                if mutated:
                    try:
                        blob = encode_record(self.mutate(rec))
                    except (KeyError, TypeError, ValueError, OverflowError, AttributeError, UnicodeError):
                        blob = self.raw(blob)  # not expressible in the typed layout: broken bytes instead
                elif r.random() < 0.03:
                    blob = self.raw(blob)
                blobs.append(blob)
            counts.append(size)
        return Push(counts, [len(b) for b in blobs], b"".join(blobs))

    def payload_lie(self, payload: bytes) -> bytes:
        """A payload changed after its SHA-256 was sealed: a byte flipped, cut or added."""
        return self.raw(payload) if payload else self.rng.randbytes(self.rng.randint(1, 64))


# -- frames ---------------------------------------------------------------------------------------------
def tag_at(key: FrameKey, seq: int, data: bytes) -> bytes:
    """The tag `key` gives `data` as frame number `seq` of its direction (the real FrameKey, at that count)."""
    k = FrameKey(key.key)
    k.seq = seq
    return k.tag(data)


def seal(raw: bytes, key: FrameKey, seq: int, payload: bytes = b"") -> bytes:
    prefix = _PREFIX.pack(SEALED, len(raw), len(payload))
    return prefix + tag_at(key, seq, prefix + raw) + raw + payload


def plain(raw: bytes, payload: bytes = b"") -> bytes:
    return _PREFIX.pack(MAGIC, len(raw), len(payload)) + raw + payload


def prefix_lie(frame: bytes, rng: random.Random) -> bytes:
    """The frame with its prefix changed: magic, header length (a little or oversize) or payload length."""
    magic, hlen, plen = _PREFIX.unpack(frame[:PREFIX_BYTES])
    op = rng.randrange(5)
    if op == 0:
        magic = rng.choice((MAGIC if magic == SEALED else SEALED, b"E2F2", b"\x16\x03\x01\x00", rng.randbytes(4)))
    elif op == 1:
        hlen = max(0, hlen + rng.choice((-40, -3, -1, 1, 2, 64, 700)))
    elif op == 2:
        hlen = rng.choice((MAX_HEADER + 1, MAX_WORKER_HEADER + 1, (1 << 32) - 1, PREAUTH_MAX_HEADER + 1))
    else:
        plen = rng.choice((1, 4096, MAX_PUSH_BYTES + 1, 1 << 40, (1 << 64) - 1))
    return _PREFIX.pack(magic, hlen, plen) + frame[PREFIX_BYTES:]


def fit(frame: bytes, *, max_header: int, max_payload: int = 0, relay: bool = False,
        rng: random.Random | None = None) -> bytes:
    """Exactly the bytes a server reads for `frame`: the prefix alone if the prefix is refused (a relay refuses
    an unsealed one at once), else prefix + tag + the claimed header and payload lengths, cut or padded with junk."""
    try:
        sealed, hlen, plen = check_prefix(frame[:PREFIX_BYTES], keyed=True, max_header=max_header,
                                          max_payload=max_payload)
    except ProtocolError:
        return frame[:PREFIX_BYTES]
    if relay and not sealed:
        return frame[:PREFIX_BYTES]
    n = PREFIX_BYTES + (TAG_BYTES if sealed else 0) + hlen + plen
    pad = n - len(frame)
    return frame[:n] + ((rng or random).randbytes(pad) if pad > 0 else b"")


def _opened(frame: bytes, key: FrameKey, seq: int, max_header: int,
            max_payload: int = 0) -> tuple[dict[str, Any], bool, bytes]:
    """The header the server decodes from a fitted frame, whether it was sealed and its payload, or ProtocolError."""
    sealed, hlen, plen = check_prefix(frame[:PREFIX_BYTES], keyed=True, max_header=max_header,
                                      max_payload=max_payload)
    k = FrameKey(key.key)
    k.seq = seq
    body_end = len(frame) - plen
    header = open_frame(frame[:PREFIX_BYTES], frame[PREFIX_BYTES:body_end], k, ())[0]
    return header, sealed, frame[body_end:]


def judge_control(
    frame: bytes, key: FrameKey, seq: int, allowed: tuple[type[m.WireMessage], ...]
) -> m.WireMessage | None:
    """After authentication: the message the coordinator takes from frame number `seq`, or None (a protocol
    error, which closes the connection): a payload on a message other than a push, or a push's payload of
    another length than its records' or with another SHA-256 than its header's."""
    try:
        header, _, payload = _opened(frame, key, seq, MAX_WORKER_HEADER, MAX_PUSH_BYTES)
        msg = m.parse(header, allowed)
    except ProtocolError:
        return None
    if not isinstance(msg, m.Trajectories):
        return None if payload else msg
    if len(payload) != msg.nbytes or msg.sha256 != (digest(payload) if payload else ""):
        return None
    return msg


def judge_hello(frame: bytes, key: FrameKey, allowed: type[m.WireMessage]) -> m.WireMessage | None:
    """Before authentication (a coordinator's hello, a relay's fetch): the parsed message, or None if refused."""
    try:
        header, sealed, _ = _opened(frame, key, 0, PREAUTH_MAX_HEADER)
        return m.parse(header, (allowed,)) if sealed else None
    except ProtocolError:
        return None


