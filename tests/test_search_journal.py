"""The study journal survives a worker killed mid-append (optuna #5138)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from determined_launch.errors import LaunchError
from determined_launch.experiment import searchers as se
from determined_launch.experiment.expconf import load as load_config

optuna = pytest.importorskip("optuna")

CONFIG = """
name: j
entrypoint: model_def:Trial
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
searcher: {name: random, metric: loss, max_trials: 50, max_length: {batches: 4}}
"""


def _search(tmp_path: Path) -> se.Search:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(CONFIG)
    return se.Search(load_config(cfg))


def _finish_one(path: Path, search: se.Search, value: float) -> None:
    study = se.load_study(se.open_storage(str(path), ""), "j", search)
    trial = study.ask(search.distributions())
    study.tell(trial, value)


def _values(path: Path, search: se.Search) -> list[float]:
    study = se.load_study(se.open_storage(str(path), ""), "j", search)
    return sorted(t.value for t in study.get_trials() if t.value is not None)


def _torn_tail(path: Path) -> None:
    """What a worker SIGKILLed in the middle of its write leaves behind."""
    with path.open("ab") as f:
        f.write(b'{"op_code":5,"worker_id":"dead","trial_id":0,"sta')


def test_a_torn_record_at_the_end_is_dropped_and_appends_start_on_a_fresh_line(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    search, path = _search(tmp_path), tmp_path / "study.journal"
    _finish_one(path, search, 1.0)
    _torn_tail(path)
    assert _values(path, search) == [1.0]  # readers never count the fragment
    _finish_one(path, search, 2.0)  # the next worker appends
    _finish_one(path, search, 3.0)
    assert _values(path, search) == [1.0, 2.0, 3.0]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x)["op_code"] >= 0 for x in lines[:-1])
    # stock Optuna reads it too (optuna-dashboard, users' scripts)
    stock = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(path)))
    assert len(optuna.load_study(study_name="j", storage=stock).get_trials()) == 3
    err = capfd.readouterr().err
    assert err.count("dropped a torn record") == 1 and len(err.strip().splitlines()) == 1


def test_a_line_spliced_by_an_older_writer_keeps_the_record_after_the_fragment(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    search, path = _search(tmp_path), tmp_path / "study.journal"
    _finish_one(path, search, 1.0)
    _torn_tail(path)
    # what Optuna's own backend does next: append right after the fragment
    good = path.read_bytes()
    clean = tmp_path / "clean.journal"
    clean.write_bytes(good[:good.rindex(b"\n") + 1])
    _finish_one(clean, search, 2.0)
    _finish_one(clean, search, 3.0)
    path.write_bytes(good + clean.read_bytes()[good.rindex(b"\n") + 1:])
    assert _values(path, search) == [1.0, 2.0, 3.0]
    assert "starts with a torn record" in capfd.readouterr().err


def test_a_corrupt_line_in_the_middle_is_named_by_its_number(tmp_path: Path) -> None:
    search, path = _search(tmp_path), tmp_path / "study.journal"
    _finish_one(path, search, 1.0)
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(3, b"garbage\n")
    path.write_bytes(b"".join(lines))
    with pytest.raises(LaunchError, match=r"^study storage .*study.journal: line 4 is not a "):
        _values(path, search)


def test_a_file_that_is_not_a_journal_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "study.journal"
    path.write_text('{"op_code": 99999}\n{"op_code": 0}\n')
    with pytest.raises(LaunchError, match=r"^study storage .*: "):
        se.open_storage(str(path), "")
