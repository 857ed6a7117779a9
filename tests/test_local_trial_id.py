"""The local trial is trial 0 in what it writes, as the docs say (not ``null``),
and a rerun still resumes from run directories written either way."""

from __future__ import annotations

import json
import pathlib

from determined_launch import core, envvars
from determined_launch.cluster import ClusterInfo
from determined_launch.cluster.local_trial import LocalTrialOptions, complete


def local_info(run_dir: pathlib.Path) -> ClusterInfo:
    bare = ClusterInfo(container_addrs=("127.0.0.1",), container_rank=0,
                       container_slot_counts=(1,), slot_ids=(0,), source="local")
    return complete(bare, {envvars.RUN_DIR: str(run_dir),
                           envvars.CHECKPOINT_STORAGE: str(run_dir.parent / "ck")},
                    LocalTrialOptions())


def lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_local_trial_is_written_as_trial_0(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    info = local_info(run_dir)
    assert info.trial is not None and info.trial.local and info.trial.trial_id == 0
    with core.init(info=info, run_dir=str(run_dir),
                   checkpoint_storage=str(tmp_path / "ck")) as ctx:
        ctx.train.report_training_metrics(steps_completed=1, metrics={"loss": 1.0})
        ctx.train.report_validation_metrics(steps_completed=1, metrics={"loss": 1.0})
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, sid):
            (path / "w").write_text("x")
    for name in ("training.jsonl", "validation.jsonl"):
        assert [r["trial_id"] for r in lines(run_dir / name)] == [0], name
    pointer = json.loads((run_dir / "latest_checkpoint.json").read_text())
    assert (pointer["trial_id"], pointer["storage_id"]) == (0, sid)
    # The same command again resumes from it ...
    assert local_info(run_dir).latest_checkpoint == sid
    # ... and from a run directory written before, with "trial_id": null.
    pointer["trial_id"] = None
    (run_dir / "latest_checkpoint.json").write_text(json.dumps(pointer))
    assert local_info(run_dir).latest_checkpoint == sid
