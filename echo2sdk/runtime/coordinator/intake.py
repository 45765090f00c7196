"""Trajectory intake: the groups of records a worker pushes, admitted once per batch id, validated and buffered
on a thread of the loop's executor (a large push delays no other worker's messages), every record attributed
to its authenticated sender, and a push whose records lie about their sender or version quarantines it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.core.records import Trajectory, prompt_chars, text_limit
from echo2sdk.errors import TrajectoryRejected
from echo2sdk.runtime.protocol.messages import Ack, Trajectories, shown

if TYPE_CHECKING:
    from echo2sdk.runtime.coordinator.connection import Conn
    from echo2sdk.runtime.coordinator.registry import Registry

__all__ = ["Intake", "LOGGED_REJECTIONS"]

log = logging.getLogger("echo2sdk.coordinator")

LOGGED_REJECTIONS = 8  # rejected groups of one push logged one by one; the rest in one summary line


class Intake:
    """Admits pushed groups into `buffer` (records checked against `vocab_size` and `max_len`); `rejected`
    counts the rejected records by reason; a lying worker is quarantined in `registry`."""

    def __init__(self, buffer: StalenessBuffer, registry: Registry, *, vocab_size: int, max_len: int):
        self.buffer, self.registry = buffer, registry
        self.vocab_size, self.max_len = vocab_size, max_len
        self.rejected: Counter[str] = Counter()

    async def admit(self, conn: Conn, msg: Trajectories) -> Ack:
        """Admit a push of groups once per batch id: a re-sent push is acknowledged, not re-admitted. The
        records are validated and buffered on an executor thread (the buffer takes its own lock), then
        counted here, on the loop: a push of a thousand groups holds up no other worker's messages."""
        if msg.batch is not None:
            if msg.batch in conn.info.batches:
                return Ack(rid=msg.rid, accepted=0, duplicate=True)
            conn.info.batches.append(msg.batch)  # now: a re-send arriving during the intake is a duplicate
        loop = asyncio.get_running_loop()
        accepted, rejections = await loop.run_in_executor(None, self._intake, msg.groups, conn.worker_id)
        self._count(conn, accepted, rejections)
        return Ack(rid=msg.rid, accepted=accepted, rejected=[e.reason for _, e in rejections])

    def _intake(self, groups: tuple[Any, ...], worker_id: str) -> tuple[int, list[tuple[int, TrajectoryRejected]]]:
        """Validate and buffer each group of raw records (on an executor thread: it touches only the buffer).
        Every record is attributed to `worker_id`, the authenticated sender: a record that names no worker would
        otherwise escape the per-worker cap, the audit's quarantine and revocation (one naming another worker
        never gets here: claims_lie). Returns the records accepted and, per rejected group, its size and why."""
        accepted, rejections = 0, []
        for group in groups:
            try:
                if not isinstance(group, (list, tuple)):
                    raise TrajectoryRejected("schema", "groups[]", type(group).__name__, "a group is a list")
                records = [_bounded_prompt(_attributed(Trajectory.from_wire(obj), worker_id), self.max_len)
                           for obj in group]
                self.buffer.add_group(records, vocab_size=self.vocab_size, max_len=self.max_len)
                accepted += len(records)
            except TrajectoryRejected as e:
                rejections.append((len(group) if isinstance(group, (list, tuple)) else 1, e))
        return accepted, rejections

    def _count(self, conn: Conn, accepted: int, rejections: list[tuple[int, TrajectoryRejected]]) -> None:
        """Count a push's outcome by reason, and log its first rejections one by one (the rest in one line)."""
        conn.info.trajectories += accepted
        for n, e in rejections:
            self.rejected[e.reason] += n
            conn.info.rejected += n
        for n, e in rejections[:LOGGED_REJECTIONS]:
            log.warning("worker %s: %s (group of %d dropped)", conn.worker_id, e, n)
        if len(rejections) > LOGGED_REJECTIONS:
            more = Counter(e.reason for _, e in rejections[LOGGED_REJECTIONS:])
            log.warning("worker %s: %d more group(s) of the same push rejected: %s", conn.worker_id,
                        len(rejections) - LOGGED_REJECTIONS, dict(more))

    # -- worker audit (core/audit.py) ---------------------------------------------------------------------
    def claims_lie(self, conn: Conn, groups: tuple[Any, ...]) -> bool:
        """True, with the worker quarantined, when a pushed record names another worker or claims a version
        (other than the initial 0) this worker never reported installed. Malformed records are left to intake."""
        installed = conn.info.installed
        for obj in (o for g in groups if isinstance(g, (list, tuple)) for o in g if isinstance(o, dict)):
            meta, v = obj.get("meta"), obj.get("version")
            who = meta.get("worker") if isinstance(meta, dict) else None
            if isinstance(who, str) and who != conn.worker_id:
                reason = f"a record names worker {shown(who, 60)}"
            elif type(v) is int and v > 0 and v not in installed:
                reason = f"a record claims version {v}, which it never reported installed"
            else:
                continue
            self.registry.quarantine(conn.worker_id, reason)
            return True
        return False


def _attributed(t: Trajectory, worker_id: str) -> Trajectory:
    """`t` with meta.worker = `worker_id`, the connection's authenticated id."""
    if t.meta.worker == worker_id:
        return t
    return t.model_copy(update={"meta": t.meta.model_copy(update={"worker": worker_id})})


def _bounded_prompt(t: Trajectory, max_len: int) -> Trajectory:
    """`t` with its prompt text cut to the text bound (records.text_limit: 64 characters a token of max_len, the
    end kept): a worker keeps a long document's whole text while its prompt_ids were truncated to fit max_len,
    and the learner trains on the ids. A response over the bound is still refused (its text is what its ids
    decode to), and so is a chat prompt with more messages than max_len."""
    limit = text_limit(max_len)
    if prompt_chars(t.prompt) <= limit:
        return t
    if isinstance(t.prompt, str):
        return t.model_copy(update={"prompt": t.prompt[-limit:]})
    kept, room = [], limit
    for m in reversed(t.prompt):  # the newest messages, whole, then the end of the one that does not fit
        if room <= 0:
            break
        kept.append(m if len(m.content) <= room else m.model_copy(update={"content": m.content[-room:]}))
        room -= len(kept[-1].content)
    return t.model_copy(update={"prompt": tuple(reversed(kept))})
