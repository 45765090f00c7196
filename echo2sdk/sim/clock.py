"""The simulator's virtual clock and its queue of pending events."""

from __future__ import annotations

import heapq
from typing import Any

__all__ = ["EventQueue"]


class EventQueue:
    """Events (time, kind, data) popped in time order, ties in the order they were pushed; `now` is the time
    of the last one popped."""

    def __init__(self) -> None:
        self.now = 0.0
        self._q: list[tuple[float, int, str, tuple]] = []
        self._seq = 0

    def push(self, t: float, kind: str, *data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._q, (t, self._seq, kind, data))

    def pop(self) -> tuple[str, tuple]:
        """The next event's (kind, data); advances `now` to its time."""
        t, _, kind, data = heapq.heappop(self._q)
        self.now = t
        return kind, data

    def __bool__(self) -> bool:
        return bool(self._q)
