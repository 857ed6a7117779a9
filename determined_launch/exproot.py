"""The experiments root's one owner: integer ids, lookup by id or name, listing.

The root (``./det_experiments``, ``DET_EXPERIMENTS_DIR``, or ``--experiments-dir``)
holds one directory per experiment. As Determined numbers them, experiments get
ids 1, 2, 3... and trials get ids unique across the whole root (experiment 1's
trials 1-4, experiment 2's from 5). The numbers are handed out through a registry
in the root::

    <root>/.ids/experiments/<N>    {"dir": NAME, "created": T}
    <root>/.ids/trials/<N>         {"dir": NAME, "number": Optuna's trial number}
    <root>/.ids/jobs/<N>           a ``det job run``, in ``<root>/.jobs/<N>``
    <root>/<NAME>/det_experiment.json   {"id": N, "created": T, "checkpoint_storage": ...}

An id is taken by hard-linking a complete file to its number (``link`` fails if
the name exists, atomically, on local and NFS file systems alike), so any number
of processes on any machines can allocate at once and never get the same id,
with no lock to leak. A trial's id is kept in its study (user attribute
``det_trial_id``) and names its directory ``trials/<id>``; trials recorded
before ids were root-wide have none and keep ``number + 1``, and a directory
made before then is adopted (given an id, its trial directories registered
where their numbers are free) the first time the root sees it.

Standard library only: the PyTorch API imports it (``trial_checkpoints``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
import time
from collections.abc import Mapping
from typing import Any, Optional, Union

ENV = "DET_EXPERIMENTS_DIR"
DEFAULT_ROOT = "det_experiments"
#: the study's user attribute holding a trial's id
ATTR_TRIAL_ID = "det_trial_id"
RECORD = "det_experiment.json"
REGISTRY = ".ids"
_MAX_RECORD = 1 << 16


class LookupFailed(LookupError):
    """No such experiment or trial (the message says which and where)."""


def root_dir(value: Optional[str] = None,
             env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """The root: ``value`` (a flag), else ``DET_EXPERIMENTS_DIR``, else ``./det_experiments``."""
    return pathlib.Path(value or env.get(ENV) or DEFAULT_ROOT).absolute()


def trial_id_of(t: Any) -> int:
    """A study trial's id (Optuna's ``FrozenTrial`` or the UI's journal trial)."""
    value = (getattr(t, "user_attrs", None) or {}).get(ATTR_TRIAL_ID)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return int(t.number) + 1


@dataclasses.dataclass(frozen=True)
class Experiment:
    id: int
    name: str  # its directory's name
    dir: pathlib.Path
    created: float


@dataclasses.dataclass(frozen=True)
class TrialRef:
    id: int
    experiment: Experiment
    dir: pathlib.Path


def _read(path: pathlib.Path) -> Optional[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            value = json.loads(f.read(_MAX_RECORD))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _write(path: pathlib.Path, record: Mapping[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def _number(name: str) -> Optional[int]:
    return int(name) if name.isdigit() and not name.startswith("0") else None


class Root:
    def __init__(self, path: Union[str, os.PathLike[str]]) -> None:
        self.path = pathlib.Path(path).absolute()

    @classmethod
    def of(cls, exp_dir: pathlib.Path) -> Root:
        """The root an experiment directory belongs to: its parent (the directory
        itself when the parent is not writable: its ids are then its own)."""
        exp_dir = pathlib.Path(exp_dir).absolute()
        parent = exp_dir.parent
        if (parent / REGISTRY).is_dir() or os.access(parent, os.W_OK | os.X_OK):
            return cls(parent)
        return cls(exp_dir)

    # -- allocation ----------------------------------------------------------------

    def _registry(self, kind: str) -> pathlib.Path:
        d = self.path / REGISTRY / kind
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _claim(self, kind: str, record: Mapping[str, Any], wanted: Optional[int] = None
               ) -> Optional[int]:
        """Register ``record`` under the next free number (or only ``wanted``)."""
        d = self._registry(kind)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".new-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            n = wanted or 1 + max((x for x in map(_number, os.listdir(d)) if x), default=0)
            while True:
                try:
                    os.link(tmp, d / str(n))
                    return n
                except FileExistsError:
                    if wanted:
                        return None
                    n += 1
        finally:
            os.unlink(tmp)

    def ensure_experiment(self, exp_dir: pathlib.Path,
                          checkpoint_storage: Optional[str] = None) -> int:
        """The id of the experiment in ``exp_dir`` (a directory of this root),
        given one now if it has none; ``checkpoint_storage`` is recorded for
        ``trial_checkpoints``."""
        exp_dir = pathlib.Path(exp_dir).absolute()
        path = exp_dir / RECORD
        record = _read(path)
        if record is None or not isinstance(record.get("id"), int):
            now = time.time()
            n = self._claim("experiments", {"dir": exp_dir.name, "created": now})
            assert n is not None  # noqa: S101 (only a wanted number can be refused)
            record = {"id": n, "created": now}
            try:  # two processes adopting one directory: the first link wins
                fd, tmp = tempfile.mkstemp(dir=exp_dir, prefix=f".{RECORD}.")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(json.dumps(record, indent=1) + "\n")
                os.link(tmp, path)
                os.unlink(tmp)
                self._adopt_trials(exp_dir)
            except FileExistsError:
                os.unlink(tmp)
                record = _read(path) or record
        if checkpoint_storage is not None and record.get("checkpoint_storage") != \
                checkpoint_storage:
            record = {**record, "checkpoint_storage": checkpoint_storage}
            _write(path, record)
        return int(record["id"])

    def _adopt_trials(self, exp_dir: pathlib.Path) -> None:
        """Trial directories from before root-wide ids keep their numbers where free."""
        try:
            names = os.listdir(exp_dir / "trials")
        except OSError:
            return
        for name in names:
            n = _number(name)
            if n:
                self._claim("trials", {"dir": exp_dir.name, "number": n - 1}, wanted=n)

    def new_trial_id(self, exp_dir: pathlib.Path, number: int) -> int:
        """A new root-wide id for Optuna's trial ``number`` of ``exp_dir``."""
        n = self._claim("trials", {"dir": pathlib.Path(exp_dir).name, "number": number})
        assert n is not None  # noqa: S101
        return n

    def new_experiment_dir(self, name: str) -> tuple[int, pathlib.Path]:
        """A new experiment's id and directory: ``<root>/NAME``, or ``NAME-<id>``
        when an experiment of that name exists (Determined allows equal names)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for candidate in (name, None):
            if candidate is None:
                candidate = f"{name}-{1 + max((e.id for e in self.experiments()), default=0)}"
            exp_dir = self.path / candidate
            try:
                exp_dir.mkdir(mode=0o700)
            except FileExistsError:
                continue
            return self.ensure_experiment(exp_dir), exp_dir
        # a race for NAME-<id> too: the registry's next number is free of races
        n = 1 + max((e.id for e in self.experiments()), default=0)
        exp_dir = self.path / f"{name}-{n}-{os.getpid()}"
        exp_dir.mkdir(mode=0o700)
        return self.ensure_experiment(exp_dir), exp_dir

    def new_job_dir(self) -> tuple[int, pathlib.Path]:
        """A ``det job run``'s id and directory, ``<root>/.jobs/<id>`` (never an experiment)."""
        n = self._claim("jobs", {"created": time.time()})
        assert n is not None  # noqa: S101
        path = self.path / ".jobs" / str(n)
        path.mkdir(parents=True, mode=0o700)
        return n, path

    # -- lookup --------------------------------------------------------------------

    def experiments(self) -> list[Experiment]:
        """Every experiment of the root, by id; directories from before ids are adopted."""
        out: dict[int, Experiment] = {}
        try:
            entries = sorted(os.scandir(self.path), key=lambda e: e.name)
        except OSError:
            return []
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            exp_dir = pathlib.Path(entry.path)
            record = _read(exp_dir / RECORD)
            if record is None:
                if not (exp_dir / "experiment.json").is_file():
                    continue
                try:
                    self.ensure_experiment(exp_dir)
                except OSError:
                    continue  # not ours to write: not listed
                record = _read(exp_dir / RECORD) or {}
            n = record.get("id")
            if isinstance(n, int) and n not in out:
                out[n] = Experiment(n, entry.name, exp_dir, float(record.get("created") or 0))
        return [out[k] for k in sorted(out)]

    def experiment(self, ref: Union[str, int]) -> Experiment:
        """By id or by name (its directory's name)."""
        text = str(ref)
        found = self.experiments()
        for e in found:
            if (text.isdigit() and e.id == int(text)) or e.name == text:
                return e
        raise LookupFailed(f"no experiment {text!r} in {self.path}")

    def trial(self, ref: Union[str, int]) -> TrialRef:
        """By root-wide id, or ``EXPERIMENT/N`` (N: the trial's id or directory)."""
        text = str(ref)
        if "/" in text:
            exp_ref, _, tid = text.rpartition("/")
            e = self.experiment(exp_ref)
            d = e.dir / "trials" / tid
            if tid.isdigit() and d.is_dir():
                return TrialRef(int(tid), e, d)
            raise LookupFailed(f"no trial {tid!r} in experiment {e.id} ({e.dir})")
        n = _number(text)
        record = _read(self.path / REGISTRY / "trials" / text) if n else None
        if n and record is not None:
            name = str(record.get("dir", ""))
            for e in self.experiments():
                if e.name == name:
                    return TrialRef(n, e, e.dir / "trials" / str(n))
        raise LookupFailed(f"no trial {text!r} in {self.path}")


def trial_checkpoints(trial_id: Union[int, str], root: Optional[pathlib.Path] = None
                      ) -> list[dict[str, Any]]:
    """Trial ``trial_id``'s committed checkpoints, oldest first: each a dict with
    ``uuid`` (its storage id), ``storage`` (what ``core.init(checkpoint_storage=)``
    accepts), ``steps_completed``, ``time`` and ``metadata``. ``root``: default
    ``root_dir()``. Raises ``LookupFailed`` for an unknown trial."""
    ref = Root(root or root_dir()).trial(trial_id)
    record = _read(ref.experiment.dir / RECORD) or {}
    storage = str(record.get("checkpoint_storage") or ref.experiment.dir / "checkpoints")
    out = []
    for rec in _log(ref.dir):
        sid = rec.get("storage_id")
        if not isinstance(sid, str) or not sid:
            continue
        local = pathlib.Path(storage) / sid
        if "://" not in storage and not storage.endswith((".yaml", ".yml")) and not \
                (local / "metadata.json").is_file():
            continue  # deleted by retention, or never committed
        out.append({"uuid": sid, "storage": storage, "trial_id": ref.id,
                    "experiment_id": ref.experiment.id,
                    "steps_completed": rec.get("steps_completed"), "time": rec.get("time"),
                    "metadata": _read(local / "metadata.json") or rec.get("metadata") or {}})
    return out


def _log(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    from determined_launch.rundir import read_log  # a leaf, standard library only

    records = read_log(run_dir)
    deleted = {r["deleted"] for r in records if isinstance(r.get("deleted"), str)}
    seen: dict[str, dict[str, Any]] = {}
    for rec in records:
        sid = rec.get("storage_id")
        if isinstance(sid, str) and sid not in deleted:
            seen[sid] = {**seen.get(sid, {}), **rec}
    return list(seen.values())
