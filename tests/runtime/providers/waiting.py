"""A bounded wait the provider tests share."""

from __future__ import annotations

import time


def eventually(cond, timeout: float = 10.0, what: str = "") -> None:
    """Return once `cond()` holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")
