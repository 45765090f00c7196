"""The one owner of the learner version v_t and of publishing it (paper Algorithm 1: v_t advances with every
update, a snapshot goes out every kappa updates).

Every path that publishes (the step loop, a resumed run's first publication, the warm-up's timed publication)
goes through `Publication`: the version is written to the run's high-water mark (published.json) before it
leaves the learner, the weights are copied at once on the learner's thread and serialized and sent on the
publisher thread or inline, and the version is listed so that T_bcast of every publication can be read back.

With delta snapshots (`anchor_every` not None: broadcast.delta), the publisher thread also encodes each snapshot
against the previous publication (core/delta.py) and hands the coordinator both (it sends the delta to the workers
that hold the base); a full anchor goes out first, every anchor_every publications and when a delta is no smaller.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from echo2sdk.core import delta
from echo2sdk.core.buffer import StalenessBuffer
from echo2sdk.runtime.learner import checkpoint

__all__ = ["Publication", "Publisher", "WeightSource", "BcastTimes"]

log = logging.getLogger("echo2sdk.learner")


class Publisher(Protocol):
    """Where snapshots go (the Coordinator): `publish(version, data)` and `t_bcast(version, event)` -> (T_bcast at
    the quantile q, at all workers) of the workers' "installed" or "received" events, None while unknown."""

    def publish(self, version: int, data: bytes, **deltas: Any) -> Any: ...

    def t_bcast(self, version: int, event: str = "installed") -> tuple[float | None, float | None]: ...


class BcastTimes(NamedTuple):
    """T_bcast of one publication, in seconds since it was published (None while unknown): installed on the quantile
    q = 1/gamma of the workers (`installed`, the paper's T_bcast) and on all of them (`installed_all`), and the same
    quantile's complete, verified copies (`received`: the rest of T_bcast is the workers finishing the batch they
    were generating)."""

    installed: float | None = None
    installed_all: float | None = None
    received: float | None = None

    def columns(self) -> dict[str, float | None]:
        """As metrics.jsonl and the run's t_bcast table name them."""
        return {"t_bcast_s": self.installed, "t_bcast_all_s": self.installed_all, "t_bcast_received_s": self.received}


class WeightSource(Protocol):
    """The learner's weights as a publishable state (distributed.Lockstep: a collective under torchrun)."""

    def snapshot_state(self, dtype: str) -> dict[str, Any]: ...


class Publication:
    """v_t and the published versions. `advance` moves v_t (and the buffer's admission window) by one update;
    `publish_if_due` publishes every kappa updates off the learner's thread; `publish_now` publishes at once."""

    def __init__(self, to: Publisher, buffer: StalenessBuffer, weights: WeightSource, out: Path, *, kappa: int,
                 dtype: str, anchor_every: int | None = None):
        self.to, self.buffer, self.weights, self.out = to, buffer, weights, out
        self.kappa, self.dtype = kappa, dtype
        self.version = 0  # v_t
        self.published: list[int] = []  # versions published, oldest first
        self.t_publish_s = 0.0  # the learner's share of the last publish_if_due (0.0 between publications)
        self._previous: tuple[int, bytes, bytes] | None = None  # (version, bytes, root) of the last publication
        self._anchors = delta.Anchors(anchor_every) if anchor_every is not None else None  # None: deltas off
        # with deltas: per publication {version, kind, bytes (sent over the delivery), full_bytes, encode_s}
        self.sent: list[dict[str, Any]] = []

    def start_at(self, version: int) -> None:
        """A resumed run's v_t (above everything ever published: checkpoint.resume_version)."""
        self.version = version
        self.buffer.set_version(version)

    def advance(self) -> int:
        """One update done: v_t += 1; records older than v_t - S are no longer admitted. Returns v_t."""
        self.version += 1
        self.buffer.set_version(self.version)
        return self.version

    def publish_if_due(self, publisher: Executor) -> dict[str, Any] | None:
        """Every kappa updates: copy the weights now, serialize and send them on the `publisher` thread. Returns the
        published state (None between publications); the learner's share of the publication is `t_publish_s`."""
        self.t_publish_s = 0.0
        if self.version % self.kappa:
            return None
        t0 = time.perf_counter()
        state = self.weights.snapshot_state(self.dtype)  # copy now; serialize off-thread
        checkpoint.record_published(self.out, self.version)  # before the version leaves the learner
        publisher.submit(self._send, self.version, state)
        self.published.append(self.version)
        self.t_publish_s = time.perf_counter() - t0
        return state

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
            data = serialize_state(state)
            if self._anchors is None:
                self.to.publish(version, data)
            else:
                self._publish_with_deltas(version, data)
        except Exception:  # noqa: BLE001 - a failed publication must be visible, not lost in a Future
            log.exception("publishing snapshot v%d failed; workers keep their current version", version)

    def _publish_with_deltas(self, version: int, data: bytes) -> None:
        """Encode `data` against the previous publication (timed: it runs here, off the training path), decide full
        or delta (core.delta.plan_publication) and hand the coordinator the snapshot, its root and the delta."""
        assert self._anchors is not None
        t0 = time.perf_counter()
        root = delta.snapshot_root(data)
        prev, d = self._previous, None
        if prev is not None and len(prev[1]) == len(data):
            d = delta.encode(prev[1], data, base_root=prev[2], root=root)
        kind = self._anchors.next(prev is not None, len(d.payload) if d is not None else None, len(data))
        encode_s = time.perf_counter() - t0
        self._previous = (version, data, root)
        sent = len(d.payload) if kind == "delta" and d is not None else len(data)
        self.sent.append({"version": version, "kind": kind, "bytes": sent, "full_bytes": len(data),
                          "changed_fraction": round(d.changed_fraction, 6) if d is not None else None,
                          "encode_s": round(encode_s, 3)})
        if kind == "delta":  # plan_publication: only with a base (prev) and a delta (d)
            assert d is not None and prev is not None
            log.info("snapshot v%d: delta on v%d, %d bytes (%.2f%% of %d; %.2f%% of the words changed), encoded in "
                     "%.2f s", version, prev[0], sent, 100 * sent / len(data), len(data), 100 * d.changed_fraction,
                     encode_s)
            self.to.publish(version, data, root=root, delta=(d, prev[0]))
        else:
            self.to.publish(version, data, root=root)

    def delta_summary(self, coordinator_sent: dict[str, int]) -> dict[str, Any]:
        """summary.json's "deltas": publications by kind, the bytes sent over the delivery against the full
        snapshots', the encode time, and what the coordinator sent (full snapshots pushed to workers without a
        delta's base); each publication in `publications`."""
        deltas = [s for s in self.sent if s["kind"] == "delta"]
        return {
            "full": len(self.sent) - len(deltas), "delta": len(deltas),
            "bytes_sent": sum(s["bytes"] for s in self.sent), "bytes_full": sum(s["full_bytes"] for s in self.sent),
            "delta_over_full_mean": round(sum(s["bytes"] / s["full_bytes"] for s in deltas) / len(deltas), 5) if deltas else None,
            "encode_s_max": max((s["encode_s"] for s in self.sent), default=None),
            "coordinator": dict(coordinator_sent), "publications": list(self.sent),
        }

    def bcast_times(self, version: int) -> BcastTimes:
        """T_bcast of publication `version` (BcastTimes: None where the workers have not reported it yet)."""
        installed, installed_all = self.to.t_bcast(version)
        return BcastTimes(installed, installed_all, self.to.t_bcast(version, "received")[0])

    def last_bcast(self) -> BcastTimes:
        """bcast_times of the newest publication that has a T_bcast."""
        for v in reversed(self.published):
            if (times := self.bcast_times(v)).installed is not None:
                return times
        return BcastTimes()

    def metrics(self) -> dict[str, Any]:
        """The publication's columns of a metrics row: the learner's share of this update's publication (0.0 between
        publications) and T_bcast of the newest publication that has one (BcastTimes)."""
        return {"t_publish_s": round(self.t_publish_s, 4), **self.last_bcast().columns()}

    def bcast_table(self) -> list[dict[str, Any]]:
        """bcast_times of every publication, as the run's end logs it."""
        return [{"version": v, **self.bcast_times(v).columns()} for v in self.published]
