"""Snapshot delivery: how a published snapshot reaches the workers.

One interface, so the transport can change without touching the coordinator or the learner. `DirectPush`
is the plain learner -> worker push (a star). The peer-assisted chain broadcast implements the same
Protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from echo2sdk.runtime.wire import digest

__all__ = ["Peer", "SnapshotDelivery", "DirectPush", "snapshot_frame_ok"]


class Peer(Protocol):
    """What delivery may use of a connected worker."""

    worker_id: str

    async def send(self, header: dict, payload: bytes | memoryview = b"") -> None: ...


class SnapshotDelivery(Protocol):
    async def deliver(self, version: int, weights: bytes, peers: Sequence[Peer]) -> None:
        """Start sending `weights` (safetensors bytes of snapshot `version`) to `peers`.
        Workers acknowledge with an `installed` message once the snapshot is live."""
        ...


class DirectPush:
    """Learner pushes the full snapshot to every worker over its own connection."""

    async def deliver(self, version: int, weights: bytes, peers: Sequence[Peer]) -> None:
        header = {"type": "snapshot", "version": version, "nbytes": len(weights), "sha256": digest(weights)}
        for peer in peers:
            try:
                await peer.send(header, weights)
            except (ConnectionError, OSError):
                pass  # a dead worker is the coordinator's business, not delivery's


def snapshot_frame_ok(header: dict, payload: bytes) -> str | None:
    """Return why a received snapshot must not be installed, or None when it is intact."""
    if len(payload) != header.get("nbytes"):
        return f"snapshot size {len(payload)} != announced {header.get('nbytes')}"
    if digest(payload) != header.get("sha256"):
        return "snapshot sha256 mismatch"
    return None

