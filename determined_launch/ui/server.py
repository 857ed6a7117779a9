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
import pathlib
import socket
import sys
import urllib.parse
from http import HTTPStatus
from typing import Any, Callable, Optional

from determined_launch.common.redact import printable
from determined_launch.ui import metric_series
from determined_launch.ui.api import Api
from determined_launch.ui.conn import BoundedServer, DeadlineHandler
from determined_launch.ui.runs import GROUP, SEARCH_CHARS, Storages
from determined_launch.ui.system import system

STATIC = pathlib.Path(__file__).parent / "static"
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
#: every file the pages need, by its path under /static/ (read once; nothing else there exists)
ASSETS = {f.relative_to(STATIC).as_posix(): TYPES[f.suffix]
          for f in sorted(STATIC.rglob("*")) if f.suffix in TYPES and f.is_file()}
PAGES = ("", "experiments", "runs", "compare")
#: the writes --actions allows: POST /api/v1/experiments/{name}/{action}
ACTIONS = ("pause", "kill", "activate")
COOKIE = "det_ui_token"
MAX_POINTS = 100_000
#: the vendored chart library never changes under its URL (app.html names it with ?v=VERSION)
VENDOR_CACHE = {"Cache-Control": "public, max-age=31536000, immutable"}
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
}


class NotFound(Exception):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _int(query: dict[str, list[str]], name: str, lo: int, hi: int) -> Optional[int]:
    raw = query.get(name, [None])[0]
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise NotFound from None
    return max(lo, min(hi, value))


def _trials(query: dict[str, list[str]]) -> Optional[list[int]]:
    try:
        return metric_series.parse_trials(query.get("trials", [None])[0])
    except ValueError:
        raise NotFound from None  # like any malformed number in a query (_int)


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
        length = _int({"n": [self.headers.get("Content-Length") or "0"]}, "n", 0, 1 << 16)
        self.rfile.read(length or 0)  # an action takes no body; read it to keep the connection
        raw_path, _, raw_query = self.path.partition("?")
        status, _ = self._gate(urllib.parse.parse_qs(raw_query))
        origin = self.headers.get("Origin")
        given = self.headers.get("X-CSRF-Token") or ""
        if status is None and (not hmac.compare_digest(given.encode(), csrf.encode()) or (
                origin is not None and origin != f"http://{self.headers.get('Host')}")):
            status = HTTPStatus.FORBIDDEN
        segments = [urllib.parse.unquote(x) for x in raw_path.split("/")[1:]]
        if status is None and not raw_path.startswith("/"):
            status = HTTPStatus.NOT_FOUND
        if status is None and not (len(segments) == 5 and segments[:3] == ["api", "v1",
                                                                          "experiments"]
                                   and segments[4] in ACTIONS):
            status = HTTPStatus.NOT_FOUND
        body: Any = None
        if status is None:
            from determined_launch.ui import actions

            try:
                body = (actions.pause_experiment(self.server.api, segments[3])
                        if segments[4] == "pause"
                        else actions.det_verb(self.server.api, segments[3], segments[4]))
                status = HTTPStatus.OK if body is not None else HTTPStatus.NOT_FOUND
            except actions.ActionError as e:
                status, body = HTTPStatus.CONFLICT, {"error": str(e)}
        if body is None:
            body = {"error": HTTPStatus(status).phrase}
        self._send(status, json.dumps(body).encode(), "application/json")

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
            segments = [urllib.parse.unquote(s) for s in raw_path.split("/")[1:]]
            if not raw_path.startswith("/") or any(
                    s in (".", "..") or "/" in s or "\\" in s or not s.isprintable()
                    for s in segments):
                raise NotFound  # control characters (ESC, OSC) name nothing here
            if segments[:2] == ["api", "v1"]:
                body, ctype, more = self._api(segments[2:], query)
                extra.update(more)
            elif segments[:1] == ["static"] and "/".join(segments[1:]) in ASSETS:
                name = "/".join(segments[1:])
                body, ctype = self.server.assets[name], ASSETS[name]
                if name.startswith("vendor/"):
                    extra.update(VENDOR_CACHE)
            elif segments[0] in PAGES:
                body, ctype = self.server.assets["app.html"], "text/html"
            else:
                raise NotFound
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

    # -- the API -------------------------------------------------------------------

    def _api(self, seg: list[str], query: dict[str, list[str]]
             ) -> tuple[bytes, str, dict[str, str]]:
        api = self.server.api
        if seg == ["experiments"]:
            return _json(api.experiments())
        if seg == ["runs"]:
            return _json(api.runs())
        if seg == ["actions"]:  # what the pages may offer, and the CSRF value for it
            on = self.server.csrf is not None
            return _json({**dict.fromkeys(ACTIONS, on), "csrf": self.server.csrf})
        if len(seg) >= 2 and seg[0] == "experiments":
            name = seg[1]
            if len(seg) <= 3 and "/".join(seg[2:]) in api.PARTS:  # kept while unchanged
                body, etag = _found(api.experiment_body(name, "/".join(seg[2:])))
                return body, "application/json", {"ETag": etag}
            if seg[2:] == ["metric_names"]:  # the charts' picker: any metric of any group
                return _json(_found(metric_series.experiment_names(api, name, _trials(query))))
            if seg[2:] == ["metrics"]:
                group, metric = query.get("group", [""])[0], query.get("metric", [""])[0]
                if not GROUP.match(group) or not metric:
                    raise NotFound
                return _json(_found(metric_series.experiment_metric(
                    api, name, group, metric, _trials(query))))
            if len(seg) >= 4 and seg[2] == "trials" and seg[3].isdigit():
                tid = int(seg[3])
                if len(seg) == 4:
                    return _json(_found(api.trial(name, tid)))
                run_dir = _found(api.trial_dir(name, tid))
                return self._run_part(seg[4:], run_dir, api.experiment_storage(name), query)
        if len(seg) >= 2 and seg[0] == "runs":
            run_dir = _found(api.run_dir(seg[1]))
            if len(seg) == 2:
                return _json(_found(api.run(seg[1])))
            return self._run_part(seg[2:], run_dir, api.run_storage(seg[1]), query)
        raise NotFound

    def _run_part(self, seg: list[str], run_dir: str, storage: Storages,
                  query: dict[str, list[str]]) -> tuple[bytes, str, dict[str, str]]:
        reader = self.server.api.runs_reader
        if seg == ["metrics"]:
            group = query.get("group", ["training"])[0]
            if not GROUP.match(group):
                raise NotFound  # a group is a stream's name, never a path
            points = _int(query, "max_points", 2, MAX_POINTS)
            since = _int(query, "since", 0, 1 << 62) or 0
            body, more = reader.chart_body(run_dir, group, points, since)
            return body, "application/json", more
        if seg == ["checkpoints"]:
            return _json(reader.checkpoints(run_dir, storage))
        if seg == ["metric_names"]:
            return _json({"groups": metric_series.metric_names(reader, run_dir)})
        if seg == ["system"]:  # the profiler's samples per node (ui/system.py)
            return _json(system(run_dir, self.server.api.roots))
        if seg == ["logs"]:
            rank = _int(query, "rank", 0, 1 << 20)
            offset = _int(query, "offset", 0, 1 << 62)
            search = query.get("q", [""])[0][:SEARCH_CHARS] or None
            text, end = reader.logs(run_dir, rank, offset, search=search)
            return text.encode(), "text/plain", {"X-Log-Offset": str(end)}
        raise NotFound


def _found(value: Any) -> Any:
    if value is None:
        raise NotFound
    return value


def _json(value: Any) -> tuple[bytes, str, dict[str, str]]:
    return json.dumps(value, separators=(",", ":")).encode(), "application/json", {}


def serve(api: Api, host: str, port: int, token: Optional[str],
          announce: Callable[[str], None], actions: bool = False) -> UiServer:
    """Bind (``OSError`` if the address is taken) and announce the URL."""
    server = UiServer((host, port), api, token, actions)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{server.server_address[1]}/"
    announce(url + (f"?token={token}" if token else ""))
    return server
