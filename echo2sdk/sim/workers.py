"""What the simulator knows of each pool worker while it runs: its state, installed version and counters."""

from __future__ import annotations

from dataclasses import dataclass

from echo2sdk.sim.inputs import SimWorker

__all__ = ["WorkerState"]


@dataclass
class WorkerState:
    spec: SimWorker
    state: str = "off"  # off | booting | active | released | dead
    installed: int = 0
    busy: bool = False
    epoch: int = 0  # invalidates scheduled events when the worker is released, dies or reboots
    rate_factor: float = 1.0
    link_factor: float = 1.0
    paused_for: int | None = None  # waiting for this version's install (pause semantics)
    delivered: int = 0  # admitted rollouts, reported in heartbeats
    billed_since: float | None = None
    install_token: int = 0
    generated: int = 0  # rollouts generated (admitted or not)
    busy_s: float = 0.0  # seconds spent generating; with `generated`, sent in heartbeats
    up_token: int = 0  # invalidates a scheduled preemption when the worker stops being active
