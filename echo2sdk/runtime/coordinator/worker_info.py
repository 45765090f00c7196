"""What the coordinator knows of one worker: `WorkerInfo`, its record in the registry (registry.py) and the
row of the run's worker table; its connection (connection.py) updates it as the worker reports."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["WorkerInfo"]


@dataclass
class WorkerInfo:
    worker_id: str
    address: str
    price_per_hour: float = 0.0
    backend: str = ""
    version: int = 0
    joined_at: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    trajectories: int = 0
    rejected: int = 0
    rollouts_per_s: float = 0.0
    alive: bool = True
    active: bool = True  # handed tasks; False: registered and idle (Coordinator.set_active)
    relay_addr: tuple[str, int] | None = None  # where this worker serves snapshot chunks to its children
    relay_fingerprint: bytes = field(default=b"", repr=False)  # its relay's TLS certificate (SHA-256)
    relay_reachable: bool | None = None  # its relay port answered the coordinator's probe at join (None: no relay)
    session: str = ""  # the worker process's random id: a re-join from it keeps worker_id and record
    credential: str = ""  # the name of the worker credential it logged in with ("": the run token)
    rejoins: int = 0
    batches: deque[str] = field(default_factory=lambda: deque(maxlen=64), repr=False)  # recent pushes' ids
    installed: set[int] = field(default_factory=set, repr=False)  # published versions it reported installed (audit)
    adapter_failures: dict[str, int] = field(default_factory=dict)  # rollouts its adapter failed, by reason
    groups_dropped: int = 0  # groups it did not send: a member's rollout failed, or the push's layout could not hold it
