"""Trajectory intake: the groups of records a worker pushes (a sealed header and a binary payload:
runtime/protocol/groups.py), admitted once per batch id, checked against the header, decoded, validated and
buffered on a thread of the loop's executor (a large push delays no other worker's messages), every record
attributed to its authenticated sender, and a push whose records lie about their sender or version quarantines it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Trajectory, text_limit
from echo2sdk.errors import ProtocolError, TrajectoryRejected
from echo2sdk.runtime.protocol.groups import cut_prompt, decode_record, record_limit
from echo2sdk.runtime.protocol.messages import Ack, Trajectories, shown

if TYPE_CHECKING:
    from echo2sdk.runtime.coordinator.handout import Handout
    from echo2sdk.runtime.coordinator.connection import Conn
    from echo2sdk.runtime.coordinator.registry import Registry

__all__ = ["Intake", "LOGGED_REJECTIONS"]

log = logging.getLogger("echo2sdk.coordinator")

LOGGED_REJECTIONS = 8  # rejected groups of one push logged one by one; the rest in one summary line
#: Rejections that are normal operation: a group generated on a snapshot older than v_t - S (bounded staleness
#: drops it by design). Logged at INFO (run.log, not the console); summary.json's coordinator.rejected counts them.
ROUTINE = frozenset({"stale"})
READ_SPAN = 1 << 20  # records read from the connection in one await, at most (a larger record alone)


class Intake:
    """Admits pushed groups into `buffer` (records checked against `vocab_size` and `max_len`); `rejected`
    counts the rejected records by reason and `empty_groups` the groups refused for holding none (so that records
    pushed = accepted + rejected holds); a lying worker is quarantined in `registry`."""

    def __init__(self, buffer: StalenessBuffer, registry: Registry, *, vocab_size: int, max_len: int,
                 handout: Handout | None = None):
        self.buffer, self.registry, self.handout = buffer, registry, handout
        self.vocab_size, self.max_len = vocab_size, max_len
        self.rejected: Counter[str] = Counter()
        self.empty_groups = 0  # groups of no record refused (summary.json's coordinator.empty_groups)

    async def admit(self, conn: Conn, msg: Trajectories) -> Ack | None:
        """Admit a push of groups once per batch id: a re-sent push is acknowledged, not re-admitted. The payload
        is read from the connection record by record (`_read`), checked against the sealed header (its length and
        SHA-256: ProtocolError if either is wrong), then decoded, validated and buffered on an executor thread (the
        buffer takes its own lock) and counted here, on the loop: a push of a thousand groups holds up no other
        worker's messages. None, with the worker quarantined, when a record lies about its sender or version
        (nothing of the push is admitted)."""
        sizes = msg.record_sizes  # unpacked once for the checks, the read and the intake
        if conn.channel.unread != sum(sizes):
            raise ProtocolError(f"trajectories: a {conn.channel.unread}-byte payload for records of {sum(sizes)} bytes")
        blobs = await self._read(conn, msg, sizes)
        if msg.batch is not None:
            if msg.batch in conn.info.batches:
                return Ack(rid=msg.rid, accepted=0, duplicate=True)
            conn.info.batches.append(msg.batch)  # now: a re-send arriving during the intake is a duplicate
        loop = asyncio.get_running_loop()
        accepted, rejections, lie = await loop.run_in_executor(
            None, self._intake, msg.groups, blobs, sizes, conn.worker_id, frozenset(conn.info.installed))
        if lie is not None:
            self.registry.quarantine(conn.worker_id, lie)
            return None
        self._count(conn, accepted, rejections)
        return Ack(rid=msg.rid, accepted=accepted, rejected=[e.reason for _, e in rejections])

    async def _read(self, conn: Conn, msg: Trajectories, sizes: tuple[int, ...]) -> list[memoryview | None]:
        """Each record's bytes, read and hashed on the loop in spans of at most READ_SPAN bytes (a span is one
        await: many small records are not one await each); a record larger than any admissible one
        (groups.record_limit) is read past and never held (None). ProtocolError unless the payload's SHA-256 is
        the header's."""
        hasher, limit = hashlib.sha256(), record_limit(self.max_len)
        blobs: list[memoryview | None] = []
        span: list[int] = []  # the sizes of the records read in one await, `pending` bytes in all
        pending = 0

        async def flush() -> None:
            nonlocal pending
            data = memoryview(await conn.channel.read_payload(pending)) if pending else memoryview(b"")
            hasher.update(data)
            at = 0
            for n in span:
                blobs.append(data[at:at + n])
                at += n
            span.clear()
            pending = 0

        for size in sizes:
            if size > limit:
                await flush()
                await conn.channel.skip_payload(size, hasher)
                blobs.append(None)
                continue
            if span and pending + size > READ_SPAN:
                await flush()
            span.append(size)
            pending += size
        await flush()
        if msg.sha256 != (hasher.hexdigest() if sum(sizes) else ""):
            raise ProtocolError("trajectories: the payload does not match the SHA-256 in its sealed header")
        return blobs

    def _intake(self, groups: tuple[int, ...], blobs: list[memoryview | None], sizes: tuple[int, ...], worker_id: str,
                installed: frozenset[int]) -> tuple[int, list[tuple[int, TrajectoryRejected]], str | None]:
        """Decode and validate every group, then buffer them (on an executor thread: it touches only the
        buffer). Every record is attributed to `worker_id`, the authenticated sender: a record that names no
        worker would otherwise escape the per-worker cap, the audit's quarantine and revocation. Returns the
        records accepted, per rejected group its size and why, and the lie that quarantines the sender (a record
        naming another worker, or a version it never reported installed, of the `installed` ones): then nothing
        is buffered."""
        decoded: list[list[Trajectory] | TrajectoryRejected] = []
        records = iter(zip(blobs, sizes))
        for n in groups:  # one group at a time: a rejected group's objects are freed before the next is built
            time.sleep(0)  # let the event loop's thread take the interpreter lock between groups (it waits 5 ms else)
            if n == 0:  # nothing to decode or buffer, but refused and counted like any bad group (MAX_BATCH a push)
                decoded.append(TrajectoryRejected("empty_group", "<group>", 0, "a group holds records"))
                continue
            group = list(itertools.islice(records, n))  # taken whole: a bad record must not shift the next group
            try:
                maps = [self._decode(b, size) for b, size in group]
                for m in maps:  # a long document's whole text beside truncated ids: its end kept (as the worker does)
                    m["prompt"] = cut_prompt(m["prompt"], text_limit(self.max_len))
                lie = _lie(maps, worker_id, installed)  # before validation: a lie beside a bad value is a lie
                if lie is not None:
                    return 0, [], lie
                decoded.append([Trajectory.from_wire(m) for m in maps])
            except TrajectoryRejected as e:
                decoded.append(_bare(e))
            except Exception as e:  # noqa: BLE001 - whatever a peer's values make the checks raise, a group's fate
                decoded.append(TrajectoryRejected("schema", "record", type(e).__name__, str(e)[:200]))
        accepted, rejections = 0, []
        for n, records in zip(groups, decoded):
            try:
                if isinstance(records, TrajectoryRejected):
                    raise records
                records = [_attributed(t, worker_id) for t in records]
                self.buffer.add_group(records, vocab_size=self.vocab_size, max_len=self.max_len)
                if self.handout is not None:
                    self._teach(worker_id, records)
                accepted += len(records)
            except TrajectoryRejected as e:
                rejections.append((n, e))
        return accepted, rejections, None

    def _teach(self, worker_id: str, records: list[Trajectory]) -> None:
        """The prompt filter learns an admitted group's outcome; a failure there costs the filter one outcome, never
        the rest of the push (its groups already buffered stay counted)."""
        try:
            self.handout.outcome(worker_id, records)
        except Exception:
            log.exception("prompt filter: the outcome of group %s was not counted", shown(records[0].meta.group_id, 60))

    def _decode(self, blob: memoryview | None, size: int) -> dict:
        if blob is None:  # over the limit: read past, never held
            raise TrajectoryRejected("too_long", "record", f"{size} bytes", f"more than any record of max_len = "
                                     f"{self.max_len} tokens takes ({record_limit(self.max_len)})")
        return decode_record(blob, max_len=self.max_len)

    def _count(self, conn: Conn, accepted: int, rejections: list[tuple[int, TrajectoryRejected]]) -> None:
        """Count a push's outcome by reason (records; an empty group in empty_groups), and log its first rejections
        one by one (the rest in one line)."""
        conn.info.trajectories += accepted
        for n, e in rejections:
            if n == 0:
                self.empty_groups += 1
                continue
            self.rejected[e.reason] += n
            conn.info.rejected += n
        for n, e in rejections[:LOGGED_REJECTIONS]:
            log.log(_level({e.reason}), "worker %s: %s (group of %d dropped)", conn.worker_id, e, n)
        if len(rejections) > LOGGED_REJECTIONS:
            more = Counter(e.reason for _, e in rejections[LOGGED_REJECTIONS:])
            log.log(_level(set(more)), "worker %s: %d more group(s) of the same push rejected: %s", conn.worker_id,
                    len(rejections) - LOGGED_REJECTIONS, dict(more))


def _level(reasons: set[str]) -> int:
    """INFO when every reason is routine (ROUTINE), else WARNING: what a user must look at reaches the console."""
    return logging.INFO if reasons <= ROUTINE else logging.WARNING


def _lie(records: list[dict], worker_id: str, installed: frozenset[int]) -> str | None:
    """Why the push is a lie (core/audit.py: the sender is quarantined), or None: a decoded record (its wire map,
    before validation) names another worker, or claims a version (other than the initial 0) the sender never
    reported installed."""
    for rec in records:
        who, v = rec["meta"].get("worker"), rec.get("version")
        if isinstance(who, str) and who and who != worker_id:
            return f"a record names worker {shown(who, 60)}"
        if type(v) is int and v > 0 and v not in installed:
            return f"a record claims version {v}, which it never reported installed"
    return None


def _bare(e: TrajectoryRejected) -> TrajectoryRejected:
    """`e` without its traceback and context: kept until the ack, it must not keep the frames (and the decoded
    record they hold) alive."""
    e.__context__ = e.__cause__ = None
    return e.with_traceback(None)


def _attributed(t: Trajectory, worker_id: str) -> Trajectory:
    """`t` with meta.worker = `worker_id`, the connection's authenticated id."""
    if t.meta.worker == worker_id:
        return t
    return t.model_copy(update={"meta": t.meta.model_copy(update={"worker": worker_id})})

