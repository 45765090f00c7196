"""Snapshot delivery: how a published snapshot reaches the workers.

One interface, so the transport can change without touching the coordinator or the learner. `DirectPush`
is the plain learner -> worker push (a star). The peer-assisted chain broadcast implements the same
Protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from echo2sdk.runtime.protocol.messages import BroadcastInfo, Received, Snapshot, WireMessage
from echo2sdk.runtime.protocol.wire import digest

__all__ = ["Peer", "SnapshotDelivery", "SnapshotMeta", "DirectPush", "check_delivery", "send_all", "snapshot_frame_ok"]


@dataclass(frozen=True)
class SnapshotMeta:
    """What a publication's payload is, for the signed manifest (core/broadcast/manifest.py): a full snapshot
    (`root`: its BLAKE3 root, b"" when not computed) or a delta (core/delta.py) against `base_version`."""

    kind: str = "full"
    base_version: int = 0
    base_root: bytes = b""
    root: bytes = b""

    def fields(self) -> dict:
        return {"kind": self.kind, "base_version": self.base_version, "base_root": self.base_root, "root": self.root}


class Peer(Protocol):
    """What delivery may use of a connected worker."""

    @property
    def worker_id(self) -> str: ...

    @property
    def relay_addr(self) -> tuple[str, int] | None:
        """Where the worker serves snapshot chunks to its children; None when it serves none."""
        ...

    @property
    def relay_fingerprint(self) -> bytes:
        """The SHA-256 of its relay port's TLS certificate (b"": plaintext), which its children pin."""
        ...

    async def send(self, msg: WireMessage, payload: bytes | memoryview = b"") -> None:
        """Send `msg` (and its payload). Raises ConnectionError (or OSError) when the worker is gone, or was
        dropped for taking nothing within its write deadline."""
        ...


class SnapshotDelivery(Protocol):
    async def deliver(self, version: int, weights: bytes, peers: Sequence[Peer]) -> None:
        """Start sending `weights` (safetensors bytes of snapshot `version`) to `peers`.
        Workers acknowledge with an `installed` message once the snapshot is live. A delivery that carries
        delta snapshots (broadcast.delta: the chain broadcast) also takes `meta` (SnapshotMeta), naming what
        `weights` is."""
        ...

    def welcome_info(self) -> BroadcastInfo | None:
        """What a joining worker must know about this delivery (sent in its welcome); None: nothing."""
        ...

    def on_report(self, worker_id: str, report: Received) -> None:
        """A worker's `received` report of how its fetch of a snapshot went."""
        ...

    def close(self) -> None:
        """Release what the delivery holds (servers, sockets); called once, when the coordinator stops."""
        ...


def check_delivery(obj: object) -> SnapshotDelivery:
    """`obj` if it implements every SnapshotDelivery method, else a TypeError naming the missing ones."""
    missing = [m for m in ("deliver", "welcome_info", "on_report", "close") if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"{type(obj).__name__} is not a SnapshotDelivery: it lacks {', '.join(missing)}")
    return obj  # type: ignore[return-value]


async def send_all(peers: Sequence[Peer], msg: WireMessage, payload: bytes | memoryview = b"") -> None:
    """Send to every peer at once: a slow or stalled one (dropped at its write deadline) delays no other."""

    async def one(peer: Peer) -> None:
        try:
            await peer.send(msg, payload)
        except (ConnectionError, OSError):
            pass  # a dead or dropped worker is the coordinator's business, not delivery's

    await asyncio.gather(*(one(p) for p in peers))


class DirectPush:
    """Learner pushes the full snapshot to every worker over its own connection, to all at once. The snapshot's
    SHA-256 is computed once per version, off the event loop (late joiners get the newest version again)."""

    def __init__(self) -> None:
        self._sha: tuple[int, bytes, str] | None = None  # (version, its weights, their SHA-256)

    async def deliver(self, version: int, weights: bytes, peers: Sequence[Peer]) -> None:
        if self._sha is None or self._sha[0] != version or self._sha[1] is not weights:
            self._sha = (version, weights, await asyncio.to_thread(digest, weights))
        await send_all(peers, Snapshot(version=version, nbytes=len(weights), sha256=self._sha[2]), weights)

    def welcome_info(self) -> None:
        return None

    def on_report(self, worker_id: str, report: Received) -> None:
        pass  # workers report chain-broadcast fetches only

    def close(self) -> None:
        pass


def snapshot_frame_ok(msg: Snapshot, payload: bytes) -> str | None:
    """Return why a received snapshot must not be installed, or None when it is intact."""
    if len(payload) != msg.nbytes:
        return f"snapshot size {len(payload)} != announced {msg.nbytes}"
    if digest(payload) != msg.sha256:
        return "snapshot sha256 mismatch"
    return None
