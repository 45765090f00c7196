"""The one place numbers from users, config files and peers are checked.

``real`` and ``integer`` reject bools (``True`` is an ``int`` in Python), NaN and infinities, and values
outside the bounds, with an error that names the field and the value:
``T_train must be > 0, got T_train=-1``. The error class is the caller's (``ConfigError`` for
configuration, ``CapacityError`` for the capacity rule, ``BackendError`` for a backend's arguments).
"""

from __future__ import annotations

import math

from echo2sdk.errors import ConfigError

__all__ = ["real", "integer", "is_real", "shown", "nice", "IDLE"]

IDLE = "idle"  # a niceness: the worker runs under SCHED_IDLE (runtime/worker/priority.py)


def is_real(value: object) -> bool:
    """True for a finite int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(lo: float | None, hi: float | None, *, open_lo: bool, kind: str) -> str:
    if lo is not None and hi is not None:
        return f"{kind} in {'(' if open_lo else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f"{kind} {'>' if open_lo else '>='} {lo:g}"
    if hi is not None:
        return f"{kind} <= {hi:g}"
    return kind


def real(
    name: str,
    value: object,
    *,
    lo: float | None = None,
    hi: float | None = None,
    open_lo: bool = False,
    error: type[Exception] = ConfigError,
) -> float:
    """`value` as a finite float with lo <= value <= hi (lo < value with ``open_lo``); `error` otherwise.

    ``real("T_train", t, lo=0, open_lo=True)`` is "a finite number > 0"."""
    if not is_real(value):
        raise error(f"{name} must be a finite number, got {name}={value!r}")
    x = float(value)  # type: ignore[arg-type]
    if (lo is not None and (x < lo or (open_lo and x == lo))) or (hi is not None and x > hi):
        raise error(f"{name} must be {_bounds(lo, hi, open_lo=open_lo, kind='a number')}, got {name}={value!r}".replace(
            "a number >", ">").replace("a number <", "<"))
    return x


def integer(
    name: str,
    value: object,
    *,
    lo: int | None = None,
    hi: int | None = None,
    error: type[Exception] = ConfigError,
) -> int:
    """`value` as an int (not a bool) with lo <= value <= hi; `error` naming the field otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo) or (
        hi is not None and value > hi
    ):
        raise error(f"{name} must be {_bounds(lo, hi, open_lo=False, kind='an integer')}, got {name}={value!r}")
    return value


def shown(value: object, limit: int = 80) -> str:
    """`repr(value)`, cut to `limit` characters: how a peer- or plug-in-supplied value appears in logs and errors."""
    try:
        text = repr(value)
    except RecursionError:  # a value nested deeper than repr goes (a peer's msgpack can nest a thousand levels)
        text = f"<{type(value).__name__} nested too deep to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def nice(value: object) -> int | str:
    """A CPU niceness as rollout.nice and `echo2 worker --nice` take it: "idle" (any case) or a whole number 0-19
    (an int or its digits); ValueError naming the value otherwise (a bool, 1.5, 20, "low")."""
    if isinstance(value, str) and value.strip().lower() == IDLE:
        return IDLE
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        n = int(value)
    if n is None or not 0 <= n <= 19:
        raise ValueError(f"nice must be 'idle' or an integer 0-19, got {value!r}")
    return n
