"""Every path det-launch ui answers: one table of (method, pattern, handler).

A page or an endpoint is one row here plus its handler (and, for a page, one
row in static/core.js's ``ROUTES``). A pattern's segments are literal,
``{name}`` (any one segment), ``{name:int}`` (digits) or a last ``{name*}``
(the rest, joined by "/"). Segments arrive unquoted and already refused if
they hold ".", "..", "/" or control characters (server.py), and names are
looked up in the catalog, never joined into paths.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable, Optional

from determined_launch.ui import metric_series
from determined_launch.ui.api import Api
from determined_launch.ui.run_logs import SEARCH_CHARS
from determined_launch.ui.runs import GROUP, Storages
from determined_launch.ui.system import system as samples

#: the writes --actions allows: POST /api/v1/experiments/{name}/{action}
ACTIONS = ("pause", "kill", "activate")
MAX_POINTS = 100_000
STATIC = pathlib.Path(__file__).parent / "static"
#: the vendored chart library never changes under its URL (app.html names it with ?v=VERSION)
VENDOR_CACHE = {"Cache-Control": "public, max-age=31536000, immutable"}
TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
#: every file the pages need, by its path under /static/ (read once; nothing else there exists)
ASSETS = {f.relative_to(STATIC).as_posix(): TYPES[f.suffix]
          for f in sorted(STATIC.rglob("*")) if f.suffix in TYPES and f.is_file()}
#: a handler's answer: body, content type, extra headers
Reply = tuple[bytes, str, dict[str, str]]


class HttpError(Exception):
    def __init__(self, status: int, message: Optional[str] = None) -> None:
        super().__init__(message or HTTPStatus(status).phrase)
        self.status = status


class NotFound(HttpError):
    def __init__(self) -> None:
        super().__init__(HTTPStatus.NOT_FOUND)


@dataclass
class Request:
    api: Api
    csrf: Optional[str]  # None: read-only (no --actions)
    assets: dict[str, bytes]  # static/'s files by path
    params: dict[str, str]  # the pattern's {names}
    query: dict[str, list[str]]


Handler = Callable[[Request], Reply]


def match(pattern: str, segments: list[str]) -> Optional[dict[str, str]]:
    """The pattern's {names} in a path's segments, or None."""
    want = pattern.split("/")[1:]
    if len(segments) > 1 and segments[-1] == "":  # "/runs/x/" is "/runs/x"
        segments = segments[:-1]
    params: dict[str, str] = {}
    for i, w in enumerate(want):
        if w.endswith("*}"):
            if i >= len(segments):
                return None
            params[w[1:-2]] = "/".join(segments[i:])
            return params
        if i >= len(segments):
            return None
        if w.startswith("{"):
            name, _, kind = w[1:-1].partition(":")
            if kind == "int" and not segments[i].isdigit():
                return None
            params[name] = segments[i]
        elif w != segments[i]:
            return None
    return params if len(want) == len(segments) else None


def find(method: str, segments: list[str]) -> tuple[Handler, dict[str, str]]:
    """The row for a request; NotFound if none."""
    for m, pattern, handler in ROUTES:
        params = match(pattern, segments) if m == method else None
        if params is not None:
            return handler, params
    raise NotFound


def int_arg(query: dict[str, list[str]], name: str, lo: int, hi: int) -> Optional[int]:
    raw = query.get(name, [None])[0]
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise NotFound from None
    return max(lo, min(hi, value))


def found(value: Any) -> Any:
    if value is None:
        raise NotFound
    return value


def as_json(value: Any) -> Reply:
    return json.dumps(value, separators=(",", ":")).encode(), "application/json", {}


# -- pages and files -------------------------------------------------------------------

def page(r: Request) -> Reply:
    return r.assets["app.html"], "text/html", {}


def static(r: Request) -> Reply:
    name = r.params["file"]
    if name not in ASSETS:
        raise NotFound
    return r.assets[name], ASSETS[name], VENDOR_CACHE if name.startswith("vendor/") else {}


# -- the API -----------------------------------------------------------------------------

def actions_offered(r: Request) -> Reply:  # what the pages may offer, and the CSRF value
    return as_json({**dict.fromkeys(ACTIONS, r.csrf is not None), "csrf": r.csrf})


def experiment_part(part: str) -> Handler:
    def handler(r: Request) -> Reply:  # kept whole while unchanged (bodies.py)
        body, etag = found(r.api.experiment_body(r.params["name"], part))
        return body, "application/json", {"ETag": etag}
    return handler


def _trial(r: Request) -> tuple[str, Storages]:
    name = r.params["name"]
    return found(r.api.trial_dir(name, int(r.params["tid"]))), r.api.experiment_storage(name)


def _run(r: Request) -> tuple[str, Storages]:
    name = r.params["name"]
    return found(r.api.run_pages.run_dir(name)), r.api.run_pages.run_storage(name)


def metrics(where: Callable[[Request], tuple[str, Storages]]) -> Handler:
    def handler(r: Request) -> Reply:
        run_dir, _ = where(r)
        group = r.query.get("group", ["training"])[0]
        if not GROUP.match(group):
            raise NotFound  # a group is a stream's name, never a path
        points = int_arg(r.query, "max_points", 2, MAX_POINTS)
        since = int_arg(r.query, "since", 0, 1 << 62) or 0
        body, more = r.api.runs_reader.chart_body(run_dir, group, points, since)
        return body, "application/json", more
    return handler


def checkpoints(where: Callable[[Request], tuple[str, Storages]]) -> Handler:
    def handler(r: Request) -> Reply:
        run_dir, storage = where(r)
        return as_json(r.api.runs_reader.checkpoints(run_dir, storage))
    return handler


def logs(where: Callable[[Request], tuple[str, Storages]]) -> Handler:
    def handler(r: Request) -> Reply:
        run_dir, _ = where(r)
        rank = int_arg(r.query, "rank", 0, 1 << 20)
        offset = int_arg(r.query, "offset", 0, 1 << 62)
        search = r.query.get("q", [""])[0][:SEARCH_CHARS] or None
        text, end = r.api.runs_reader.output.logs(run_dir, rank, offset, search=search)
        return text.encode(), "text/plain", {"X-Log-Offset": str(end)}
    return handler


def _trials(query: dict[str, list[str]]) -> Optional[list[int]]:
    try:
        return metric_series.parse_trials(query.get("trials", [None])[0])
    except ValueError:
        raise NotFound from None  # like any malformed number in a query (int_arg)


def experiment_metric_names(r: Request) -> Reply:  # the charts' picker: any metric of any group
    return as_json(found(metric_series.experiment_names(r.api, r.params["name"],
                                                        _trials(r.query))))


def experiment_metric(r: Request) -> Reply:
    group, metric = r.query.get("group", [""])[0], r.query.get("metric", [""])[0]
    if not GROUP.match(group) or not metric:
        raise NotFound
    return as_json(found(metric_series.experiment_metric(r.api, r.params["name"], group, metric,
                                                         _trials(r.query))))


def metric_names(where: Callable[[Request], tuple[str, Storages]]) -> Handler:
    def handler(r: Request) -> Reply:
        run_dir, _ = where(r)
        return as_json({"groups": metric_series.metric_names(r.api.runs_reader, run_dir)})
    return handler


def system(where: Callable[[Request], tuple[str, Storages]]) -> Handler:
    def handler(r: Request) -> Reply:  # the profiler's samples per node (ui/system.py)
        run_dir, _ = where(r)
        return as_json(samples(run_dir, r.api.roots))
    return handler


def action(verb: str) -> Handler:
    def handler(r: Request) -> Reply:
        from determined_launch.ui import actions

        try:
            body = (actions.pause_experiment(r.api, r.params["name"]) if verb == "pause"
                    else actions.det_verb(r.api, r.params["name"], verb))
        except actions.ActionError as e:
            raise HttpError(HTTPStatus.CONFLICT, str(e)) from None
        return as_json(found(body))
    return handler


V1 = "/api/v1"
TRIAL = f"{V1}/experiments/{{name}}/trials/{{tid:int}}"
RUN = f"{V1}/runs/{{name}}"
#: (method, pattern, handler); GET rows answer HEAD too. The pages: static/core.js's ROUTES.
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/", page),
    ("GET", "/experiments", page),
    ("GET", "/experiments/{name}", page),
    ("GET", "/experiments/{name}/trials/{tid}", page),
    ("GET", "/runs", page),
    ("GET", "/runs/{name}", page),
    ("GET", "/compare", page),
    ("GET", "/static/{file*}", static),
    ("GET", f"{V1}/experiments", lambda r: as_json(r.api.experiments())),
    ("GET", f"{V1}/runs", lambda r: as_json(r.api.run_pages.runs())),
    ("GET", f"{V1}/actions", actions_offered),
    *[("GET", f"{V1}/experiments/{{name}}" + (f"/{p}" if p else ""), experiment_part(p))
      for p in Api.PARTS],
    ("GET", f"{V1}/experiments/{{name}}/metric_names", experiment_metric_names),
    ("GET", f"{V1}/experiments/{{name}}/metrics", experiment_metric),
    ("GET", TRIAL, lambda r: as_json(found(r.api.trial(r.params["name"], int(r.params["tid"]))))),
    ("GET", f"{TRIAL}/metrics", metrics(_trial)),
    ("GET", f"{TRIAL}/checkpoints", checkpoints(_trial)),
    ("GET", f"{TRIAL}/logs", logs(_trial)),
    ("GET", f"{TRIAL}/metric_names", metric_names(_trial)),
    ("GET", f"{TRIAL}/system", system(_trial)),
    ("GET", RUN, lambda r: as_json(found(r.api.run_pages.run(r.params["name"])))),
    ("GET", f"{RUN}/metrics", metrics(_run)),
    ("GET", f"{RUN}/checkpoints", checkpoints(_run)),
    ("GET", f"{RUN}/logs", logs(_run)),
    ("GET", f"{RUN}/metric_names", metric_names(_run)),
    ("GET", f"{RUN}/system", system(_run)),
    *[("POST", f"{V1}/experiments/{{name}}/{verb}", action(verb)) for verb in ACTIONS],
]
