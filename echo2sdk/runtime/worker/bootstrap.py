"""A worker without a model (`echo2 worker --bootstrap`): the worker's side of runtime/broadcast/bootstrap.py.
It asks the coordinator for the model's base files (config, tokenizer: `GetBase`), takes the first snapshot
that arrives over the run's delivery (verified as any snapshot) as the weights, and writes both into a folder
under the cache directory, which the worker then serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.broadcast.bootstrap import write_base
from echo2sdk.runtime.broadcast.relay import Assembly
from echo2sdk.runtime.protocol.messages import BaseFiles, GetBase
from echo2sdk.runtime.worker.link import CoordinatorLink
from echo2sdk.runtime.worker.inbox import SnapshotInbox

__all__ = ["BOOTSTRAP_WAIT_S", "Bootstrap"]

log = logging.getLogger("echo2sdk.worker")

BOOTSTRAP_WAIT_S = 600.0  # the longest a bootstrapping worker waits for the base files, then for the weights


class Bootstrap:
    """The base files as the coordinator sent them (`base`, set by the worker's read loop) and the folder
    built from them and the first snapshot (`fetch`)."""

    def __init__(self, link: CoordinatorLink, inbox: SnapshotInbox, cache_dir: str | None):
        self.link, self.inbox, self.cache_dir = link, inbox, cache_dir
        self.base: tuple[BaseFiles, bytes] | None = None

    async def fetch(self) -> tuple[str, dict[str, int]]:
        """Ask for the base files, wait for them and the first snapshot, write both into a cache folder. Returns
        the folder and the base files refused (not written), by reason. The snapshot stays pending: a version
        above 0 is then installed as usual, which sets the backend's version."""
        from echo2sdk.weights import default_cache_dir

        inbox = self.inbox
        t0 = time.perf_counter()
        await self.link.send(GetBase())
        await self._wait_until(lambda: self.base is not None, "the base files")
        await self._wait_until(lambda: inbox.pending is not None, "the first snapshot")
        assert self.base is not None and inbox.pending is not None
        (msg, payload), (version, snap) = self.base, inbox.pending
        inbox.pending = None  # ours while it is written: a newer snapshot arriving meanwhile does not release it
        weights = snap.view if isinstance(snap, Assembly) else snap
        try:
            folder, refused = await asyncio.to_thread(write_base, self.cache_dir or default_cache_dir(), msg, payload,
                                                      weights)
        finally:
            if inbox.pending is None:
                inbox.pending = (version, snap)
            elif isinstance(snap, Assembly):
                inbox.relay.release(snap)  # type: ignore[union-attr]
        self.base = None
        log.info("bootstrapped from the coordinator in %.1f s: %d base file(s) (%d bytes, %d refused) and snapshot v%d "
                 "(%d bytes) in %s", time.perf_counter() - t0, len(msg.files), len(payload), sum(refused.values()),
                 version, len(weights), folder)
        return str(folder), dict(refused)

    async def _wait_until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + BOOTSTRAP_WAIT_S
        while not ready():
            if self.link.stop.is_set():
                raise ConnectionError(f"the coordinator connection closed while waiting for {what}")
            if time.monotonic() > deadline:
                raise ProtocolError(f"the coordinator sent no {what} within {BOOTSTRAP_WAIT_S:.0f} s")
            await asyncio.sleep(0.05)
