"""``det-launch checkpoints``: look after checkpoint storage without a job.

    det-launch checkpoints list STORAGE
    det-launch checkpoints gc STORAGE [--remove]

STORAGE is anything ``core.init(checkpoint_storage=...)`` accepts: a
directory, a URL (s3://, gs://, az://, file://) or a YAML file with a
``checkpoint_storage`` block. ``list`` prints ``<storage id>\t<metadata JSON>``
per committed checkpoint, by the metadata's ``steps_completed`` (newest
last); with none it says so on stderr and exits 1 (2: no such directory).
``gc`` reports what interrupted saves left (files without a commit marker)
and removes them only with ``--remove``; committed checkpoints are never touched.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from determined_launch.core.storage import open_storage, parse_storage
from determined_launch.errors import EXIT_USAGE, LaunchError, UsageParser

WHAT = "directory, URL or YAML file with a checkpoint_storage block"
#: ``list`` found no committed checkpoint
EXIT_NONE = 1


def _parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="det-launch checkpoints",
                description="List committed checkpoints, or find and remove what "
                            "interrupted saves left behind.")
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,gc}")
    ls = sub.add_parser("list", help="committed checkpoints with their metadata, by "
                                     "steps_completed (newest last)")
    ls.add_argument("storage", metavar="STORAGE", help=WHAT)
    gc = sub.add_parser("gc", help="report leftovers of interrupted saves")
    gc.add_argument("storage", metavar="STORAGE", help=WHAT)
    gc.add_argument("--remove", action="store_true",
                    help="delete the leftovers (never while a job is saving to this storage)")
    return p


def by_step(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Oldest first, newest last: by ``steps_completed`` (Determined's
    checkpoint metadata), those without it first; storage ids break ties."""
    def key(row: tuple[str, dict[str, Any]]) -> tuple[int, float, str]:
        steps = row[1].get("steps_completed") if isinstance(row[1], dict) else None
        if isinstance(steps, (int, float)) and not isinstance(steps, bool):
            return (1, float(steps), row[0])
        return (0, 0.0, row[0])
    return sorted(rows, key=key)


def _none_listed(url: str, leftovers: Sequence[str]) -> int:
    """``list`` of a storage without a committed checkpoint: said, and a status a
    script can test (1, as ``grep`` finding nothing; 2 for a directory that is not
    there, a typo until proven otherwise)."""
    if "://" not in url and not pathlib.Path(url).is_dir():
        print(f"det-launch checkpoints: error: {url}: no such directory", file=sys.stderr)
        return EXIT_USAGE
    more = (f"; {len(leftovers)} leftover(s) of interrupted saves (det-launch checkpoints gc)"
            if leftovers else "")
    print(f"det-launch checkpoints: no committed checkpoints in {url}{more}", file=sys.stderr)
    return EXIT_NONE


def main(argv: Sequence[str]) -> int:
    try:
        ns = _parser().parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0) and EXIT_USAGE
    try:
        backend = open_storage(parse_storage(ns.storage, where="STORAGE"), probe=True)
        committed, leftovers = backend.list_ids()
    except LaunchError as e:
        print(f"det-launch checkpoints: error: {e}", file=sys.stderr)
        return e.exit_status
    except Exception as e:  # network, permissions: one line, not a traceback
        print(f"det-launch checkpoints: error: {ns.storage}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    if ns.action == "list":
        if not committed:
            return _none_listed(backend.url, leftovers)
        for sid, metadata in by_step([(sid, backend.get_metadata(sid)) for sid in committed]):
            # JSON: a script can parse it, and control characters in the file come out escaped
            print(f"{sid}\t{json.dumps(metadata, sort_keys=True, default=str)}")
        return 0
    print(f"{backend.url}: {len(committed)} committed checkpoint(s), "
          f"{len(leftovers)} leftover(s) of interrupted saves")
    status = 0
    for sid in leftovers:
        if not ns.remove:
            print(f"  leftover {sid}")
            continue
        try:
            backend.remove_leftover(sid)
            print(f"  removed {sid}")
        except Exception as e:
            print(f"  could not remove {sid}: {e}", file=sys.stderr)
            status = 1
    if leftovers and not ns.remove:
        print("run again with --remove to delete them (not while a job is saving here)")
    return status
