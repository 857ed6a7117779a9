"""What one run directory says: metrics, checkpoints, status (its log: run_logs.py).

A trial of an experiment is a run directory too (``<exp>/trials/<id>``), so
these functions serve both ``/api/v1/runs/...`` and the trials' endpoints.
Every file is opened through ``files`` (confined to the served roots).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional, Protocol, Union

from determined_launch.supervisor import stragglers
from determined_launch.ui import files, shape
from determined_launch.ui.cache import ByteLru
from determined_launch.ui.run_logs import RunLogs

#: streams that are not metric reports (core/_rundir.py and its writers)
NOT_METRICS = frozenset({"checkpoints", "progress", "searcher", "profiler", "task_sources",
                         "stragglers"})
GROUP = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}$")
#: unread bytes above which a chart gets a preview while the stream is read (~80,000 rows)
PREVIEW_BYTES = 8 << 20
#: rows of one answer for every row (``metrics`` without ``max_points``); the next
#: page's ``since`` is in ``X-Metrics-Next``
ROWS_PAGE = 50_000
#: downsampled charts and previews kept (estimated bytes)
CHART_CACHE_BYTES = 32 << 20


def chart_points(max_points: int) -> int:
    """``max_points`` rounded down to one of a few sizes (1000 * 2**k, or a power
    of two below 1000): a chart's rows are computed and kept once per size, so
    asking for every number from 2 to 100,000 keeps at most 17 per stream."""
    if max_points >= 1000:
        return 1000 << (max_points // 1000).bit_length() - 1
    return 1 << max(1, max_points.bit_length() - 1)


class RemoteCheckpoints(Protocol):
    """Checkpoints in object storage (ui/remote.py's ``Mirror``)."""

    def checkpoint(self, uuid: str) -> dict[str, Any]:
        """``{size, storage, found, metadata}`` of one checkpoint."""


#: where a run's checkpoints are: local directories, or an object storage
Storages = Sequence[Union[str, RemoteCheckpoints]]


class _Downsampled:
    def __init__(self, table: files.Table) -> None:
        self.table = table
        self.n = -1
        self.columns: dict[str, shape.Extremes] = {}
        self.rows: list[dict[str, Any]] = []
        self.body = b"[]"
        self.lock = threading.Lock()

    def nbytes(self) -> int:
        """Estimated: the rows as dicts are several times their JSON."""
        return 7 * len(self.body) + 16 * sum(len(e.lo) for e in self.columns.values())


class RunReader:
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = roots
        self.streams = files.Streams()
        self._sizes: dict[str, Optional[int]] = {}  # committed checkpoints never change
        #: the runs' output.log (run_logs.py)
        self.output = RunLogs(roots)
        self._lock = threading.Lock()
        self._downsampled: ByteLru[_Downsampled] = ByteLru(CHART_CACHE_BYTES)
        self._reading: set[tuple[str, str]] = set()  # streams read by a background thread
        self._previews: ByteLru[tuple[float, list[dict[str, Any]]]] = ByteLru(
            CHART_CACHE_BYTES // 2)

    def table(self, run_dir: str, group: str) -> files.Table:
        if not GROUP.match(group):
            return files.Table()
        return self.streams.get(os.path.join(run_dir, f"{group}.jsonl"), self.roots)

    def groups(self, run_dir: str) -> list[str]:
        """Metric groups the run reported (training and validation first)."""
        try:
            names = os.listdir(run_dir)
        except OSError:
            return []
        found = {n[:-6] for n in names if n.endswith(".jsonl")} - NOT_METRICS
        return sorted(found, key=lambda g: ({"training": 0, "validation": 1}.get(g, 2), g))

    def metrics(self, run_dir: str, group: str, max_points: Optional[int] = None,
                since: int = 0) -> list[dict[str, Any]]:
        """Every report of ``group`` in step order (as written), from row
        ``since``; with ``max_points``, the rows that keep each metric's shape."""
        return self.chart(run_dir, group, max_points, since)[0]

    def chart(self, run_dir: str, group: str, max_points: Optional[int] = None,
              since: int = 0) -> tuple[list[dict[str, Any]], bool]:
        """``metrics`` and whether the rows are a preview.

        Why a preview: the first read of a long stream parses every line
        (about 2 s of CPU per million rows here), and a chart asks for a
        thousand of them. While more than ``PREVIEW_BYTES`` are unread, a
        downsampled request answers at once with rows spread evenly over the
        file (``files.sample``) and a background thread reads the stream;
        the pages poll each second, so the shape-keeping rows replace the
        preview as soon as the read ends. Requests for every row wait."""
        if max_points is not None:
            max_points = chart_points(max_points)
        if max_points is not None and GROUP.match(group):
            path = os.path.join(run_dir, f"{group}.jsonl")
            if self.streams.backlog(path) > PREVIEW_BYTES:
                self._read_in_background(run_dir, group)
                return self._preview(path, max_points), True
        table = self.table(run_dir, group)
        if max_points is not None and len(table) > max_points:
            return self._downsample(run_dir, group, table, max_points).rows, False
        return [shape.finite(r) for r in table.rows(range(max(0, since), len(table)))], False

    def chart_body(self, run_dir: str, group: str, max_points: Optional[int] = None,
                   since: int = 0) -> tuple[bytes, dict[str, str]]:
        """``chart`` as the server sends it: JSON and headers, memory bounded
        whatever is asked. A downsampled chart is encoded once per size and
        stream length; every row from ``since`` comes a page
        (``ROWS_PAGE`` rows) at a time, never kept."""
        headers: dict[str, str] = {}
        table: Optional[files.Table] = None
        if max_points is not None:
            max_points = chart_points(max_points)
            rows, preview = self.chart(run_dir, group, max_points, since)
            if preview:  # the stream is being read: not read here
                headers["X-Metrics-Preview"] = "sampled"
                return _encode(rows), headers
            table = self.table(run_dir, group)
            body = (self._downsample(run_dir, group, table, max_points).body
                    if len(table) > max_points else _encode(rows))
        else:
            table = self.table(run_dir, group)
            start = max(0, since)
            stop = min(len(table), start + ROWS_PAGE)
            body = _encode([shape.finite(r) for r in table.rows(range(start, stop))])
            if stop < len(table):
                headers["X-Metrics-Next"] = str(stop)
        skipped = table.skipped
        if skipped:  # lines too long or too odd to keep: the chart goes on after them
            headers["X-Metrics-Skipped-Lines"] = str(skipped)
        return body, headers

    def _preview(self, path: str, max_points: int) -> list[dict[str, Any]]:
        """One sample a second at most, however many tabs ask: the GIL it
        holds is taken from the read that ends the preview."""
        now = time.monotonic()
        hit = self._previews.get((path, max_points))
        if hit is not None and now - hit[0] < 1.0:
            return hit[1]
        rows = [shape.finite(r) for r in files.sample(path, self.roots, max_points).rows()]
        self._previews.put((path, max_points), (now, rows), 600 * len(rows))
        return rows

    def _read_in_background(self, run_dir: str, group: str) -> None:
        key = (run_dir, group)
        with self._lock:
            if key in self._reading:
                return
            self._reading.add(key)

        def read() -> None:
            try:
                self.table(run_dir, group)
            finally:
                with self._lock:
                    self._reading.discard(key)

        threading.Thread(target=read, name=f"read {group}", daemon=True).start()

    def _downsample(self, run_dir: str, group: str, table: files.Table,
                    max_points: int) -> _Downsampled:
        """Rows that keep each metric's shape, kept up to date as the stream grows
        (``shape.Extremes``): a poll of a growing million-row stream costs its new rows."""
        key = (run_dir, group, max_points)
        with self._lock:
            state = self._downsampled.get(key)
            if state is None or state.table is not table:  # new, or read again from the start
                state = _Downsampled(table)
                self._downsampled.put(key, state, 0)
        with state.lock:
            if state.n != len(table):
                rows: set[int] = set()
                for name, col in table.columns.items():
                    ext = state.columns.setdefault(name, shape.Extremes(max_points))
                    ext.update(col)
                    rows.update(ext.indices(col))
                state.rows = [shape.finite(r) for r in table.rows(sorted(rows))]
                state.body = _encode(state.rows)
                state.n = len(table)
                self._downsampled.put(key, state, state.nbytes())
            return state

    def _ends(self, run_dir: str, group: str) -> files.Table:
        """The stream's rows, or while a long one is unread, its first and
        newest rows only (list pages never wait for that read)."""
        path = os.path.join(run_dir, f"{group}.jsonl")
        if GROUP.match(group) and self.streams.backlog(path) > PREVIEW_BYTES:
            return files.sample(path, self.roots, 1)
        return self.table(run_dir, group)

    def last_step(self, run_dir: str) -> Optional[int]:
        """The newest report's step."""
        tables = [self._ends(run_dir, group) for group in ("training", "validation")]
        steps = [t.steps[-1] for t in tables if len(t)]
        steps = [s for s in steps if s == s]
        return int(max(steps)) if steps else None

    def regressions(self, run_dir: str) -> int:
        """Times the validation steps went back: reruns from an earlier checkpoint."""
        steps = self.table(run_dir, "validation").steps
        return sum(1 for a, b in zip(steps, steps[1:]) if b < a)

    def checkpoints(self, run_dir: str, storage_dirs: Storages) -> list[dict[str, Any]]:
        """Checkpoints the run committed (``checkpoints.jsonl``), newest last,
        with those retention deleted marked, and one being written now."""
        table = self.table(run_dir, "checkpoints")
        out: dict[str, dict[str, Any]] = {}
        for record in table.records:
            sid = record.get("storage_id")
            if isinstance(sid, str) and sid:
                out[sid] = {"uuid": sid, "steps_completed": record.get("steps_completed"),
                            "time": record.get("time"), "state": "COMPLETED"}
            deleted = record.get("deleted")
            if isinstance(deleted, str) and deleted in out:
                out[deleted]["state"] = "DELETED"
        latest = files.read_json(os.path.join(run_dir, "latest_checkpoint.json"), self.roots)
        pending = latest.get("pending") if latest else None
        if isinstance(pending, str) and pending and pending not in out:
            out[pending] = {"uuid": pending, "steps_completed": None, "time": None,
                            "state": "UNCOMMITTED"}
        for entry in out.values():
            entry.update(self._storage(entry["uuid"], storage_dirs,
                                       final=entry["state"] != "UNCOMMITTED"))
            if entry["state"] == "COMPLETED" and entry["storage"] and not entry["found"]:
                # files without the commit marker are not resumed (rundir.py), but not gone
                entry["state"] = "UNCOMMITTED" if entry.get("unmarked") else "DELETED"
            del entry["found"]
            entry.pop("unmarked", None)
        return list(out.values())

    def _storage(self, uuid: str, storage_dirs: Storages,
                 final: bool = True) -> dict[str, Any]:
        if "/" in uuid or uuid.startswith("."):
            return {"size": None, "storage": None, "found": False, "metadata": None}
        for base in storage_dirs:
            if not isinstance(base, str):
                found = dict(base.checkpoint(uuid))
                return {**found, "metadata": shape.redact(found.get("metadata"))}
            if not os.path.isdir(base):
                continue
            path = os.path.join(base, uuid)
            meta = files.read_json(os.path.join(path, "metadata.json"), self.roots)
            if meta is None:
                return {"size": None, "storage": base, "found": False, "metadata": None,
                        "unmarked": os.path.isdir(path) and not os.path.islink(path)}
            # A committed checkpoint never changes: its tree is walked once. One being
            # written is walked again on each request (there is at most one per run).
            with self._lock:
                size = self._sizes.get(path)
            if size is None:
                size = files.dir_size(path, self.roots)
                if final:
                    with self._lock:
                        self._sizes[path] = size
            return {"size": size, "storage": base, "found": True,
                    "metadata": shape.redact(meta)}
        return {"size": None, "storage": None, "found": False, "metadata": None}

    def stragglers(self, run_dir: str) -> dict[str, Any]:
        """Slow ranks the launcher recorded (``stragglers.jsonl``): now and lately."""
        return stragglers.summary(shape.redact(self.table(run_dir, "stragglers").records))

    def status(self, run_dir: str) -> dict[str, Any]:
        """The run's own notes: early exit, status, metadata, latest checkpoint."""
        def read(name: str) -> Optional[dict[str, Any]]:
            data = files.read_json(os.path.join(run_dir, name), self.roots)
            return shape.redact(data) if data is not None else None

        latest = read("latest_checkpoint.json") or {}
        early = read("early_exit.json")
        status = read("status.json")
        meta = read("run_metadata.json")
        return {"early_exit": early.get("reason") if early else None,
                "status": status.get("status") if status else None,
                "metadata": meta.get("metadata") if meta else None,
                "latest_checkpoint": latest.get("storage_id"),
                "hparams": latest.get("hparams")}

    def activity(self, run_dir: str) -> tuple[Optional[float], Optional[float]]:
        """First and last report times (start and last update)."""
        first: list[float] = []
        last: list[float] = []
        for group in self.groups(run_dir):
            times = self._ends(run_dir, group).times
            if len(times):
                first.append(times[0])
                last.append(times[-1])
        logged = self.output.modified(run_dir)
        if logged is not None:
            last.append(logged)
        first = [t for t in first if t == t]
        last = [t for t in last if t == t]
        return (min(first) if first else None, max(last) if last else None)


def _encode(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps(rows, separators=(",", ":")).encode()
