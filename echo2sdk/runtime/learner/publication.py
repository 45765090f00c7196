"""The one owner of the learner version v_t and of publishing it (paper Algorithm 1: v_t advances with every
update, a snapshot goes out every kappa updates).

Every path that publishes (the step loop, a resumed run's first publication, the warm-up's timed publication)
goes through `Publication`: the version is written to the run's high-water mark (published.json) before it
leaves the learner, the weights are copied at once on the learner's thread and serialized and sent on the
publisher thread or inline, and the version is listed so that T_bcast of every publication can be read back.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol

from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.learner import checkpoint

__all__ = ["Publication", "Publisher", "Snapshots"]

log = logging.getLogger("echo2sdk.trainer")


class Publisher(Protocol):
    """Where snapshots go (the Coordinator): `publish(version, data)` and `t_bcast(version)` -> (T_bcast at the
    quantile q, at all workers), None while unknown."""

    def publish(self, version: int, data: bytes) -> Any: ...

    def t_bcast(self, version: int) -> tuple[float | None, float | None]: ...


class Snapshots(Protocol):
    """The learner's weights as a publishable state (distributed.Lockstep: a collective under torchrun)."""

    def snapshot_state(self, dtype: str) -> dict[str, Any]: ...


class Publication:
    """v_t and the published versions. `advance` moves v_t (and the buffer's admission window) by one update;
    `publish_if_due` publishes every kappa updates off the learner's thread; `publish_now` publishes at once."""

    def __init__(self, to: Publisher, buffer: StalenessBuffer, weights: Snapshots, out: Path, *, kappa: int,
                 dtype: str):
        self.to, self.buffer, self.weights, self.out = to, buffer, weights, out
        self.kappa, self.dtype = kappa, dtype
        self.version = 0  # v_t
        self.published: list[int] = []  # versions published, oldest first

    def start_at(self, version: int) -> None:
        """A resumed run's v_t (above everything ever published: checkpoint.resume_version)."""
        self.version = version
        self.buffer.set_version(version)

    def advance(self) -> int:
        """One update done: v_t += 1; records older than v_t - S are no longer admitted. Returns v_t."""
        self.version += 1
        self.buffer.set_version(self.version)
        return self.version

    def publish_if_due(self, publisher: Executor) -> tuple[float, dict[str, Any] | None]:
        """Every kappa updates: copy the weights now, serialize and send them on the `publisher` thread. Returns
        the learner's share of the publication (t_publish_s; 0.0 between publications) and the published state
        (None between publications)."""
        if self.version % self.kappa:
            return 0.0, None
        t0 = time.perf_counter()
        state = self.weights.snapshot_state(self.dtype)  # copy now; serialize off-thread
        checkpoint.record_published(self.out, self.version)  # before the version leaves the learner
        publisher.submit(self._send, self.version, state)
        self.published.append(self.version)
        return time.perf_counter() - t0, state

    def publish_now(self) -> dict[str, Any]:
        """Publish the current weights as v_t on this thread (a resumed run's first snapshot, the warm-up's timed
        one). Returns the published state."""
        checkpoint.record_published(self.out, self.version)
        state = self.weights.snapshot_state(self.dtype)
        self._send(self.version, state)
        self.published.append(self.version)
        return state

    def _send(self, version: int, state: dict) -> None:
        """Serialize and hand to the coordinator (on the publisher thread: the state is already a private, cast
        copy). A failed publication is logged, not lost in a Future."""
        from echo2sdk.core.snapshot import serialize_state

        try:
            self.to.publish(version, serialize_state(state))
        except Exception:  # noqa: BLE001 - a failed publication must be visible, not lost in a Future
            log.exception("publishing snapshot v%d failed; workers keep their current version", version)

    def last_bcast(self) -> tuple[float | None, float | None]:
        """T_bcast (quantile, all workers) of the newest publication that has one."""
        for v in reversed(self.published):
            t_q, t_all = self.to.t_bcast(v)
            if t_q is not None:
                return t_q, t_all
        return None, None

    def bcast_table(self) -> list[dict[str, Any]]:
        """T_bcast of every publication, as the run's end logs it."""
        return [{"version": v, "t_bcast_s": q, "t_bcast_all_s": a} for v in self.published for q, a in [self.to.t_bcast(v)]]
