"""The HTTP side: routes, the token, caching headers; the standard library's
``ThreadingHTTPServer`` (a handful of readers, no dependency to ship).

Security (docs/ui.md): GET and HEAD read; the POSTs (pause, kill, activate
an experiment, ui/actions.py) exist only with ``--actions``, which also makes
the token required on loopback, and needs the token plus a CSRF header (a
value only a page of this server can read) and a same-origin ``Origin``.
Off loopback every request needs the server's random token (``?token=``
once, which sets an HttpOnly SameSite cookie, or ``Authorization: Bearer``):
none is 401, a wrong one 403. On loopback the Host header must name
loopback, so a web page elsewhere cannot reach the server by DNS rebinding.
Names in URLs are looked up in the catalog, never joined into paths, and
every file read is confined to the served trees (files.py). Connections are
bounded before any of this (conn.py); what the server keeps is bounded in
bytes (cache.py); text from a request printed to the operator is escaped.
"""

from __future__ import annotations

import hashlib
import hmac
import http.cookies
import ipaddress
import json
import socket
import sys
import urllib.parse
from http import HTTPStatus
from typing import Any, Callable, Optional

from determined_launch.common.redact import printable
from determined_launch.ui import routes
from determined_launch.ui.api import Api
from determined_launch.ui.conn import BoundedServer, DeadlineHandler
from determined_launch.ui.routes import ASSETS, STATIC, HttpError, NotFound

COOKIE = "det_ui_token"
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _segments(raw_path: str) -> list[str]:
    """The path's unquoted segments; NotFound for one that could name a path elsewhere."""
    segments = [urllib.parse.unquote(s) for s in raw_path.split("/")[1:]]
    if not raw_path.startswith("/") or any(
            s in (".", "..") or "/" in s or "\\" in s or not s.isprintable() for s in segments):
        raise NotFound  # control characters (ESC, OSC) name nothing here
    return segments


class UiServer(BoundedServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: Api, token: Optional[str],
                 actions: bool = False, **limits: Any) -> None:
        self.api = api
        self.token = token
        #: the CSRF header's value: derived from the token, readable only through the API
        self.csrf = (hmac.new(token.encode(), b"det-ui-csrf", hashlib.sha256).hexdigest()
                     if actions and token else None)
        self.assets = {name: (STATIC / name).read_bytes() for name in ASSETS}
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, Handler, **limits)


class Handler(DeadlineHandler):
    server: UiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # a request log of every poll would drown the one line scripts read

    # -- the gate ------------------------------------------------------------------

    def _gate(self, query: dict[str, list[str]]) -> tuple[Optional[int], Optional[str]]:
        """(error status or None, a cookie to set)."""
        token = self.server.token
        if token is None:
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            return (None if is_loopback(host) else HTTPStatus.FORBIDDEN), None
        given = query.get("token", [None])[0]
        if given is not None:
            if hmac.compare_digest(given.encode(), token.encode()):
                return None, token
            return HTTPStatus.FORBIDDEN, None
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer "):
            ok = hmac.compare_digest(auth[7:].strip().encode(), token.encode())
            return (None if ok else HTTPStatus.FORBIDDEN), None
        jar = http.cookies.SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie") or "")
        except http.cookies.CookieError:
            return HTTPStatus.FORBIDDEN, None
        if COOKIE in jar:
            ok = hmac.compare_digest(jar[COOKIE].value.encode(), token.encode())
            return (None if ok else HTTPStatus.FORBIDDEN), None
        return HTTPStatus.UNAUTHORIZED, None

    # -- methods -------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._serve(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b'{"error": "read-only"}\n',
                   "application/json", extra={"Allow": "GET, HEAD"})

    do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def do_POST(self) -> None:  # noqa: N802
        csrf = self.server.csrf
        if csrf is None:
            self._refuse()
            return
        length = routes.int_arg({"n": [self.headers.get("Content-Length") or "0"]}, "n", 0,
                                1 << 16)
        self.rfile.read(length or 0)  # an action takes no body; read it to keep the connection
        raw_path, _, raw_query = self.path.partition("?")
        query = urllib.parse.parse_qs(raw_query)
        status, _ = self._gate(query)
        origin = self.headers.get("Origin")
        given = self.headers.get("X-CSRF-Token") or ""
        if status is None and (not hmac.compare_digest(given.encode(), csrf.encode()) or (
                origin is not None and origin != f"http://{self.headers.get('Host')}")):
            status = HTTPStatus.FORBIDDEN
        if status is not None:
            body = json.dumps({"error": HTTPStatus(status).phrase}).encode()
        else:
            try:
                handler, params = routes.find("POST", _segments(raw_path))
                body, _, _ = handler(self._request(params, query))
                status = HTTPStatus.OK
            except HttpError as e:
                status, body = e.status, json.dumps({"error": str(e)}).encode()
        self._send(status, body, "application/json")

    def _request(self, params: dict[str, str], query: dict[str, list[str]]) -> routes.Request:
        return routes.Request(self.server.api, self.server.csrf, self.server.assets, params, query)

    def _serve(self, head: bool) -> None:
        raw_path, _, raw_query = self.path.partition("?")
        query = urllib.parse.parse_qs(raw_query)
        status, cookie = self._gate(query)
        if status is not None:
            self._send(status, json.dumps({"error": HTTPStatus(status).phrase}).encode(),
                       "application/json",
                       extra={"WWW-Authenticate": "Bearer"} if status == 401 else None)
            return
        extra = {}
        if cookie is not None:
            extra["Set-Cookie"] = f"{COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/"
        try:
            handler, params = routes.find("GET", _segments(raw_path))
            body, ctype, more = handler(self._request(params, query))
            extra.update(more)
        except NotFound:
            self._send(HTTPStatus.NOT_FOUND, b'{"error": "Not Found"}\n', "application/json",
                       head=head)
            return
        except Exception as e:  # noqa: BLE001 (one line to the page and to stderr, no trace)
            print(f"det-launch ui: {printable(self.path.split('?')[0])}: {type(e).__name__}: "
                  f"{printable(e)}", file=sys.stderr, flush=True)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                       json.dumps({"error": type(e).__name__}).encode(), "application/json")
            return
        etag = extra.get("ETag") or '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
        if self.headers.get("If-None-Match") == etag:
            self._send(HTTPStatus.NOT_MODIFIED, b"", ctype, extra={**extra, "ETag": etag},
                       head=True)
            return
        self._send(HTTPStatus.OK, body, ctype, extra={**extra, "ETag": etag}, head=head)

    def _send(self, status: int, body: bytes, ctype: str, extra: Optional[dict[str, str]] = None,
              head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype + ("; charset=utf-8" if "json" in ctype or
                                                  ctype.startswith("text") else ""))
        self.send_header("Content-Length", str(len(body)))
        for k, v in {"Cache-Control": "no-cache", **HEADERS, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head and status != HTTPStatus.NOT_MODIFIED:
            self.wfile.write(body)


def serve(api: Api, host: str, port: int, token: Optional[str],
          announce: Callable[[str], None], actions: bool = False) -> UiServer:
    """Bind (``OSError`` if the address is taken) and announce the URL."""
    server = UiServer((host, port), api, token, actions)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_address[1]}/"
    announce(url + (f"?token={token}" if token else ""))
    return server
