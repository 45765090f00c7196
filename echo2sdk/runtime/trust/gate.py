"""The pre-authentication phase of a threaded server (a relay port), run for every connection on one thread.

A relay streams chunks on blocking sockets (recv_into the snapshot buffer, sendall of its slices), one
thread per *authenticated* child. Before authentication nothing gets a thread: one selector thread
accepts, asks `Admission` (caps, eviction of idle handshakes, the failed-login rate limit), runs the TLS
handshake, sends the challenge and reads the client's hello, all non-blocking and under one deadline for
the whole handshake. It holds at most the few KiB of a hello per connection, and only bytes that arrived
(the claimed length is checked against `max_header` before anything is read for it). A complete hello
goes to `accept`, which verifies it and takes the socket (now blocking) or raises; `refuse` then names the
frame to send back before the connection closes.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from echo2sdk.errors import ProtocolError
from echo2sdk.runtime.trust.admission import Admission, Ticket
from echo2sdk.runtime.protocol.wire import PREFIX_BYTES, TAG_BYTES, check_prefix

__all__ = ["Gate"]

log = logging.getLogger("echo2sdk.gate")

_TLS, _SEND, _RECV = range(3)


class _Pending:
    __slots__ = ("sock", "ticket", "deadline", "stage", "out", "buf", "need", "state", "closed")

    def __init__(self, sock: socket.socket, deadline: float, stage: int):
        self.sock, self.deadline, self.stage = sock, deadline, stage
        self.ticket: Ticket | None = None
        self.out, self.buf, self.need = b"", bytearray(), PREFIX_BYTES
        self.state: Any = None
        self.closed = False


class Gate:
    def __init__(
        self,
        server: socket.socket,
        *,
        tls: ssl.SSLContext | None,
        admission: Admission,
        deadline_s: float,
        max_header: int,
        challenge: Callable[[], tuple[bytes, Any]],
        accept: Callable[[Any, bytes, bytes, socket.socket, Ticket], None],
        refuse: Callable[[Exception, str], bytes | None],
        name: str = "gate",
    ):
        """`challenge()` -> (the frame to send first, state); `accept(state, prefix, body, sock, ticket)` takes
        an authenticated socket or raises ProtocolError (AuthError); `refuse(error, ip)` -> the frame to send
        back (or None). `server` is a listening socket; the gate closes it on `close()`."""
        self._server, self._tls, self.admission = server, tls, admission
        self.deadline_s, self.max_header = deadline_s, max_header
        self._challenge, self._accept, self._refuse = challenge, accept, refuse
        self._pending: set[_Pending] = set()
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._server.setblocking(False)
        self._sel.register(self._server, selectors.EVENT_READ, None)
        self._wake, self._waker = socket.socketpair()  # close() wakes the loop at once
        self._sel.register(self._wake, selectors.EVENT_READ, self._wake)
        self._thread = threading.Thread(target=self._run, name=f"echo2-{name}", daemon=True)
        self._thread.start()

    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._closed = True
        try:
            self._waker.send(b"\0")
        except OSError:
            pass
        self._thread.join(5)
        for s in (self._server, self._wake, self._waker):
            s.close()

    # -- the loop -------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                now = time.monotonic()
                wait = min((p.deadline for p in self._pending), default=now + 0.5) - now
                try:
                    events = self._sel.select(min(0.5, max(0.01, wait)))
                except OSError:
                    return
                for key, _ in events:
                    if key.data is None:
                        self._accept_all()
                    elif key.data is self._wake:
                        break
                    elif not key.data.closed:
                        self._advance(key.data)
                self._expire(time.monotonic())
        finally:
            for p in list(self._pending):
                self._drop(p)
            self._sel.close()

    def _accept_all(self) -> None:
        for _ in range(64):  # a burst at a time, then serve the handshakes in flight
            try:
                raw, addr = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed, or out of descriptors: the backlog waits
            raw.setblocking(False)
            p = _Pending(raw, time.monotonic() + self.deadline_s, _TLS if self._tls else _SEND)
            p.ticket = self.admission.open(addr[0], lambda p=p: self._drop(p))
            if p.ticket is None:  # rate-limited or over capacity: closed unread
                raw.close()
                continue
            try:
                if self._tls is not None:
                    p.sock = self._tls.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                p.out, p.state = self._challenge()
            except (OSError, ValueError) as e:
                log.debug("gate: could not start a handshake: %s", e)
                self._drop(p)
                continue
            self._pending.add(p)
            self._sel.register(p.sock, selectors.EVENT_READ if self._tls else selectors.EVENT_WRITE, p)

    def _advance(self, p: _Pending) -> None:
        try:
            if p.stage == _TLS:
                p.sock.do_handshake()
                p.stage = _SEND
            if p.stage == _SEND:
                p.out = p.out[p.sock.send(p.out):]
                if p.out:
                    self._sel.modify(p.sock, selectors.EVENT_WRITE, p)
                    return
                p.stage = _RECV
                self._sel.modify(p.sock, selectors.EVENT_READ, p)
            if self._read(p):
                self._finish(p)
        except ssl.SSLWantReadError:
            self._sel.modify(p.sock, selectors.EVENT_READ, p)
        except ssl.SSLWantWriteError:
            self._sel.modify(p.sock, selectors.EVENT_WRITE, p)
        except (BlockingIOError, InterruptedError):
            pass
        except ProtocolError as e:
            self._fail(p, e)
        except (OSError, EOFError, ValueError):
            self._drop(p)  # went away (or a TLS error): nothing to answer

    def _read(self, p: _Pending) -> bool:
        """Read what arrived of the hello; True once it is complete. Checks the prefix before the rest."""
        while len(p.buf) < p.need:
            data = p.sock.recv(p.need - len(p.buf))
            if not data:
                raise EOFError("peer closed during the handshake")
            p.buf += data
            if p.need == PREFIX_BYTES and len(p.buf) == PREFIX_BYTES:
                sealed, hlen, _ = check_prefix(bytes(p.buf), keyed=True, max_header=self.max_header, max_payload=0)
                if not sealed:
                    raise ProtocolError("unsealed hello")
                p.need = PREFIX_BYTES + TAG_BYTES + hlen
        return True

    def _finish(self, p: _Pending) -> None:
        """The hello is complete: off the selector; `accept` takes the socket, or it is answered and closed."""
        self._pending.discard(p)
        self._sel.unregister(p.sock)
        p.closed = True
        assert p.ticket is not None
        try:
            p.sock.setblocking(True)
            self._accept(p.state, bytes(p.buf[:PREFIX_BYTES]), bytes(p.buf[PREFIX_BYTES:]), p.sock, p.ticket)
        except ProtocolError as e:
            self._answer(p, e)
            self._close(p)
        except OSError:
            self._close(p)
        except Exception:  # noqa: BLE001 - a bug in `accept` costs this connection, not the gate thread
            log.exception("gate: accepting a connection failed")
            self._close(p)

    def _fail(self, p: _Pending, e: ProtocolError) -> None:
        self._answer(p, e)
        self._drop(p)

    def _answer(self, p: _Pending, e: ProtocolError) -> None:
        assert p.ticket is not None
        frame = self._refuse(e, p.ticket.ip)
        if frame:
            try:
                p.sock.setblocking(False)
                p.sock.send(frame)  # best effort: a few hundred bytes into an empty send buffer
            except (OSError, ValueError):
                pass

    def _expire(self, now: float) -> None:
        for p in [p for p in self._pending if p.deadline <= now]:
            self.admission.timed_out()
            self._drop(p)

    def _drop(self, p: _Pending) -> None:
        """Close a pending handshake (expired, evicted, failed, or the gate is closing)."""
        if p.closed:
            return
        p.closed = True
        self._pending.discard(p)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError, OSError):
            pass
        self._close(p)

    def _close(self, p: _Pending) -> None:
        if p.ticket is not None:
            self.admission.close(p.ticket)
        try:
            p.sock.close()
        except OSError:
            pass
