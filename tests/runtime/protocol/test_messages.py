"""The typed wire messages: every message round-trips through msgpack, every bound is enforced with an
error naming the message type, the field and the value, and nothing a peer sends makes `parse` raise
anything but ProtocolError."""

from __future__ import annotations

import copy
import math
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2sdk.core.broadcast.manifest import MAX_CHUNKS, Signer, build_manifest
from echo2sdk.core.records import pack, unpack
from echo2sdk.errors import ConfigError, ProtocolError
from echo2sdk.runtime.broadcast.delivery import DirectPush, check_delivery
from echo2sdk.runtime.protocol.messages import (
    Ack,
    BaseFiles,
    Challenge,
    Chunk,
    Fetch,
    GetBase,
    GetTasks,
    Heartbeat,
    Hello,
    Installed,
    Received,
    Refused,
    Shutdown,
    Snapshot,
    SnapshotInStore,
    SnapshotPlan,
    SnapshotRejected,
    Tasks,
    Trajectories,
    Unavailable,
    Wait,
    Welcome,
    WireMessage,
    WorkerConfig,
    clip,
    parse,
    to_header,
)
from echo2sdk.runtime.broadcast.relay import FetchReport
from echo2sdk.runtime.protocol.wire import digest

KEY = b"k" * 32
NONCE = b"n" * 32
FP = b"f" * 32
MANIFEST = build_manifest(os.urandom(3 * (4 << 10)), 7, 4 << 10, Signer()).to_wire()
TASK = {"id": "toy-0-1", "messages": [{"role": "user", "content": "Say echo."}], "answer": "echo", "info": {"k": 1}}
REPORT = FetchReport(
    version=7, ok=True, seconds=0.5, parent="a", served_bps={"a": 1.5e6, "b": 2.0},
    repairs=[{"parent": "b", "reason": "stalled", "chunk": 3, "repair_s": 0.25},
             {"parent": "c", "reason": "refused", "chunk": 0}],
    bad_chunks=1,
).to_wire()
TRAINER_CONFIG = {  # what echo2sdk.runtime.learner.recipe builds
    "model": "smollm2-135m", "model_path": "/tmp/model", "adapter": "math", "adapter_options": {"split": "train"},
    "backend": "hf", "backend_options": {"threads": 2}, "group_size": 4, "tasks_per_request": 2,
    "sampling": {"max_new_tokens": 96, "temperature": 1.0, "top_p": 1.0}, "max_len": 1024,
}

#: one valid instance of every message, as its fields
SAMPLES: dict[type[WireMessage], dict] = {
    Challenge: {"nonce": os.urandom(32)},
    Hello: {"nonce": NONCE, "worker_id": "w-1", "session": "ab12", "price_per_hour": 0.35, "relay_port": 4242,
            "relay_fingerprint": FP,
            "version": 3},
    Refused: {"reason": "authentication failed: wrong token"},
    Welcome: {"worker_id": "w-1", "config": {**TRAINER_CONFIG, "heartbeat_s": 0.2, "staleness": 2}, "version": 5,
              "broadcast": {"public_key": KEY, "stall_timeout_s": 5.0, "min_relay_bps": 125000.0,
                            "store": {"url": "s3://bucket/run", "options": {"region": "eu-west-1"}}}},
    GetTasks: {"n": 2, "rid": 9},
    Tasks: {"rid": 9, "tasks": [TASK, {"id": "sandbox-0-0", "messages": []}]},
    Trajectories: {"rid": 10, "batch": "ab12:0", "groups": [2, 0], "sizes": struct.pack("<2I", 93, 1000),
                   "sha256": digest(b"x")},
    Ack: {"rid": 10, "accepted": 2, "rejected": ["schema"], "duplicate": False},
    Heartbeat: {"version": 3, "rollouts": 120, "rollouts_per_s": 4.5},
    Snapshot: {"version": 4, "nbytes": 3, "sha256": digest(b"abc")},
    SnapshotInStore: {"version": 6},
    SnapshotPlan: {"manifest": MANIFEST, "upstream": [["a", "127.0.0.1", 4242, FP], ["learner", "0.0.0.0", 1, b""]]},
    Received: REPORT,
    Installed: {"version": 4, "install_s": 0.8},
    SnapshotRejected: {"version": None, "reason": "bad signature", "from_store": True},
    Shutdown: {},
    GetBase: {},
    BaseFiles: {"files": [{"name": "config.json", "nbytes": 3, "sha256": digest(b"abc")}], "reason": ""},
    Fetch: {"node_id": "b", "nonce": NONCE, "version": 7, "start": 2},
    Unavailable: {"version": 7},
    Wait: {},
    Chunk: {"i": 2},
}
ALL = tuple(SAMPLES)


def _header(cls: type[WireMessage]) -> dict:
    return to_header(cls(**SAMPLES[cls]))


def _with(header: dict, path: str, value: object) -> dict:
    """A deep copy of `header` with the field at dotted `path` (list items by index) set to `value`."""
    out = copy.deepcopy(header)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
        if isinstance(node, tuple):
            raise AssertionError("build samples with lists")
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


def _listed(obj: object) -> object:
    """to_header gives tuples; the samples' nested containers must be lists to be edited."""
    if isinstance(obj, dict):
        return {k: _listed(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_listed(v) for v in obj]
    return obj


def test_every_message_has_a_sample():
    assert {c for c in WireMessage.__subclasses__()} == set(SAMPLES)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_message_round_trips_through_msgpack(cls):
    msg = cls(**SAMPLES[cls])
    header = unpack(pack(to_header(msg)))
    assert header["type"] == msg.type
    back = parse(header, ALL)
    assert type(back) is cls and back == msg
    with pytest.raises(Exception):  # frozen
        msg.type = "other"  # type: ignore[misc]


def test_nested_values_survive_the_round_trip():
    welcome = parse(unpack(pack(_header(Welcome))), (Welcome,))
    assert isinstance(welcome.config, WorkerConfig) and welcome.config.sampling.max_new_tokens == 96
    assert welcome.config.adapter_options == {"split": "train"} and welcome.broadcast.public_key == KEY
    plan = parse(unpack(pack(_header(SnapshotPlan))), (SnapshotPlan,))
    assert plan.manifest.model_dump() == {**MANIFEST, "chunks": tuple(MANIFEST["chunks"])}
    assert plan.upstream[0] == ("a", "127.0.0.1", 4242, FP) and plan.upstream[1][3] == b""
    report = parse(unpack(pack(_header(Received))), (Received,))
    assert report.repairs[0].repair_s == 0.25 and report.repairs[1].repair_s is None
    assert report.model_dump(exclude_none=True)["repairs"][1] == {"parent": "c", "reason": "refused", "chunk": 0}


BOUNDS = [
    (Challenge, "nonce", b"n" * 31),
    (Challenge, "nonce", b"n" * 33),
    (Hello, "nonce", b""),
    (Hello, "relay_fingerprint", b"f" * 31),
    (Hello, "relay_fingerprint", b"f" * 33),
    (Hello, "worker_id", "w" * 129),
    (Hello, "session", "s" * 129),
    (Hello, "price_per_hour", -0.01),
    (Hello, "price_per_hour", math.nan),
    (Hello, "price_per_hour", math.inf),
    (Hello, "relay_port", 0),
    (Hello, "relay_port", 65536),
    (Hello, "version", -1),
    (Hello, "version", 1 << 63),
    (Refused, "reason", "r" * 1025),
    (Welcome, "worker_id", ""),
    (Welcome, "version", -2),
    (Welcome, "config.group_size", 0),
    (Welcome, "config.tasks_per_request", 1025),
    (Welcome, "config.heartbeat_s", 0.0),
    (Welcome, "config.heartbeat_s", math.inf),
    (Welcome, "config.staleness", -1),
    (Welcome, "config.max_len", 0),
    (Welcome, "config.model_path", "p" * 4097),
    (Welcome, "config.adapter", "a" * 257),
    (Welcome, "config.sampling.top_p", 0.0),
    (Welcome, "config.sampling.top_p", 1.5),
    (Welcome, "config.sampling.temperature", math.nan),
    (Welcome, "config.sampling.max_new_tokens", 0),
    (Welcome, "broadcast.public_key", b"k" * 31),
    (Welcome, "broadcast.stall_timeout_s", 0.0),
    (Welcome, "broadcast.min_relay_bps", 0.0),
    (Welcome, "broadcast.min_relay_bps", math.inf),
    (GetTasks, "n", 0),
    (GetTasks, "n", 1025),
    (GetTasks, "rid", -1),
    (Tasks, "tasks", [TASK] * 1025),
    (Tasks, "tasks.0.id", "t" * 257),
    (Tasks, "tasks.0.answer", "a" * ((1 << 20) + 1)),
    (Tasks, "tasks.0.messages", [{"role": "user", "content": "x"}] * 257),
    (Trajectories, "groups", [0] * 1025),
    (Trajectories, "groups.0", -1),
    (Trajectories, "sizes", b"\0" * (4 * (1 << 14) + 4)),
    (Trajectories, "sha256", "ab"),
    (Trajectories, "batch", "b" * 129),
    (Ack, "accepted", -1),
    (Ack, "rejected", ["schema"] * 1025),
    (Heartbeat, "version", -1),
    (Heartbeat, "rollouts", -1),
    (Heartbeat, "rollouts_per_s", -1.0),
    (Heartbeat, "rollouts_per_s", math.nan),
    (Snapshot, "nbytes", -1),
    (Snapshot, "nbytes", (8 << 30) + 1),
    (Snapshot, "sha256", "0" * 63),
    (Snapshot, "sha256", "A" * 64),
    (SnapshotPlan, "upstream", []),
    (SnapshotPlan, "upstream", [["a", "h", 1, b""]] * 4097),
    (SnapshotPlan, "upstream.0.3", b"f" * 16),
    (SnapshotPlan, "upstream.0.2", 0),
    (SnapshotPlan, "upstream.0.0", "n" * 129),
    (SnapshotPlan, "upstream.0.1", "h" * 256),
    (SnapshotPlan, "manifest.algo", "sha256"),
    (SnapshotPlan, "manifest.version", -1),
    (SnapshotPlan, "manifest.chunk_bytes", 1024),
    (SnapshotPlan, "manifest.total_bytes", (1 << 40) + 1),
    (SnapshotPlan, "manifest.chunks.0", b"d" * 31),
    (SnapshotPlan, "manifest.digest", b"d" * 33),
    (SnapshotPlan, "manifest.signature", b"s" * 63),
    (Received, "version", -1),
    (Received, "seconds", math.inf),
    (Received, "parent", "p" * 129),
    (Received, "served_bps.a", -1.0),
    (Received, "repairs.0.reason", "r" * 1025),
    (Received, "repairs.0.chunk", -1),
    (Received, "repairs.0.repair_s", math.nan),
    (Received, "bad_chunks", -1),
    (Installed, "version", -1),
    (Installed, "install_s", -0.5),
    (SnapshotRejected, "version", -1),
    (SnapshotRejected, "reason", "r" * 1025),
    (BaseFiles, "files", [{"name": "config.json", "nbytes": 3, "sha256": digest(b"abc")}] * 33),
    (BaseFiles, "files.0.name", "n" * 257),
    (BaseFiles, "files.0.nbytes", (256 << 20) + 1),
    (BaseFiles, "files.0.sha256", "0" * 63),
    (BaseFiles, "reason", "r" * 1025),
    (Fetch, "node_id", "n" * 129),
    (Fetch, "nonce", b"n" * 16),
    (Fetch, "version", -1),
    (Fetch, "start", -1),
    (Fetch, "start", MAX_CHUNKS + 1),
    (Unavailable, "version", -1),
    (Chunk, "i", -1),
    (Chunk, "i", MAX_CHUNKS),
]


@pytest.mark.parametrize(("cls", "path", "value"), BOUNDS, ids=[f"{c.__name__}.{p}" for c, p, _ in BOUNDS])
def test_each_bound_is_enforced_naming_the_type_field_and_value(cls, path, value):
    header = _with(_listed(_header(cls)), path, value)
    with pytest.raises(ProtocolError) as e:
        parse(header, ALL)
    text = str(e.value)
    assert text.startswith(f"{cls.model_fields['type'].default} message: field '{path}")
    if isinstance(value, (int, float, str, bytes)):
        assert repr(value)[:40] in text


WRONG_TYPES = [
    (Hello, "version", "3"),
    (Hello, "version", 3.0),
    (Hello, "version", True),
    (Hello, "nonce", "n" * 32),
    (Hello, "relay_fingerprint", "f" * 32),
    (Hello, "relay_port", "4242"),
    (Refused, "reason", b"bytes"),
    (Welcome, "config", "cfg"),
    (Welcome, "config.group_size", 4.0),
    (GetTasks, "n", None),
    (Tasks, "tasks", "abc"),
    (Tasks, "tasks.0.messages.0.content", 5),
    (Trajectories, "groups", {"a": 1}),
    (Ack, "duplicate", 1),
    (Heartbeat, "rollouts_per_s", "1.0"),
    (SnapshotPlan, "upstream.0", "a:1"),
    (SnapshotPlan, "manifest", [1, 2]),
    (Received, "ok", "yes"),
    (Received, "served_bps", [1.0]),
    (Chunk, "i", b"\x01"),
]


@pytest.mark.parametrize(("cls", "path", "value"), WRONG_TYPES, ids=[f"{c.__name__}.{p}" for c, p, _ in WRONG_TYPES])
def test_wrong_types_are_rejected(cls, path, value):
    with pytest.raises(ProtocolError, match=f"field '{path}"):
        parse(_with(_listed(_header(cls)), path, value), ALL)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_unknown_keys_are_rejected(cls):
    with pytest.raises(ProtocolError, match="field 'surprise' = 1: Extra inputs are not permitted"):
        parse({**_header(cls), "surprise": 1}, ALL)


def test_missing_fields_unknown_types_and_non_maps_are_protocol_errors():
    with pytest.raises(ProtocolError, match="hello message: field 'nonce' missing"):
        parse({"type": "hello"}, ALL)
    with pytest.raises(ProtocolError, match=r"unexpected message type 'hello' \(expected challenge\)"):
        parse(_header(Hello), (Challenge,))
    with pytest.raises(ProtocolError, match="unexpected message type 'teleport'"):
        parse({"type": "teleport"}, ALL)
    for bad in ([1, 2], None, b"hello", {"type": 3}, {"type": {"nested": 1}}, {}):
        with pytest.raises(ProtocolError, match="without a string 'type'"):
            parse(bad, ALL)
    with pytest.raises(ProtocolError, match="challenge message: field '7' = 7: Keys should be strings"):
        parse({"type": "challenge", "nonce": b"n" * 32, 7: 1}, ALL)


# -- arbitrary input never raises anything but ProtocolError -------------------------------------------
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 64), max_value=1 << 64), st.floats(),
    st.text(max_size=40), st.binary(max_size=40),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=10) | st.integers(), inner, max_size=5)
    ),
    max_leaves=20,
)
_names = sorted({f for c in ALL for f in c.model_fields} | {"tasks", "groups", "config"})
_types = st.sampled_from([c.model_fields["type"].default for c in ALL])


@st.composite
def _headers(draw):
    kind = draw(st.integers(0, 2))
    if kind == 0:  # anything at all
        return draw(st.dictionaries(st.sampled_from(_names) | st.text(max_size=10), _values, max_size=8))
    if kind == 1:  # a known type with arbitrary known fields
        fields = draw(st.dictionaries(st.sampled_from(_names), _values, max_size=6))
        return {**fields, "type": draw(_types)}
    header = _listed(_header(draw(st.sampled_from(ALL))))  # a valid message with one field replaced
    key = draw(st.sampled_from(sorted(header)))
    return {**header, key: draw(_values)}


@settings(max_examples=400, deadline=None)
@given(_headers())
def test_parse_raises_only_protocol_errors_on_arbitrary_headers(header):
    try:
        msg = parse(header, ALL)
    except ProtocolError:
        return
    assert isinstance(msg, WireMessage) and msg.type == header["type"]


# -- the worker config, the delivery Protocol, clipping ----------------------------------------------------
def test_the_trainers_worker_config_mapping_validates_into_a_typed_config():
    cfg = WorkerConfig.from_mapping(TRAINER_CONFIG, heartbeat_s=1, staleness=3)
    assert cfg.heartbeat_s == 1.0 and cfg.staleness == 3 and cfg.sampling.top_p == 1.0 and cfg.max_len == 1024
    assert WorkerConfig.from_mapping(cfg, staleness=4).staleness == 4
    assert WorkerConfig.from_mapping({}) == WorkerConfig()  # a relay-only fleet needs none of it
    with pytest.raises(ConfigError, match="worker config: field 'grop_size' = 4: Extra inputs"):
        WorkerConfig.from_mapping({"grop_size": 4})
    with pytest.raises(ConfigError, match="worker config: field 'sampling.temperature' = -1.0"):
        WorkerConfig.from_mapping({**TRAINER_CONFIG, "sampling": {"temperature": -1.0}})


def test_deliveries_are_checked_against_the_protocol():
    assert check_delivery(DirectPush()) is not None
    assert DirectPush().welcome_info() is None

    class Partial:
        async def deliver(self, version, weights, peers): ...

    with pytest.raises(TypeError, match="Partial is not a SnapshotDelivery: it lacks welcome_info, on_report, close"):
        check_delivery(Partial())


def test_clip_keeps_reasons_inside_their_bound():
    assert clip("short") == "short"
    long = clip("x" * 5000)
    assert len(long) == 1024 and long.endswith("...")
    assert SnapshotRejected(reason=long).reason == long
