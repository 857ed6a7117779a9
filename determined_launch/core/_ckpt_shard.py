"""The pure parts of sharded checkpoints and shared downloads.

Every rank evaluates ``check_reports`` on the same gathered data, so all
ranks reach the same decision without another round trip.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import dumps

Selector = Optional[Callable[[str], bool]]


class CheckpointConflictError(ValueError):
    """Sharded ranks gave different values for the same metadata key."""


def merge_metadata(all_metadata: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Union of every rank's metadata; nested dicts merge key by key.

    Equal values under one key are fine (every rank may report
    ``steps_completed``); different ones raise ``CheckpointConflictError``
    naming the key, because silently picking one would lose information.
    """

    def merge(into: dict[str, Any], new: Mapping[str, Any], where: str) -> None:
        for key, value in new.items():
            if key not in into:
                into[key] = value
            elif isinstance(into[key], dict) and isinstance(value, Mapping):
                merge(into[key], value, f"{where}{key}.")
            elif into[key] != value:
                raise CheckpointConflictError(
                    f"sharded checkpoint metadata conflict at {where}{key!s}: "
                    f"{into[key]!r} != {value!r}"
                )

    out: dict[str, Any] = {}
    for md in all_metadata:
        merge(out, json.loads(dumps(dict(md))), "")
    return out


def check_reports(storage_id: str, reports: list[Mapping[str, Any]]
                  ) -> tuple[Optional[str], dict[str, Any]]:
    """(why not to commit or None, merged metadata) from every rank's report."""
    for rank, report in enumerate(reports):
        if report["error"] is not None:
            return (f"checkpoint {storage_id} was not committed: rank {rank} failed with "
                    f"{report['error']}"), {}
    owners: dict[str, list[int]] = {}
    for rank, report in enumerate(reports):
        for rel in report["files"]:
            owners.setdefault(rel, []).append(rank)
    conflicts = sorted((rel, ranks) for rel, ranks in owners.items() if len(ranks) > 1)
    if conflicts:
        rel, ranks = conflicts[0]
        return (f"checkpoint {storage_id} was not committed: file {rel} was written by ranks "
                f"{ranks} ({len(conflicts)} conflicting file(s)); give each rank its own "
                "file names"), {}
    try:
        return None, merge_metadata([r["metadata"] for r in reports])
    except CheckpointConflictError as e:
        return str(e), {}


def failed_upload(storage_id: str, uploads: list[Optional[str]]) -> Optional[str]:
    for rank, err in enumerate(uploads):
        if err is not None:
            return f"checkpoint {storage_id} was not committed: rank {rank} failed with {err}"
    return None


def union(reports: list[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for report in reports:
        out.update(report["files"])
    return out


def _node(dist: Collectives) -> int:
    # A stand-in without node information counts every rank as its own node.
    return int(getattr(dist, "cross_rank", dist.rank))


@contextlib.contextmanager
def node_shared(
    dist: Collectives,
    selector: Selector,
    open_fn: Callable[[Selector], contextlib.AbstractContextManager[pathlib.Path]],
) -> Iterator[pathlib.Path]:
    """``restore_path`` in ``LocalWorkersShareDownload`` mode: the first rank
    of each node downloads, the others of that node use its directory, and
    it is removed only after every rank has left the block.

    Selectors cannot travel between processes; when any rank passes one,
    each rank downloads its own selection (still in step).
    """
    with contextlib.ExitStack() as stack:
        any_selector = any(dist.allgather(selector is not None))
        node = _node(dist)
        nodes = dist.allgather(node)
        downloader = any_selector or nodes.index(node) == dist.rank
        path: Optional[pathlib.Path] = None
        error: Optional[BaseException] = None
        if downloader:
            try:
                path = stack.enter_context(open_fn(selector))
            except Exception as e:
                error = e
        shared = dist.allgather({"path": str(path) if path else None,
                                 "error": None if error is None else repr(error)})
        try:
            if error is not None:
                raise error
            failed = [s["error"] for s in shared if s["error"] is not None]
            if failed:
                raise RuntimeError(f"restoring the checkpoint failed on another rank: {failed[0]}")
            yield path if path is not None else pathlib.Path(shared[nodes.index(node)]["path"])
        finally:
            dist.allgather(None)  # the node's download stays until everyone is done


def node_shared_download(
    dist: Collectives,
    dst: pathlib.Path,
    selector: Selector,
    fetch: Callable[[pathlib.Path, Selector], None],
) -> None:
    """``download`` in ``LocalWorkersShareDownload`` mode: each distinct
    (node, directory) is downloaded once, by its lowest rank."""
    any_selector = any(dist.allgather(selector is not None))
    key = (_node(dist), str(dst.absolute()))
    keys = [tuple(k) for k in dist.allgather(list(key))]
    error: Optional[BaseException] = None
    if any_selector or keys.index(key) == dist.rank:
        try:
            fetch(dst, selector)
        except Exception as e:
            error = e
    errors = dist.allgather(None if error is None else repr(error))
    if error is not None:
        raise error
    failed = [e for e in errors if e is not None]
    if failed:
        raise RuntimeError(f"downloading the checkpoint failed on another rank: {failed[0]}")
