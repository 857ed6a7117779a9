"""An experiment's trials from its Optuna study (the experiment's one truth).

The study says what files cannot: each trial's state (completed, stopped by
ASHA, invalid, failed, running or abandoned), its searched hyperparameters
and the searcher metric at each length. One storage object is kept per
experiment: a journal file is read directly and followed from where the
last read ended (``journal.py``), so polling a 10,000-trial study costs what
changed; a database is read through Optuna.

The study's place comes from ``experiment.json``, a file anyone who can
write the served tree (or the bucket it mirrors) may have made, so it is
trusted only this far: a journal file or an SQLite database is opened only
if it is a file inside the served directories (an SQLite one read-only, so
nothing is ever created), and any other database only when the operator
named it with ``--study-storage`` (a password is never written to the
directory). Anything else is one message, the same whether or not the named
file exists (no oracle for files outside the tree). A mirrored experiment's
record names its journal beside it (``storage: null``).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch.common.redact import printable
from determined_launch.errors import LaunchError
from determined_launch.ui.bodies import FOREGROUND, stat_signature
from determined_launch.ui.files import confined
from determined_launch.ui.journal import JournalReader

#: seconds a study read is reused (many tabs polling one experiment share it)
TTL = 0.5


class StudyError(Exception):
    """The study cannot be read; the message is shown in place of the trials."""


class Studies:
    def __init__(self, storage_url: Optional[str], roots: Sequence[str] = ()) -> None:
        self.url = storage_url
        self.roots = roots
        self._lock = threading.Lock()
        self._open: dict[str, tuple[threading.Lock, list[Any]]] = {}
        self._cache: dict[str, tuple[float, Any, list[Any]]] = {}
        self._importance: dict[str, tuple[int, dict[str, float]]] = {}
        self._importance_lock = threading.Lock()  # one replay at a time (seconds of CPU)
        self._readers: dict[str, JournalReader] = {}

    def _url(self, exp_dir: str, record: dict[str, Any]) -> Optional[str]:
        """The journal's path or the database URL to open (None: the journal
        in the experiment directory), or ``StudyError`` saying why not."""
        from determined_launch.experiment import searchers as se

        stored = record.get("storage")
        if not stored:
            return None  # the journal in the experiment directory
        if not isinstance(stored, str):
            raise StudyError("experiment.json: 'storage' is not a string")
        label = printable(se.storage_label(stored))
        if self.url and se.storage_label(self.url) == stored:
            return self.url  # the operator named it
        if record.get("storage_has_password") or ("://" in stored
                                                  and not stored.startswith("sqlite:///")):
            raise StudyError(f"the study is in {label}; give its URL with --study-storage "
                             "(the UI opens a database only when its operator names it; the "
                             "password is never written to the experiment directory)")
        if "://" not in stored:
            return self._inside(stored, label, missing_ok=True)
        path = stored[len("sqlite:///"):].split("?", 1)[0]
        return f"sqlite:///file:{self._inside(path, label)}?mode=ro&uri=true"

    def _inside(self, path: str, label: str, missing_ok: bool = False) -> str:
        """``path``'s real path if it is a file (or, ``missing_ok``, nothing yet)
        inside the served directories; one message otherwise, whatever is there."""
        real = confined(os.path.abspath(path), self.roots) if path else None
        if real is not None and (os.path.isfile(real) or
                                 (missing_ok and not os.path.lexists(real))):
            return real
        raise StudyError(f"study storage {label}: not a file inside the served directories "
                         "(the UI opens no study outside them)")

    def trials(self, exp_dir: str, record: dict[str, Any]) -> list[Any]:
        """The study's trials, [] before it has any: a journal file's read
        directly (``journal.JournalReader``: no replay into Optuna's objects,
        so the first read of 10,000 trials is not 5 s), a database's through
        Optuna (Optuna's ``FrozenTrial``)."""
        with self._lock:
            lock, slot = self._open.setdefault(exp_dir, (threading.Lock(), []))
        with lock:
            # The file's signature first: a read kept from before a write is
            # never served after it (answers are kept by this signature, bodies.py).
            signature = self.signature(exp_dir, record)
            hit = self._cache.get(exp_dir)
            if hit is not None and time.monotonic() - hit[0] < TTL and hit[1] == signature:
                return hit[2]
            url = self._url(exp_dir, record)
            if url is None or "://" not in url:
                path = url or self._inside(os.path.join(exp_dir, "study.journal"),
                                           "study.journal", missing_ok=True)
                trials = self._journal(path, str(record.get("name", "")))
            else:
                if not slot:
                    opened = self._load(exp_dir, record)
                    if opened is None:
                        return []
                    slot.append(opened)
                storage, study_id = slot[0]
                trials = list(storage.get_all_trials(study_id, deepcopy=False))
            self._cache[exp_dir] = (time.monotonic(), signature, trials)
            return trials

    def signature(self, exp_dir: str, record: dict[str, Any]) -> Optional[tuple[Any, ...]]:
        """What changes when the study does: its file's (a journal's, an SQLite
        database's and its WAL's) stat; None for a server database (no
        signature: answers from it are never kept)."""
        try:
            url = self._url(exp_dir, record)
        except StudyError as e:
            return ("error", str(e))
        if url is None:
            url = os.path.join(exp_dir, "study.journal")
        if url.startswith("sqlite:///file:"):
            path = url[len("sqlite:///file:"):].split("?", 1)[0]
            return (url, stat_signature(path), stat_signature(path + "-wal"))
        if "://" in url:
            return None
        return (url, stat_signature(url))

    def _journal(self, path: str, name: str) -> list[Any]:
        reader = self._readers.get(path)
        if reader is None or reader.study_name != name:
            reader = self._readers[path] = JournalReader(path, name)
        if not os.path.isfile(path):
            return []  # not created yet (the UI never creates it)
        try:
            return reader.trials() or []
        except OSError as e:
            raise StudyError(f"study storage {path}: {e.strerror or e}") from None
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OverflowError,
                AttributeError) as e:
            self._readers.pop(path, None)  # read again from the start next time
            raise StudyError(f"study storage {path}: not an Optuna journal "
                             f"({type(e).__name__}: {e})") from None

    def importance(self, exp_dir: str, record: dict[str, Any]) -> dict[str, float]:
        """Hyperparameter importance over the completed trials (Optuna's
        PED-ANOVA: no scikit-learn needed, fast at 10,000 trials), computed
        again only when the number of completed trials changed. Optuna's
        replay of the journal is seconds of CPU in the server's one
        interpreter: it starts once no page waits for its first answers."""
        trials = self.trials(exp_dir, record)
        done = sum(1 for t in trials if t.state.name == "COMPLETE")
        hit = self._importance.get(exp_dir)
        if hit is not None and hit[0] == done:
            return hit[1]
        FOREGROUND.wait_quiet(limit=10.0)
        with self._importance_lock:  # the warm-up and a page's request: made once
            hit = self._importance.get(exp_dir)
            if hit is not None and hit[0] == done:
                return hit[1]
            return self._compute_importance(exp_dir, record, done)

    def _compute_importance(self, exp_dir: str, record: dict[str, Any],
                            done: int) -> dict[str, float]:
        result: dict[str, float] = {}
        if done >= 2:
            import optuna

            storage = self._optuna(exp_dir, record)
            if storage is None:
                return {}
            study = optuna.load_study(study_name=str(record.get("name", "")), storage=storage)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental" notes
                try:
                    result = {str(k): float(v) for k, v in optuna.importance.get_param_importances(
                        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()).items()}
                except (ValueError, RuntimeError, ZeroDivisionError):
                    result = {}  # too few distinct values to tell
        self._importance[exp_dir] = (done, result)
        return result

    def _optuna(self, exp_dir: str, record: dict[str, Any]) -> Any:
        """The study's Optuna storage (opened on first use: for importance),
        opened outside the study's read lock: Optuna's replay of a journal is
        seconds, and the page's answers read the study meanwhile."""
        lock, slot = self._open[exp_dir]
        if not slot:
            opened = self._load(exp_dir, record)
            if opened is None:
                return None
            with lock:
                if not slot:
                    slot.append(opened)
        return slot[0][0]

    def _load(self, exp_dir: str, record: dict[str, Any]) -> Optional[tuple[Any, int]]:
        try:
            from determined_launch.experiment import searchers as se

            se.require_optuna()
        except LaunchError:
            raise StudyError("reading the study needs Optuna: pip install "
                             "'determined_launch[search]'") from None
        url = self._url(exp_dir, record)
        journal = os.path.join(exp_dir, "study.journal")
        if "://" not in (url or "") and not os.path.isfile(url or journal):
            return None  # opening would create it: the UI never writes
        try:
            storage = (_read_only_sqlite(url) if url and url.startswith("sqlite:///file:")
                       else se.open_storage(url, journal))
            study_id = storage.get_study_id_from_name(str(record.get("name", "")))
        except LaunchError as e:
            raise StudyError(str(e)) from None
        except KeyError:
            return None  # the study is not created yet
        except Exception as e:  # noqa: BLE001 (the storage's own errors, shown in one line)
            raise StudyError(f"study storage: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
        return storage, study_id


def _read_only_sqlite(url: str) -> Any:
    """An SQLite study opened read-only: no tables made, no version written."""
    import optuna

    return optuna.storages.RDBStorage(url, skip_table_creation=True,
                                      skip_compatibility_check=True)
