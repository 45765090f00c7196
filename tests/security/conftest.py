"""Shared fixtures of the security tests (helpers live in _peers.py)."""

from __future__ import annotations

import pytest
from _peers import LoopThread


@pytest.fixture
def loop():
    """An asyncio loop on a thread of its own, closed after the test."""
    lt = LoopThread()
    yield lt
    lt.close()
