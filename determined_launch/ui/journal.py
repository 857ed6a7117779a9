"""An Optuna journal file read directly: the study's trials without Optuna.

Opening a journal with Optuna replays every operation into validated
``FrozenTrial`` objects (a copy per operation): 5.4 s for 10,000 trials on
the 2-core benchmark VM, which the first visitor of the experiment page
waited for. The journal is JSON lines of operations, so this reads them in
one pass into light trials with the attributes the UI reads (``number``,
``state.name``, ``params``, ``user_attrs``, ``intermediate_values``,
``value``, ``datetime_start``, ``datetime_complete``), following Optuna 4's
replay rules (``JournalStorageReplayResult``) as a reader that is not the
writer: an operation on a missing or finished trial is skipped, a second
"running" is refused, a parameter whose distribution conflicts with an
earlier trial's is dropped. Appended lines are read on the next call; an
unfinished last line waits for its newline. tests/test_ui.py checks the
result against Optuna's own reading of the same file.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from typing import Any, Optional

from determined_launch.experiment.journal import record_of
from determined_launch.ui.files import json_lines

# Optuna's JournalOperation codes
CREATE_STUDY, DELETE_STUDY = 0, 1
CREATE_TRIAL, SET_TRIAL_PARAM, SET_TRIAL_STATE_VALUES = 4, 5, 6
SET_TRIAL_INTERMEDIATE_VALUE, SET_TRIAL_USER_ATTR, SET_TRIAL_SYSTEM_ATTR = 7, 8, 9
CHUNK = 8 << 20


class State:
    """Optuna's TrialState by value, with its ``name``."""

    __slots__ = ("name", "value")
    NAMES = ("RUNNING", "COMPLETE", "PRUNED", "FAIL", "WAITING")

    def __init__(self, value: int) -> None:
        self.value = value
        self.name = self.NAMES[value]

    def is_finished(self) -> bool:
        return self.value in (1, 2, 3)


STATES = [State(v) for v in range(len(State.NAMES))]


class Trial:
    __slots__ = ("trial_id", "number", "state", "params", "kinds", "user_attrs",
                 "intermediate_values", "values", "datetime_start", "datetime_complete")

    def __init__(self, trial_id: int, number: int) -> None:
        self.trial_id, self.number = trial_id, number
        self.state = STATES[0]
        self.params: dict[str, Any] = {}
        self.kinds: dict[str, tuple[str, Any]] = {}  # param -> (distribution kind, choices)
        self.user_attrs: dict[str, Any] = {}
        self.intermediate_values: dict[int, float] = {}
        self.values: Optional[list[float]] = None
        self.datetime_start: Optional[datetime.datetime] = None
        self.datetime_complete: Optional[datetime.datetime] = None

    @property
    def value(self) -> Optional[float]:
        return self.values[0] if self.values else None


def _kind(dist: Any) -> tuple[str, Any]:
    if isinstance(dist, str):  # Optuna writes a distribution as a JSON string
        return _kind_of_text(dist)
    name = str(dist.get("name", ""))
    if name.startswith("Categorical"):
        return "categorical", tuple(dist.get("attributes", {}).get("choices", ()))
    return ("int" if name.startswith("Int") else "float"), None


@functools.lru_cache(maxsize=1024)
def _kind_of_text(text: str) -> tuple[str, Any]:
    """10,000 trials share a few distributions: each text is parsed once."""
    return _kind(json.loads(text))


def _external(kind: tuple[str, Any], internal: Any) -> Any:
    if kind[0] == "categorical":
        return kind[1][int(internal)]
    return int(internal) if kind[0] == "int" else float(internal)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: what each field must be where the trials' rows read it (a record made by
#: hand, or another program's, is refused as a whole: ``ValueError``)
_FIELDS: dict[str, Any] = {
    "op_code": _is_int, "trial_id": _is_int, "study_id": _is_int, "state": _is_int,
    "step": _is_int, "intermediate_value": lambda v: v is None or _is_number(v),
    "values": lambda v: v is None or (isinstance(v, list) and all(map(_is_number, v))),
    "value": lambda v: v is None or _is_number(v),
    "user_attr": lambda v: isinstance(v, dict), "user_attrs": lambda v: isinstance(v, dict),
    "params": lambda v: isinstance(v, dict), "distributions": lambda v: isinstance(v, dict),
    "intermediate_values": lambda v: isinstance(v, dict) and all(map(_is_number, v.values())),
    "param_name": lambda v: isinstance(v, str), "study_name": lambda v: isinstance(v, str),
    "datetime_start": lambda v: v is None or isinstance(v, str),
    "datetime_complete": lambda v: v is None or isinstance(v, str),
}


def _check(op: dict[str, Any]) -> None:
    for name, value in op.items():  # a record's few keys, not every known field
        ok = _FIELDS.get(name)
        if ok is not None and not ok(value):
            raise ValueError(f"a record's {name} is {value!r:.40}")
    if "state" in op and not 0 <= op["state"] < len(STATES):
        raise ValueError(f"a record's state is {op['state']!r}")


def _when(text: Optional[str]) -> Optional[datetime.datetime]:
    return datetime.datetime.fromisoformat(text) if text is not None else None


class JournalReader:
    """One study's trials from a journal file, followed as it grows."""

    def __init__(self, path: str, study_name: str) -> None:
        self.path, self.study_name = path, study_name
        self.key: tuple[int, int] = (-1, -1)
        self._reset()

    def _reset(self) -> None:
        self.offset = 0
        self.study_id: Optional[int] = None
        self._names: dict[int, str] = {}  # live studies: id -> name
        self._next_study = 0
        self._next_trial = 0  # trial ids are global over the journal's studies
        self._trials: dict[int, Trial] = {}
        self._mine: list[Trial] = []

    def trials(self) -> Optional[list[Trial]]:
        """The study's trials so far; None while the study does not exist."""
        st = os.stat(self.path)
        if (st.st_dev, st.st_ino) != self.key or st.st_size < self.offset:
            self._reset()  # replaced or cut: read again from the start
            self.key = (st.st_dev, st.st_ino)
        if st.st_size > self.offset:
            self._follow()
        return list(self._mine) if self.study_id is not None else None

    def _follow(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while True:
                chunk = f.read(CHUNK)
                end = chunk.rfind(b"\n") + 1  # an unfinished last line is not a record
                if end == 0:
                    if len(chunk) == CHUNK:
                        raise ValueError(f"a line after byte {self.offset} is longer than "
                                         f"{CHUNK >> 20} MiB (not an Optuna journal?)")
                    return
                lines = [x for x in chunk[:end].splitlines() if x.strip()]
                for op in json_lines(lines, self._one):
                    self._apply(op)
                self.offset += end
                if len(chunk) < CHUNK:
                    return
                f.seek(self.offset)

    def _one(self, line: bytes) -> list[dict[str, Any]]:
        """A line its batch could not parse: the writer's own rule (a record
        after a torn fragment is kept); anything else stops the read, since
        skipping a record would renumber the trials after it."""
        record, _ = record_of(line)
        if record is None:
            raise ValueError(f"{self.path}: a line after byte {self.offset} is not a "
                             "journal record (not an Optuna journal?)")
        return [record]

    def _updatable(self, op: dict[str, Any]) -> Optional[Trial]:
        t = self._trials.get(op["trial_id"])
        return None if t is None or t.state.is_finished() else t

    def _apply(self, op: dict[str, Any]) -> None:
        _check(op)
        code = op["op_code"]
        if code == CREATE_TRIAL:
            self._create_trial(op)
        elif code == SET_TRIAL_STATE_VALUES:
            t = self._updatable(op)
            state = STATES[op["state"]]
            if t is None or (state is t.state and state.name == "RUNNING"):
                return  # another worker popped it first
            if state.name == "RUNNING":
                t.datetime_start = _when(op["datetime_start"])
            if state.is_finished():
                t.datetime_complete = _when(op["datetime_complete"])
            t.state = state
            if op["values"] is not None:
                t.values = op["values"]
        elif code == SET_TRIAL_INTERMEDIATE_VALUE:
            t = self._updatable(op)
            if t is not None:
                t.intermediate_values[op["step"]] = op["intermediate_value"]
        elif code == SET_TRIAL_USER_ATTR:
            t = self._updatable(op)
            if t is not None:
                t.user_attrs.update(op["user_attr"])
        elif code == SET_TRIAL_PARAM:
            self._set_param(op)
        elif code == SET_TRIAL_SYSTEM_ATTR:
            pass  # not shown
        elif code == CREATE_STUDY:
            if op["study_name"] not in self._names.values():
                self._names[self._next_study] = op["study_name"]
                if op["study_name"] == self.study_name and self.study_id is None:
                    self.study_id = self._next_study
                self._next_study += 1
        elif code == DELETE_STUDY:
            gone = self._names.pop(op["study_id"], None) is not None
            if gone and op["study_id"] == self.study_id:
                self.study_id, self._mine = None, []
        elif code > SET_TRIAL_SYSTEM_ATTR:
            raise ValueError(f"{self.path}: operation {code} is not one of Optuna 4's")

    def _create_trial(self, op: dict[str, Any]) -> None:
        study = op["study_id"]
        if study not in self._names:
            return
        mine = study == self.study_id
        trial_id = self._next_trial
        self._next_trial += 1
        if not mine:
            return  # only its id counts
        t = Trial(trial_id, len(self._mine))
        dists = op.get("distributions", {})
        t.kinds = {k: _kind(v) for k, v in dists.items()}
        t.params = {k: _external(t.kinds[k], p) for k, p in op.get("params", {}).items()}
        t.state = STATES[op.get("state", 0)]
        t.user_attrs = dict(op.get("user_attrs", {}))
        t.intermediate_values = {int(k): v for k, v in op.get("intermediate_values", {}).items()}
        value = op.get("value")
        t.values = op.get("values") or ([value] if value is not None else None)
        t.datetime_start = _when(op["datetime_start"])
        t.datetime_complete = _when(op.get("datetime_complete"))
        self._trials[trial_id] = t
        self._mine.append(t)

    def _set_param(self, op: dict[str, Any]) -> None:
        t = self._updatable(op)
        if t is None:
            return
        name, kind = op["param_name"], _kind(op["distribution"])
        for prev in self._mine:  # Optuna: compatible with the first trial that has it
            if name in prev.params:
                if prev.kinds[name][0] != kind[0] or (
                        kind[0] == "categorical" and prev.kinds[name][1] != kind[1]):
                    return
                break
        t.kinds[name] = kind
        t.params[name] = _external(kind, op["param_value_internal"])
