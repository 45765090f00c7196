"""Trajectory groups on the wire: a compact binary payload behind a small sealed header.

A push is one `Trajectories` frame. Its header (MACed) holds the records per group, each record's byte length and
the SHA-256 of the payload; the payload holds the records one after the other, each in this layout (little-endian):

    6 x u32   meta bytes | texts | prompt ids | response ids | log-probs | loss-mask entries (NO_MASK: none)
    meta      msgpack map of scalars and meta.extra's map: reward, version, group_id, worker, off_policy, extra, chat
              (false: a text prompt); no arrays, so no nesting that msgpack would allocate for before it fails
    u32 each  the texts' UTF-8 byte lengths: the prompt (or each chat message's content), then the response
    uint8     with a chat prompt, each message's role (ROLES: 0 system, 1 user, 2 assistant, 3 tool)
    texts     UTF-8
    int32     prompt ids, then response ids
    float64   log-probs
    uint8     loss mask

`decode_record` reads a record back into the wire map `Trajectory.from_wire` validates, so a record meets the same
checks as when it travelled as msgpack; only its layout is checked here, against the run's max_len and before
anything is allocated for it: a record's bytes at most `record_limit(max_len)`, its lengths adding up to exactly its
bytes, its meta part at most MAX_META_BYTES and decoded with msgpack limits. Token ids and log-probs never
become msgpack objects (one C call per array), so no record holds the interpreter for long (the intake decodes on a
thread of the coordinator's executor; its event loop keeps serving the other workers).
"""

from __future__ import annotations

import array
import logging
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgpack

from echo2sdk.core.checks import shown
from echo2sdk.core.records import MAX_CHARS_PER_TOKEN, MAX_EXTRA_CHARS, MAX_EXTRA_KEYS, MAX_ID_CHARS, pack, text_limit
from echo2sdk.errors import TrajectoryRejected

__all__ = ["Push", "encode_record", "decode_record", "encode_groups", "split_pushes", "cut_prompt", "record_limit",
           "MAX_META_BYTES", "MAX_PUSH_BYTES", "MAX_RECORDS", "NO_MASK", "ROLES"]

MAX_PUSH_BYTES = 16 << 20  # one push's payload; a worker splits a larger batch into several pushes (by groups)
MAX_RECORDS = 1 << 14  # records of one push
NO_MASK = 0xFFFFFFFF  # no loss mask: every response token carries loss
_HEAD = struct.Struct("<6I")
_META_KEYS = frozenset({"reward", "version", "group_id", "worker", "off_policy", "extra", "chat"})
ROLES = ("system", "user", "assistant", "tool")  # a chat message's role, by its code (records.Message.role)
_ROLE_CODES = {r: i for i, r in enumerate(ROLES)}
_SWAP = sys.byteorder != "little"
log = logging.getLogger("echo2sdk.worker")
# the most bytes a record's meta map takes: its own fields (two ids, numbers, flags) and meta.extra at its bounds
# (records.py: UTF-8 keys and strings, each entry's headers and number)
MAX_META_BYTES = 4096 + 2 * 4 * MAX_ID_CHARS + 4 * MAX_EXTRA_CHARS + 16 * MAX_EXTRA_KEYS


class Push(NamedTuple):
    """One push's part of a batch: records per group, each record's byte length, the payload."""

    groups: list[int]
    sizes: list[int]
    payload: bytes


def record_limit(max_len: int) -> int:
    """The most bytes one admissible record takes: the meta map, the prompt and response texts at their bound
    (records.text_limit, 4 bytes a character at most in UTF-8) with a length per message, and max_len tokens of
    ids (4 bytes), log-probs (8) and loss mask (1). A record over it is refused before it is decoded."""
    texts = 2 * 4 * MAX_CHARS_PER_TOKEN * max_len + 5 * (max_len + 2)  # + a length and a role each
    return _HEAD.size + MAX_META_BYTES + texts + (4 + 8 + 1) * max_len


def encode_record(rec: Mapping[str, Any], text_limit: int | None = None) -> bytes:
    """A record's bytes, from its wire map (`Trajectory.to_wire()`); with `text_limit` a longer prompt text is cut
    to its last `text_limit` characters first (records.cut_prompt: the learner trains on the ids). Raises
    TypeError, ValueError, KeyError, OverflowError or UnicodeEncodeError when a field cannot take its layout (a
    token id outside int32, a role no chat has, a lone surrogate)."""
    meta = rec["meta"]
    prompt = rec["prompt"] if text_limit is None else cut_prompt(rec["prompt"], text_limit)
    if isinstance(prompt, str):
        texts, roles = [prompt], b""
    else:
        texts, roles = [m["content"] for m in prompt], bytes(_ROLE_CODES[m["role"]] for m in prompt)
    texts.append(rec["response"])
    encoded = [t.encode("utf-8") for t in texts]
    head = {"reward": rec["reward"], "version": rec["version"], "chat": not isinstance(prompt, str)}
    head.update((k, meta[k]) for k in ("group_id", "worker", "off_policy", "extra") if k in meta)
    packed = pack(head)
    mask = meta.get("loss_mask")
    arrays = [_typed("i", meta["prompt_ids"]), _typed("i", meta["response_ids"]), _typed("d", meta["logprobs"])]
    if mask is not None:
        arrays.append(_typed("B", mask))
    n_mask = NO_MASK if mask is None else len(mask)
    parts = [_HEAD.pack(len(packed), len(encoded), len(meta["prompt_ids"]), len(meta["response_ids"]),
                        len(meta["logprobs"]), n_mask), packed,
             struct.pack(f"<{len(encoded)}I", *map(len, encoded)), roles, *encoded, *(a.tobytes() for a in arrays)]
    return b"".join(parts)


def decode_record(blob: bytes | memoryview, *, max_len: int) -> dict[str, Any]:
    """The wire map of one record's bytes (for `Trajectory.from_wire`); TrajectoryRejected when its layout is
    broken ("schema") or it is larger than any admissible record ("too_long", "text_too_long")."""
    view = memoryview(blob)
    if view.nbytes > record_limit(max_len):
        raise TrajectoryRejected("too_long", "record", f"{view.nbytes} bytes",
                                 f"more than any record of max_len = {max_len} tokens takes ({record_limit(max_len)})")
    if view.nbytes < _HEAD.size:
        raise TrajectoryRejected("schema", "record", f"{view.nbytes} bytes", f"shorter than its {_HEAD.size}-byte head")
    n_meta, n_texts, n_prompt, n_response, n_logprobs, n_mask = _HEAD.unpack_from(view)
    if n_meta > MAX_META_BYTES:
        raise TrajectoryRejected("schema", "record.meta", f"{n_meta} bytes", f"more than {MAX_META_BYTES}")
    if n_texts == 0:
        raise TrajectoryRejected("schema", "record.texts", 0, "a record has a response text at least")
    if n_texts > max_len + 1:  # every chat message costs a token at least (records.check_admissible)
        raise TrajectoryRejected("text_too_long", "prompt", f"{n_texts - 1} messages", f"more than max_len = {max_len}")
    if n_prompt + n_response > max_len:  # the learner would refuse it anyway: nothing is built for it
        raise TrajectoryRejected("too_long", "meta.response_ids", n_prompt + n_response,
                                 f"prompt+response exceeds {max_len} tokens")
    mask_bytes = 0 if n_mask == NO_MASK else n_mask
    at = _HEAD.size + n_meta
    lengths_end = at + 4 * n_texts
    if lengths_end > view.nbytes:
        raise TrajectoryRejected("schema", "record", f"{view.nbytes} bytes", "cut short in its text lengths")
    head = _meta(view[_HEAD.size:at])
    chat = head.pop("chat", False)
    n_roles = n_texts - 1 if chat is True else 0
    lengths = struct.unpack_from(f"<{n_texts}I", view, at)
    size = lengths_end + n_roles + sum(lengths) + 4 * (n_prompt + n_response) + 8 * n_logprobs + mask_bytes
    if size != view.nbytes:
        raise TrajectoryRejected("schema", "record", f"{view.nbytes} bytes", f"its lengths add up to {size}")
    roles = bytes(view[lengths_end:lengths_end + n_roles])
    texts, at = [], lengths_end + n_roles
    for n in lengths:
        try:
            texts.append(str(view[at:at + n], "utf-8"))
        except UnicodeDecodeError as e:
            raise TrajectoryRejected("schema", "record.texts", f"byte {at + e.start}", "not UTF-8") from None
        at += n
    prompt_ids, at = _array("i", view, at, n_prompt)
    response_ids, at = _array("i", view, at, n_response)
    logprobs, at = _array("d", view, at, n_logprobs)
    mask = None if n_mask == NO_MASK else _array("B", view, at, n_mask)[0]
    if chat is not True:
        if n_texts != 2:
            raise TrajectoryRejected("schema", "record.texts", n_texts, "a text prompt and a response are 2 texts")
        prompt: Any = texts[0]
    else:
        prompt = tuple({"role": ROLES[r] if r < len(ROLES) else f"code {r}", "content": c} for r, c in zip(roles, texts))
    meta = {k: head.pop(k) for k in ("group_id", "worker", "off_policy", "extra") if k in head}
    meta.update(prompt_ids=prompt_ids, response_ids=response_ids, logprobs=logprobs, loss_mask=mask)
    return {**{k: head[k] for k in ("reward", "version") if k in head}, "prompt": prompt, "response": texts[-1],
            "meta": meta}


def encode_groups(groups: Sequence[Sequence[Mapping[str, Any]]]) -> Push:
    """One push of `groups` (wire maps): records per group, their byte lengths, the payload."""
    return _push([[encode_record(r) for r in g] for g in groups])


def _push(groups: Sequence[Sequence[bytes]]) -> Push:
    """The Push of groups of encoded records."""
    return Push([len(g) for g in groups], [len(b) for g in groups for b in g], b"".join(b for g in groups for b in g))


def split_pushes(groups: Sequence[Sequence[Mapping[str, Any]]], limit: int = MAX_PUSH_BYTES,
                 max_len: int | None = None) -> tuple[list[Push], dict[str, int]]:
    """`groups` as pushes of at most `limit` payload bytes and MAX_RECORDS records each (whole groups, in order;
    with `max_len`, prompt texts cut to records.text_limit(max_len) first), and the groups left out by reason:
    "over_push_limit" (one alone is over the limit: a coordinator would refuse it) and "unencodable" (a value the
    layout cannot carry, e.g. a token id outside int32)."""
    pushes: list[Push] = []
    cur: list[list[bytes]] = []
    cur_bytes = cur_records = 0
    dropped: dict[str, int] = {}
    cut = None if max_len is None else text_limit(max_len)

    def flush() -> None:
        if cur:
            pushes.append(_push(cur))
            cur.clear()

    for g in groups:
        try:
            blobs = [encode_record(r, cut) for r in g]
        except (TypeError, ValueError, KeyError, OverflowError) as e:  # UnicodeEncodeError is a ValueError
            dropped["unencodable"] = dropped.get("unencodable", 0) + 1
            log.warning("a group left out of the push: a value its layout cannot carry (%s: %s)", type(e).__name__,
                        str(e)[:200])
            continue
        nbytes = sum(map(len, blobs))
        if nbytes > limit or len(blobs) > MAX_RECORDS:
            dropped["over_push_limit"] = dropped.get("over_push_limit", 0) + 1
            continue
        if cur and (cur_bytes + nbytes > limit or cur_records + len(blobs) > MAX_RECORDS):
            flush()
            cur_bytes = cur_records = 0
        cur.append(blobs)
        cur_bytes, cur_records = cur_bytes + nbytes, cur_records + len(blobs)
    flush()
    return pushes, dropped


def cut_prompt(prompt: Any, limit: int) -> Any:
    """A wire map's prompt with at most `limit` characters of text (records.text_limit): a text's end, or the newest
    chat messages whole and then the end of the one that does not fit. A worker keeps a long document's whole text
    while its prompt_ids were truncated to fit max_len, and the learner trains on the ids: the worker cuts before
    encoding, the intake again for any other sender. A response over the bound is still refused (its text is what
    its ids decode to), and so is a chat prompt with more messages than max_len."""
    if isinstance(prompt, str):
        return prompt if len(prompt) <= limit else prompt[-limit:]
    if sum(len(m["content"]) for m in prompt) <= limit:
        return prompt
    kept, room = [], limit
    for m in reversed(prompt):
        if room <= 0:
            break
        kept.append(m if len(m["content"]) <= room else {**m, "content": m["content"][-room:]})
        room -= len(kept[-1]["content"])
    return tuple(reversed(kept))


def _typed(code: str, values: Sequence[Any]) -> array.array:
    a = array.array(code, values)
    if _SWAP:
        a.byteswap()
    return a


def _array(code: str, view: memoryview, at: int, n: int) -> tuple[tuple[Any, ...], int]:
    a = array.array(code)
    end = at + n * a.itemsize
    a.frombytes(view[at:end])
    if _SWAP:
        a.byteswap()
    return tuple(a), end


def _meta(raw: memoryview) -> dict[str, Any]:
    """A record's meta map, decoded under limits (no arrays at all); TrajectoryRejected("schema") if it is no map
    of known keys."""
    try:
        head = msgpack.unpackb(raw, raw=False, use_list=False, strict_map_key=True, max_str_len=raw.nbytes,
                               max_bin_len=0, max_ext_len=0, max_array_len=0,
                               max_map_len=max(len(_META_KEYS), MAX_EXTRA_KEYS))
    except Exception as e:  # noqa: BLE001 - msgpack raises several exception types
        raise TrajectoryRejected("schema", "record.meta", f"{raw.nbytes} bytes",
                                 f"undecodable: {type(e).__name__}: {str(e)[:80]}") from None
    if not isinstance(head, dict):
        raise TrajectoryRejected("schema", "record.meta", type(head).__name__, "a map")
    unknown = next((k for k in head if k not in _META_KEYS), None)
    if unknown is not None:
        raise TrajectoryRejected("schema", "record.meta", shown(unknown, 60), "not a field of a record")
    return head

