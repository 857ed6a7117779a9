"""``det-launch ui [PATH ...] [--host HOST] [--port PORT] [--study-storage URL] [--actions]``.

Serves Determined's WebUI pages and a read-only JSON API over the experiment
and run directories under PATH (default ``./det_experiments`` and
``./det_runs``). The first line on stdout is exactly
``det-launch ui: serving http://HOST:PORT/`` (plus ``?token=T`` off loopback
or with ``--actions``),
so scripts can read the address, also of ``--port 0``.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from determined_launch import values
from determined_launch.errors import EXIT_USAGE, LaunchError, UsageParser
from determined_launch.launch import config
from determined_launch.launch.config import Option

if TYPE_CHECKING:
    from determined_launch.ui.remote import Mirror

DEFAULT_PATHS = ("det_experiments", "det_runs")


def _study_storage() -> Option:
    """The experiment's own option (experiment/cli.py): one flag, one variable."""
    from determined_launch.experiment.cli import OPTIONS as EXPERIMENT

    option = next(o for o in EXPERIMENT if o.name == "study_storage")
    return Option(option.name, option.env, option.flag, option.parse, option.default,
                  "the study storage URL of experiments whose database URL has a password "
                  "(it is never written to the experiment directory)", metavar=option.metavar)


OPTIONS: tuple[Option, ...] = (
    Option("host", "DET_UI_HOST", "--host", str, "127.0.0.1",
           "address to listen on; off loopback a random token is required", metavar="HOST"),
    Option("port", "DET_UI_PORT", "--port",
           functools.partial(values.integer, minimum=0, maximum=65535), 8080,
           "port to listen on (0: a free one)", metavar="PORT"),
    _study_storage(),
    Option("actions", "DET_UI_ACTIONS", "--actions", values.boolean, False,
           "offer \"Pause\" on a running experiment's page (the token is then required on "
           "loopback too)", switch=True),
)


def parser() -> UsageParser:
    p = UsageParser(prog="det-launch ui",
                    description="Determined's WebUI for experiments and runs off-cluster: "
                                "pages and a read-only JSON API (/api/v1/) over the files.")
    config.add_flags(p, OPTIONS)
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="an experiment directory, a run directory, or a directory to scan "
                        f"(default: {' and '.join(DEFAULT_PATHS)})")
    return p


def _paths(given: Sequence[str], mirrors: list[Mirror]) -> list[str]:
    """Directories to serve; an object-storage URL becomes a local mirror of
    the records synced there (ui/remote.py), followed in the background."""
    out = []
    for path in given:
        if "://" in path:
            from determined_launch.ui.remote import Mirror

            mirror = Mirror(path)
            mirrors.append(mirror)
            if threading.current_thread() is threading.main_thread():
                # A stop (kill, a scheduler) still removes the mirror's copy (main's finally).
                signal.signal(signal.SIGTERM, _exit)
            mirror.first_sync()
            threading.Thread(target=mirror.follow, daemon=True, name="mirror").start()
            out.append(str(mirror.local))
            continue
        if not os.path.isdir(path):
            raise LaunchError(f"PATH {path}: no such directory")
        out.append(path)
    if out:
        return out
    from determined_launch.exproot import root_dir  # DET_EXPERIMENTS_DIR, as det's

    return [str(root_dir()), *(os.path.abspath(p) for p in DEFAULT_PATHS[1:])]


def _exit(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str]) -> int:
    p = parser()
    try:
        ns = p.parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0) and EXIT_USAGE
    mirrors: list[Mirror] = []
    try:
        return _serve(ns, mirrors)
    finally:
        for mirror in mirrors:
            mirror.close()


def _serve(ns: Any, mirrors: list[Mirror]) -> int:
    try:
        opts = config.resolve(os.environ, {o.name: getattr(ns, o.name) for o in OPTIONS},
                              OPTIONS)
        paths = _paths(ns.paths, mirrors)
        from determined_launch.ui.api import Api
        from determined_launch.ui.server import is_loopback, serve

        host = str(opts["host"])
        actions = bool(opts["actions"])
        token = None if is_loopback(host) and not actions else secrets.token_urlsafe(24)
        try:
            remotes = [(str(m.local), m) for m in mirrors]
            server = serve(Api(paths, opts["study_storage"], remotes), host, int(opts["port"]),
                           token,
                           lambda url: print(f"det-launch ui: serving {url}", flush=True),
                           actions)
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{opts['port']}: "
                              f"{e.strerror or e}") from None
    except LaunchError as e:
        print(f"det-launch ui: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    # Read what is there once, beside serving: a 10,000-trial study is then in memory
    # by the time someone opens its page.
    threading.Thread(target=server.api.warm_up, daemon=True, name="warm-up").start()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
