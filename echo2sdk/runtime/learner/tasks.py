"""The task stream the coordinator hands out, counted so that a resumed run skips what was handed out before."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator

__all__ = ["CountedTasks"]


class CountedTasks(Iterator):
    """`tasks` with the first `skip` items dropped; `issued` counts every item handed out, the skipped ones too."""

    def __init__(self, tasks: Iterable, skip: int = 0):
        self._it = iter(tasks)
        collections.deque(itertools.islice(self._it, skip), maxlen=0)
        self.issued = skip

    def __next__(self):
        item = next(self._it)
        self.issued += 1
        return item
