"""Trajectory groups on the wire (runtime/protocol/groups.py): the binary record layout round-trips every record,
refuses a broken or oversized one with a TrajectoryRejected before building anything for it, and a worker's
headers fit the coordinator's 256 KiB header cap."""

from __future__ import annotations

import hashlib
import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo2sdk.core.records import MAX_EXTRA_CHARS, MIN_LOGPROB, Message, Meta, Trajectory, pack, text_limit
from echo2sdk.errors import ProtocolError, TrajectoryRejected
from echo2sdk.runtime.protocol.groups import (
    MAX_PUSH_BYTES, MAX_RECORDS, NO_MASK, decode_record, encode_groups, encode_record, record_limit, split_pushes,
)
from echo2sdk.runtime.protocol.messages import (
    MAX_ID, MAX_REASON, MAX_REPORT, Heartbeat, Received, Repair, Trajectories, parse, to_header,
)
from echo2sdk.runtime.protocol.wire import MAX_WORKER_HEADER

MAX_LEN = 64


def _record(prompt="Say echo.", response="echo", **meta) -> Trajectory:
    m = {"group_id": "g", "prompt_ids": (1, 2), "response_ids": (3, 4), "logprobs": (-0.1, -0.2), **meta}
    return Trajectory(prompt=prompt, response=response, reward=1.0, version=3, meta=Meta(**m))


def _back(t: Trajectory, max_len: int = MAX_LEN) -> Trajectory:
    return Trajectory.from_wire(decode_record(encode_record(t.to_wire()), max_len=max_len))


def test_text_and_chat_records_round_trip_with_every_field():
    chat = (Message(role="system", content="Be brief."), Message(role="user", content="2+2? 漢🙂"))
    records = [
        _record(),
        _record(prompt=chat, response="4 é", loss_mask=(1, 0), off_policy=True, worker="w-1",
                extra={"correct": True, "seed": 1 << 62, "note": "x" * 100, "none": None, "score": -0.5}),
        _record(prompt="", response="", logprobs=(MIN_LOGPROB, 0.0)),
    ]
    for t in records:
        assert _back(t) == t
    # exact floats: a log-prob is a float64, bit for bit
    t = _record(logprobs=(-1 / 3, -math.pi))
    assert _back(t).meta.logprobs == (-1 / 3, -math.pi)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_ids = st.lists(st.integers(0, (1 << 31) - 1), min_size=1, max_size=8)


@st.composite
def _records(draw):
    response_ids = draw(_ids)
    n = len(response_ids)
    chat = draw(st.booleans())
    prompt = tuple(Message(role=draw(st.sampled_from(["system", "user", "assistant", "tool"])), content=draw(_text))
                   for _ in range(draw(st.integers(0, 4)))) if chat else draw(_text)
    meta = Meta(group_id=draw(st.text(min_size=1, max_size=10)), prompt_ids=tuple(draw(_ids)),
                response_ids=tuple(response_ids),
                logprobs=tuple(draw(st.lists(st.floats(MIN_LOGPROB, 0.0), min_size=n, max_size=n))),
                loss_mask=draw(st.none() | st.lists(st.integers(0, 1), min_size=n, max_size=n).map(tuple)),
                off_policy=draw(st.booleans()), worker=draw(st.text(max_size=10)),
                extra=draw(st.dictionaries(st.text(max_size=8), st.none() | st.booleans() | st.integers(-5, 5)
                                           | st.floats(-1e18, 1e18) | _text, max_size=4)))
    return Trajectory(prompt=prompt, response=draw(_text), reward=draw(st.floats(-1e6, 1e6)),
                      version=draw(st.integers(0, 1 << 40)), meta=meta)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records())
def test_any_valid_record_round_trips(t):
    assert _back(t, max_len=64) == t


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_corrupted_record_is_rejected_never_crashes(data):
    """Bytes flipped, cut or added anywhere: the decoder and the schema raise TrajectoryRejected or give a valid
    record, never another exception."""
    blob = bytearray(encode_record(_record(prompt=(Message(role="user", content="hi"),), loss_mask=(1, 1),
                                           extra={"k": "v"}).to_wire()))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.integers(0, 2))
        if op == 0 and blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        elif op == 1:
            del blob[data.draw(st.integers(0, len(blob))):]
        else:
            blob[data.draw(st.integers(0, len(blob))):0] = data.draw(st.binary(max_size=8))
    try:
        Trajectory.from_wire(decode_record(bytes(blob), max_len=MAX_LEN))
    except TrajectoryRejected:
        pass


def test_layout_checks_name_the_field_and_refuse_before_building():
    good = encode_record(_record().to_wire())
    with pytest.raises(TrajectoryRejected, match=r"\(schema\).*record.*its lengths add up"):
        decode_record(good + b"x", max_len=MAX_LEN)
    with pytest.raises(TrajectoryRejected, match=r"\(schema\).*shorter than its 24-byte head"):
        decode_record(good[:10], max_len=MAX_LEN)
    with pytest.raises(TrajectoryRejected, match=r"\(too_long\).*'record'.*bytes"):
        decode_record(b"\0" * (record_limit(MAX_LEN) + 1), max_len=MAX_LEN)
    # more token ids than max_len: refused from the head, before any array is read
    head = struct.pack("<6I", 0, 2, 60, 10, 10, NO_MASK)
    with pytest.raises(TrajectoryRejected, match=r"\(too_long\).*prompt\+response exceeds 64"):
        decode_record(head, max_len=MAX_LEN)
    many = _record(prompt=tuple(Message(role="user", content="") for _ in range(65)))
    with pytest.raises(TrajectoryRejected, match=r"\(text_too_long\).*'prompt' = '65 messages'"):
        decode_record(encode_record(many.to_wire()), max_len=MAX_LEN)
    # a meta map with a key no record has, and texts that are not UTF-8
    wire = _record().to_wire()
    bad_meta = bytearray(encode_record(wire))
    n_meta = struct.unpack_from("<I", bad_meta)[0]
    meta = pack({"reward": 1.0, "version": 3, "chat": False, "group_id": "g", "worker": "", "off_policy": False,
                 "extra": {}, "evil": 1})
    blob = struct.pack("<I", len(meta)) + bad_meta[4:24] + meta + bad_meta[24 + n_meta:]
    with pytest.raises(TrajectoryRejected, match=r"\(schema\).*record.meta.*'evil'"):
        decode_record(blob, max_len=MAX_LEN)
    text_at = 24 + n_meta + 8
    broken = bytearray(good)
    broken[text_at] = 0xFF
    with pytest.raises(TrajectoryRejected, match=r"\(schema\).*record.texts.*not UTF-8"):
        decode_record(bytes(broken), max_len=MAX_LEN)


def test_the_schema_still_judges_every_value():
    """Values the layout carries are checked as before: a mask of 2, a NaN log-prob, a string reward."""
    def rejected(wire) -> str:
        with pytest.raises(TrajectoryRejected) as e:
            Trajectory.from_wire(decode_record(encode_record(wire), max_len=MAX_LEN))
        return e.value.reason

    wire = _record().to_wire()
    assert rejected({**wire, "meta": {**wire["meta"], "loss_mask": (1, 2)}}) == "out_of_range"
    assert rejected({**wire, "meta": {**wire["meta"], "logprobs": (math.nan, 0.0)}}) == "non_finite"
    assert rejected({**wire, "reward": "0.1"}) == "schema"
    assert rejected({**wire, "meta": {**wire["meta"], "logprobs": (-0.1,)}}) == "schema"  # lengths disagree
    too_much = {f"k{i}": "y" * 4000 for i in range(9)}  # each string within its bound, more than MAX_EXTRA_CHARS in all
    assert rejected({**wire, "meta": {**wire["meta"], "extra": too_much}}) == "out_of_range"
    # what the typed layout cannot carry is refused by the sender
    for bad in ({"loss_mask": (1, -1)}, {"response_ids": (3, 1 << 31)}, {"logprobs": ("a", 0.0)}):
        with pytest.raises((OverflowError, TypeError, ValueError)):
            encode_record({**wire, "meta": {**wire["meta"], **bad}})


def test_split_pushes_keeps_groups_whole_under_the_limit():
    groups = [[_record(response="x" * 1000, group_id=f"g{i}").to_wire()] * 4 for i in range(10)]
    one = encode_groups(groups)
    pushes, dropped = split_pushes(groups, limit=len(one.payload) // 3)
    assert dropped == {} and len(pushes) == 4 and all(len(p.payload) <= len(one.payload) // 3 for p in pushes)
    assert [n for p in pushes for n in p.groups] == [4] * 10
    assert b"".join(p.payload for p in pushes) == one.payload
    pushes, dropped = split_pushes(groups, limit=len(one.payload) // 20)  # one group alone is over: left out
    assert pushes == [] and dropped == {"over_push_limit": 10}
    assert split_pushes(groups) == ([one], {})
    bad = [[_record(response_ids=(3, 1 << 31), group_id="bad").to_wire()] * 4] + groups[:1]  # an id outside int32
    pushes, dropped = split_pushes(bad)
    assert dropped == {"unencodable": 1} and [p.groups for p in pushes] == [[4]]


def test_a_push_header_must_add_up():
    p = encode_groups([[_record().to_wire()] * 2])
    msg = Trajectories.of(p, batch="b", rid=1)
    assert msg.sha256 == hashlib.sha256(p.payload).hexdigest() and msg.nbytes == len(p.payload)
    assert parse(to_header(msg), (Trajectories,)) == msg
    with pytest.raises(ProtocolError, match="groups hold 3 records, sizes name 2"):
        parse({**to_header(msg), "groups": (3,)}, (Trajectories,))
    with pytest.raises(ProtocolError, match=f"more than a push's {MAX_PUSH_BYTES}"):
        parse({**to_header(msg), "groups": (2,), "sizes": struct.pack("<2I", MAX_PUSH_BYTES, 1)}, (Trajectories,))
    with pytest.raises(ProtocolError, match="not a whole number of u32"):
        parse({**to_header(msg), "sizes": b"\0" * 7}, (Trajectories,))


def test_the_largest_headers_a_worker_may_send_fit_the_header_cap():
    """Every worker message at its bounds, with 4-byte characters wherever a string may hold them: under
    wire.MAX_WORKER_HEADER, so an honest worker is never cut off by the cap."""
    wide = "🙂"
    ids = [wide * MAX_ID + str(i) for i in range(MAX_REPORT)]
    ids = [i[-MAX_ID:] for i in ids]
    received = Received(version=1, ok=True, seconds=1.0, parent=ids[0], served_bps={i: 1e9 for i in ids},
                        repairs=[Repair(parent=i, reason=wide * MAX_REASON, chunk=1 << 40, repair_s=1.0) for i in ids])
    push = Trajectories(rid=1 << 62, batch=wide * MAX_ID, groups=[MAX_RECORDS // 1024] * 1024,
                        sizes=struct.pack(f"<{MAX_RECORDS}I", *[MAX_PUSH_BYTES // MAX_RECORDS] * MAX_RECORDS),
                        sha256="0" * 64)
    from echo2sdk.core.failures import MAX_REASONS
    beat = Heartbeat(version=1 << 62, rollouts=1 << 62, rollouts_per_s=1.5,
                     failures={(wide * MAX_ID + str(i))[-MAX_ID:]: 1 << 62 for i in range(MAX_REASONS)})
    sizes = {m.type: len(pack(to_header(m))) for m in (received, push, beat)}
    assert max(sizes.values()) < MAX_WORKER_HEADER, sizes


def test_extra_over_its_character_budget_is_cut_by_the_worker_and_refused_at_intake():
    from echo2sdk.core.records import bounded_extra

    info = {f"k{i}": "z" * 4096 for i in range(20)}
    kept = bounded_extra(info)
    assert sum(len(k) + len(v) for k, v in kept.items()) <= MAX_EXTRA_CHARS and len(kept) == 7
    assert _back(_record(extra=kept)).meta.extra == kept
    assert text_limit(MAX_LEN) == 64 * MAX_LEN


def test_nothing_in_a_record_nests_and_nothing_nested_escapes():
    """The meta map holds no arrays (roles are bytes), so a meta map of nested array headers is refused at once;
    a reward nested a thousand maps deep is a schema rejection, never a RecursionError."""
    import time

    wire = _record().to_wire()
    good = encode_record(wire)
    n_meta = struct.unpack_from("<I", good)[0]
    nested = b"\x81\xa6reward" + b"\xdd" + struct.pack(">I", 1025) * 1000
    blob = struct.pack("<I", len(nested)) + good[4:24] + nested + good[24 + n_meta:]
    t0 = time.perf_counter()
    with pytest.raises(TrajectoryRejected, match=r"\(schema\).*record"):
        decode_record(blob, max_len=1024)
    assert time.perf_counter() - t0 < 0.005
    deep: dict = {}
    for _ in range(2000):
        deep = {"k": deep}
    with pytest.raises(TrajectoryRejected, match=r"\(schema\)") as e:
        Trajectory.from_wire({**wire, "reward": deep})
    assert "nested too deep" in str(e.value) or "dict" in str(e.value)


def test_the_worker_cuts_a_long_prompt_text_to_the_bound_instead_of_losing_the_record():
    """A long document's prompt text beside truncated ids: the worker cuts the text to records.text_limit(max_len)
    (its end), as the intake does, so the record is not refused for its size."""
    long_text = "x" * 200_000 + "THE END"
    chat = tuple(Message(role="user", content="y" * 150_000) for _ in range(2))
    pushes, dropped = split_pushes([[_record(prompt=long_text).to_wire(), _record(prompt=chat).to_wire()]],
                                   max_len=MAX_LEN)
    assert dropped == {} and len(pushes) == 1
    blobs, at = [], 0
    for n in pushes[0].sizes:
        blobs.append(pushes[0].payload[at:at + n])
        at += n
    text, msgs = (Trajectory.from_wire(decode_record(b, max_len=MAX_LEN)).prompt for b in blobs)
    assert len(text) == text_limit(MAX_LEN) and text.endswith("THE END")
    assert sum(len(m.content) for m in msgs) == text_limit(MAX_LEN) and len(msgs) == 1


def test_adapter_info_leaves_room_for_the_keys_the_runtime_adds():
    """An episode's record adds correct, turns, failed and aborted after bounded_extra(score.info): info at the
    bounds must still give a valid Meta (it crashed the worker when bounded_extra used the whole budget)."""
    from echo2sdk.core.records import MAX_EXTRA_KEYS, bounded_extra

    for info in ({f"k{i:03d}": "z" * 4000 for i in range(20)}, {f"k{i:03d}": i for i in range(400)}):
        extra = bounded_extra(info)
        extra.update(correct=True, turns=3, failed=False, aborted="max_turns")
        assert len(extra) <= MAX_EXTRA_KEYS
        Meta(group_id="g", prompt_ids=(1,), response_ids=(2,), logprobs=(-0.1,), extra=extra)  # no ValidationError
