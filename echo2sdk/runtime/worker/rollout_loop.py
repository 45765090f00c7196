"""The worker's batch loop: install the pending snapshot, wait while the installed version is too stale to be
worth generating under, pull a batch of prompts, roll them out (a GRPO group per prompt, under the installed
version v-hat) and push the version-tagged groups. A batch whose push was cut off is held and pushed again,
under the same id, first thing after the re-join.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import zlib
from dataclasses import replace
from typing import Any, Protocol

from echo2sdk.core.contracts import SamplingParams, Task
from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.protocol.groups import MAX_PUSH_BYTES, split_pushes
from echo2sdk.runtime.protocol.messages import Ack, GetTasks, Tasks, Trajectories, WireTask, WorkerConfig, shown
from echo2sdk.runtime.worker.link import CoordinatorLink
from echo2sdk.runtime.worker.inbox import SnapshotInbox

__all__ = ["Producer", "RolloutLoop", "STALE_WAIT_S"]

log = logging.getLogger("echo2sdk.worker")

STALE_WAIT_S = 60.0  # the longest a worker waits for a snapshot it knows of before generating under its own


class Producer(Protocol):
    """What the loop drives (the worker): its installed version, its install step and its rollout step."""

    @property
    def version(self) -> int: ...

    async def install_pending(self) -> None: ...

    def rollout(self, tasks: list[Task], n: int, params: SamplingParams) -> list[list[dict[str, Any]]]: ...


class RolloutLoop:
    """Batches pulled, rolled out and pushed, counted across re-joins (`batch`, `done`, `rate`)."""

    def __init__(self, link: CoordinatorLink, inbox: SnapshotInbox, producer: Producer, *, session: str,
                 max_batches: int | None = None):
        self.link, self.inbox, self.producer = link, inbox, producer
        self.session, self.max_batches = session, max_batches
        self.batch = 0
        self.held: tuple[str, list[list[dict[str, Any]]]] | None = None  # a pushed batch the coordinator never acked
        self.done = 0  # rollouts generated
        self.max_len: int | None = None  # the learner's max_len (WorkerConfig): prompt texts are cut to its bound
        self.left_out: collections.Counter[str] = collections.Counter()  # groups not pushed, by reason (heartbeats)
        self.rate = 0.0  # rollouts per second, smoothed
        self._stale_since: float | None = None

    @property
    def finished(self) -> bool:
        """max_batches done."""
        return self.max_batches is not None and self.batch >= self.max_batches

    async def run(self, cfg: WorkerConfig, worker_id: str) -> None:
        """Until the session stops, a push fails or max_batches are done."""
        n, per_request = cfg.group_size, cfg.tasks_per_request
        self.max_len = cfg.max_len
        base = SamplingParams(**cfg.sampling.model_dump())
        seed0 = zlib.crc32(worker_id.encode()) << 20  # distinct, reproducible streams per worker
        while True:
            if self.link.stop.is_set():
                return
            if self.held is not None:
                held = self.held
                if not await self.push(*held):
                    return
                log.info("pushed batch %s (%d groups) held across the re-join", held[0], len(held[1]))
            if self.finished:
                return
            await self.producer.install_pending()
            if await self.too_stale(cfg.staleness):
                continue
            batch, self.batch = self.batch, self.batch + 1  # counts on across re-joins
            params = replace(base, seed=seed0 + batch) if base.seed is None else base
            try:
                reply = await self.link.request(GetTasks(n=per_request), Tasks)
            except (ConnectionError, TimeoutError, ProtocolError):
                return
            tasks = [_task(t) for t in reply.tasks]
            if not tasks:
                await asyncio.sleep(0.5)
                continue
            t0 = time.perf_counter()
            groups = await asyncio.to_thread(self.producer.rollout, tasks, n, params)
            dt = time.perf_counter() - t0
            self.done += sum(len(g) for g in groups)
            inst = sum(len(g) for g in groups) / max(dt, 1e-6)
            self.rate = inst if self.rate == 0 else 0.7 * self.rate + 0.3 * inst
            if not await self.push(f"{self.session}:{batch}", groups):
                return

    async def too_stale(self, staleness: int | None) -> bool:
        """True (after a short wait) while a snapshot more than S versions ahead of the installed one is on
        its way: records generated now would be older than v_t - S on arrival and rejected (a late joiner,
        or a worker back from a freeze). Gives up waiting after STALE_WAIT_S, in case no snapshot comes."""
        version, newest = self.producer.version, self.inbox.newest
        if staleness is None or newest - version <= staleness:
            self._stale_since = None
            return False
        now = time.monotonic()
        if self._stale_since is None:
            self._stale_since = now
            log.info("v%d installed, v%d published: waiting for it before generating", version, newest)
        if now - self._stale_since > STALE_WAIT_S:
            return False
        await asyncio.sleep(0.2)
        return True

    async def push(self, batch_id: str, groups: list[list[dict[str, Any]]]) -> bool:
        """Push one batch's groups (in several pushes when their records are over groups.MAX_PUSH_BYTES, each under
        its own id). When the connection is lost on the way they are held and pushed again after the re-join
        under the same ids: the coordinator admits a batch once (staleness is judged then, as for any record),
        so nothing generated is lost and nothing is counted twice."""
        pushes, dropped = await asyncio.to_thread(split_pushes, groups, MAX_PUSH_BYTES, self.max_len)
        if dropped:
            log.warning("batch %s: group(s) left out of the push: %s (over_push_limit: one group's records are over "
                        "the %d-byte limit)", batch_id, dropped, MAX_PUSH_BYTES)
        for i, p in enumerate(pushes):
            part = batch_id if len(pushes) == 1 else f"{batch_id}/{i}"
            try:
                ack = await self.link.request(Trajectories.of(p, batch=part), Ack, payload=p.payload)
            except (ConnectionError, TimeoutError, ProtocolError):
                self.held = (batch_id, groups)
                return False
            if ack.duplicate:
                log.info("batch %s had reached the coordinator before the connection was lost", part)
            if ack.rejected:
                log.warning("coordinator rejected %d group(s): %s", len(ack.rejected), shown(list(ack.rejected), 200))
        self.held = None
        self.left_out.update(dropped)  # once the batch is through: a held batch is split (and drops) again
        return True


def _task(t: WireTask) -> Task:
    return Task(id=t.id, messages=t.messages, answer=t.answer, info=t.info)
