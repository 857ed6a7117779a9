"""What is served: the experiments and plain runs found under the given PATHs.

A PATH is an experiment directory (it has ``experiment.json``, written by
``det-launch experiment``), a run directory (a Core API run's streams, see
core/_rundir.py), or a directory scanned two levels deep for both. The scan
is repeated (at most every ``TTL`` seconds), so experiments and runs that
appear while the server runs are shown without a restart. An object-storage
PATH is served as its local mirror (ui/remote.py), a directory like any other.

URLs name experiments by their name and runs by their directory's name; the
server looks names up here and never builds a path from what a request says.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from determined_launch.ui.files import confined, read_json

#: a directory holding any of these is a run directory
RUN_FILES = ("training.jsonl", "validation.jsonl", "checkpoints.jsonl", "progress.jsonl",
             "searcher.jsonl", "latest_checkpoint.json", "early_exit.json", "status.json",
             "exit.json")
#: seconds a scan is reused (20 tabs polling every second share one scan)
TTL = 0.5
DEPTH = 2


def is_experiment(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "experiment.json"))


def is_run(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in RUN_FILES)


class Catalog:
    def __init__(self, paths: Sequence[str]) -> None:
        self.roots = [os.path.abspath(p) for p in paths]
        self._lock = threading.Lock()
        self._at = -TTL
        self._experiments: dict[str, str] = {}
        self._runs: dict[str, str] = {}

    def experiments(self) -> dict[str, str]:
        """Experiment name -> directory."""
        self._refresh()
        return self._experiments

    def runs(self) -> dict[str, str]:
        """Run name -> directory."""
        self._refresh()
        return self._runs

    def _refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._at < TTL:
                return
            exps: dict[str, str] = {}
            runs: dict[str, str] = {}
            for root in self.roots:
                self._scan(root, root, DEPTH, exps, runs)
            self._experiments, self._runs = exps, runs
            self._at = time.monotonic()

    def _scan(self, root: str, path: str, depth: int, exps: dict[str, str],
              runs: dict[str, str]) -> None:
        if not os.path.isdir(path) or confined(path, [root]) is None:
            return  # a symlink out of the served tree is not served
        if is_experiment(path):
            record = read_json(os.path.join(path, "experiment.json"), [root]) or {}
            name = record.get("name")
            _add(exps, name if isinstance(name, str) and name else os.path.basename(path), path)
            return
        if is_run(path):
            _add(runs, os.path.basename(path), path)
            return
        if depth == 0:
            return
        try:
            children = sorted(os.listdir(path))
        except OSError:
            return
        for name in children:
            if not name.startswith("."):
                self._scan(root, os.path.join(path, name), depth - 1, exps, runs)


def _add(table: dict[str, str], name: str, path: str) -> None:
    """Two experiments (or runs) of one name in different PATHs: ``name-2``."""
    if table.get(name) in (None, path):
        table[name] = path
        return
    n = 2
    while f"{name}-{n}" in table:
        n += 1
    table[f"{name}-{n}"] = path
