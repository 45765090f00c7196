"""Who may start a handshake: connection caps, eviction of idle handshakes, and a failed-login rate limit.

Every server that authenticates peers (the coordinator, each relay port) asks `Admission.open(ip, drop)`
when a connection arrives, before it reads or sends a byte:

- a source IP whose failed logins ran out of budget (a token bucket: `fail_burst` at once, then
  `fail_per_s`) is closed at once, uncounted work: nothing is read, no challenge is made, no TLS handshake;
- at most `max_pending_per_ip` handshakes per IP and `max_pending` in all are in flight; when a cap is
  reached the *oldest* pending handshake (of that IP, else of any) is dropped to make room, so idle
  connections cannot keep a real peer out - holding the door needs a connection rate above one per
  handshake time, and then only for that attacker's own IP;
- at most `max_conns` connections in all (authenticated ones included): beyond that, new ones are closed.

Thread-safe: the coordinator calls it from its event loop, a relay from its gate and streaming threads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Admission", "Ticket"]

MAX_TRACKED_IPS = 65536  # failure buckets kept (oldest forgotten first)


@dataclass(eq=False)
class Ticket:
    """One admitted connection. `drop` closes it (called when it is evicted while still pending)."""

    ip: str
    drop: Callable[[], None]
    pending: bool = True
    closed: bool = False
    t0: float = field(default_factory=time.monotonic)


class Admission:
    def __init__(
        self,
        *,
        max_pending: int = 128,
        max_pending_per_ip: int = 16,
        max_conns: int = 4096,
        fail_burst: int = 10,
        fail_per_s: float = 1.0,
    ):
        self.max_pending, self.max_pending_per_ip, self.max_conns = max_pending, max_pending_per_ip, max_conns
        self.fail_burst, self.fail_per_s = float(fail_burst), fail_per_s
        self._lock = threading.Lock()
        self._pending: OrderedDict[Ticket, None] = OrderedDict()  # oldest first
        self._per_ip: dict[str, int] = {}
        self._conns = 0
        self._fails: OrderedDict[str, tuple[float, float]] = OrderedDict()  # ip -> (tokens, at)
        self.rate_limited = 0  # connections closed at once: their IP failed too often
        self.evicted = 0  # pending handshakes dropped to make room
        self.over_capacity = 0  # connections closed at once: max_conns reached
        self.failed_logins = 0
        self.handshake_timeouts = 0  # handshakes that missed their deadline

    def open(self, ip: str, drop: Callable[[], None]) -> Ticket | None:
        """Admit a connection from `ip` (None: close it now). May drop older pending handshakes first."""
        evict: list[Ticket] = []
        with self._lock:
            if self._tokens(ip, time.monotonic()) < 1.0:
                self.rate_limited += 1
                return None
            if self._conns >= self.max_conns:
                self.over_capacity += 1
                return None
            if self._per_ip.get(ip, 0) >= self.max_pending_per_ip:
                evict.append(next(t for t in self._pending if t.ip == ip))
            elif len(self._pending) >= self.max_pending:
                evict.append(next(iter(self._pending)))
            for t in evict:
                self._forget(t)
                self.evicted += 1
            ticket = Ticket(ip, drop)
            self._pending[ticket] = None
            self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
            self._conns += 1
        for t in evict:  # outside the lock: drop may call back into close()
            t.drop()
        return ticket

    def authenticated(self, ticket: Ticket) -> None:
        """The handshake succeeded: the connection no longer counts as pending (nor can it be evicted)."""
        with self._lock:
            if ticket.pending and not ticket.closed:
                self._pending.pop(ticket, None)
                self._dec_ip(ticket.ip)
                ticket.pending = False

    def close(self, ticket: Ticket) -> None:
        with self._lock:
            self._forget(ticket)

    def failed(self, ip: str) -> None:
        """A failed login from `ip`: spends one of its failure tokens."""
        with self._lock:
            self.failed_logins += 1
            now = time.monotonic()
            self._fails[ip] = (max(-self.fail_burst, self._tokens(ip, now) - 1.0), now)
            self._fails.move_to_end(ip)
            while len(self._fails) > MAX_TRACKED_IPS:
                self._fails.popitem(last=False)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def connections(self) -> int:
        with self._lock:
            return self._conns

    def stats(self) -> dict[str, int]:
        return {"rate_limited": self.rate_limited, "evicted": self.evicted, "over_capacity": self.over_capacity,
                "failed_logins": self.failed_logins, "handshake_timeouts": self.handshake_timeouts}

    def timed_out(self) -> None:
        """A handshake missed its deadline (counted; the caller closes it)."""
        with self._lock:
            self.handshake_timeouts += 1

    # -- under self._lock ----------------------------------------------------------------------------
    def _tokens(self, ip: str, now: float) -> float:
        tokens, at = self._fails.get(ip, (self.fail_burst, now))
        return min(self.fail_burst, tokens + (now - at) * self.fail_per_s)

    def _forget(self, ticket: Ticket) -> None:
        if ticket.closed:
            return
        ticket.closed = True
        self._conns -= 1
        if ticket.pending:
            self._pending.pop(ticket, None)
            self._dec_ip(ticket.ip)

    def _dec_ip(self, ip: str) -> None:
        n = self._per_ip.get(ip, 0) - 1
        if n > 0:
            self._per_ip[ip] = n
        else:
            self._per_ip.pop(ip, None)
