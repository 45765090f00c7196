"""The live status page's HTTP server: the page's three files and /api/status, behind a token.

Standard library only (ThreadingHTTPServer on a daemon thread); GET only (anything else: 501); bounded: a
request line of at most 2 KiB, no body, 10 s per connection, 16 connections at once and 6 of them from one client
address (more are closed unread: one address cannot hold the page for all).
The token is accepted as `Authorization: Bearer TOKEN`, as a cookie, or as `?token=TOKEN`; a page loaded with
`?token=` sets the cookie and is redirected to its plain URL, so the token leaves the address bar. Compared in
constant time; anything else gets 401. Nothing is logged per request (a URL may carry the token).
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["StatusServer"]

log = logging.getLogger("echo2sdk.status")

ASSETS = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
          "/style.css": ("style.css", "text/css")}
MAX_REQUEST_LINE = 2048
MAX_CONNECTIONS = 16
MAX_PER_ADDRESS = 6  # of them from one client address: a browser opens at most 6 to one host (Chromium, Firefox)
TIMEOUT_S = 10.0
HEADERS = {  # the page loads only its own files and talks only to its own origin
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class StatusServer:
    """Serves `state()` (a JSON-safe dict) at /api/status and the page that draws it at /.
    `token`: the page's own token (default: a new random one; the workers' token is never used here)."""

    def __init__(self, state: Callable[[], dict[str, Any]], host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None):
        self.state, self.token = state, token or secrets.token_urlsafe(24)
        self.assets = {path: (resources.files(__package__).joinpath(name).read_bytes(), kind)
                       for path, (name, kind) in ASSETS.items()}
        self._httpd = _Server((host, port), _handler_for(self))
        self.host, self.port = host, self._httpd.server_address[1]
        self.cookie = f"echo2_status_{self.port}"  # cookies ignore ports: one name per server
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The page's address, without the token."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> str:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="echo2-status", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self._httpd.server_close()

    def authorized(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.token.encode())


class _Server(http.server.ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS at once and MAX_PER_ADDRESS from one client address: a
    connection over either cap is closed unread."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()  # connections being served, by client address
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        host = client_address[0]
        with self._lock:
            admitted = self._open.total() < MAX_CONNECTIONS and self._open[host] < MAX_PER_ADDRESS
            if admitted:
                self._open[host] += 1
        if not admitted:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is not taken
            self._release(host)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(client_address[0])

    def _release(self, host: str) -> None:
        with self._lock:
            self._open[host] -= 1
            if self._open[host] <= 0:
                del self._open[host]


def _handler_for(server: StatusServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Handler):
        status = server

    return Handler


class _Handler(http.server.BaseHTTPRequestHandler):
    status: StatusServer
    timeout = TIMEOUT_S
    server_version = "echo2-status"
    sys_version = ""

    def parse_request(self) -> bool:
        if len(self.raw_requestline) > MAX_REQUEST_LINE:
            self.command, self.requestline, self.request_version = None, "", "HTTP/1.0"  # unparsed: not echoed
            self.close_connection = True
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return False
        return super().parse_request()

    def do_GET(self) -> None:  # noqa: N802 - the http.server naming
        url = urlsplit(self.path)
        if (self.headers.get("Content-Length") or "0").strip() != "0":
            return self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, b"a GET has no body\n", "text/plain")
        query = parse_qs(url.query).get("token", [None])[0]
        if not self.status.authorized(self._bearer() or self._cookie() or query):
            return self._send(HTTPStatus.UNAUTHORIZED, b"401: this page needs the run's status token "
                              b"(Authorization: Bearer TOKEN, or ?token=TOKEN once)\n", "text/plain",
                              {"WWW-Authenticate": 'Bearer realm="echo2 status"'})
        if url.path == "/api/status":
            return self._status()
        if url.path not in self.status.assets:
            return self._send(HTTPStatus.NOT_FOUND, b"404\n", "text/plain")
        if query is not None:  # first load: the token moves into a cookie and out of the address bar
            cookie = f"{self.status.cookie}={self.status.token}; HttpOnly; SameSite=Strict; Path=/"
            return self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": url.path, "Set-Cookie": cookie})
        body, kind = self.status.assets[url.path]
        self._send(HTTPStatus.OK, body, kind)

    def _status(self) -> None:
        try:
            body = json.dumps(self.status.state(), allow_nan=False).encode()
        except Exception as e:  # noqa: BLE001 - the page shows the error; the run goes on
            log.warning("status page state failed: %s: %s", type(e).__name__, e)
            body = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, body, "application/json")
        self._send(HTTPStatus.OK, body, "application/json")

    def _bearer(self) -> str | None:
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None

    def _cookie(self) -> str | None:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.status.cookie:
                return value
        return None

    def _send(self, code: HTTPStatus, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in {**HEADERS, **(extra or {}), "Content-Type": f"{kind}; charset=utf-8",
                            "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # request lines may carry ?token=: nothing per request is logged
