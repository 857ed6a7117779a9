"""Validation and detection of cluster info: every mistake is one line naming
the source and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from determined_launch.cluster import ClusterInfo, detect, get_cluster_info, resolve_cluster_info
from determined_launch.errors import ClusterInfoError

GOOD: dict[str, Any] = {
    "container_addrs": ["10.0.0.1", "10.0.0.2"],
    "container_rank": 1,
    "container_slot_counts": [2, 4],
}


def load(tmp_path: Path, doc: Any) -> ClusterInfo:
    path = tmp_path / "info.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return detect({"DET_CLUSTER_INFO_FILE": str(path)}).info


def error_for(tmp_path: Path, doc: Any) -> str:
    with pytest.raises(ClusterInfoError) as e:
        load(tmp_path, doc)
    message = str(e.value)
    assert "\n" not in message
    assert str(tmp_path / "info.json") in message
    return message


def test_good_file(tmp_path: Path) -> None:
    info = load(
        tmp_path,
        {**GOOD, "trial": {"trial_id": 7, "hparams": {"lr": 0.1}}, "latest_checkpoint": "ck"},
    )
    assert info.chief_ip == "10.0.0.1"
    assert info.num_nodes == 2
    assert info.slots_per_node == 4
    assert info.slot_ids == (0, 1, 2, 3)
    assert info.source == "file"
    assert info.trial is not None and info.trial.hparams == {"lr": 0.1}
    assert info.latest_checkpoint == "ck"


@pytest.mark.parametrize(
    "doc, field, problem",
    [
        ("{not json", None, "invalid JSON at line 1"),
        ([1, 2], None, "expected a JSON object"),
        ({k: v for k, v in GOOD.items() if k != "container_rank"}, "container_rank", "missing"),
        ({**GOOD, "container_rank": 2}, "container_rank", "out of range"),
        ({**GOOD, "container_rank": -1}, "container_rank", "must be >= 0"),
        ({**GOOD, "container_rank": "1"}, "container_rank", "expected an integer"),
        ({**GOOD, "container_rank": True}, "container_rank", "expected an integer"),
        ({**GOOD, "container_slot_counts": [2]}, "container_slot_counts", "has 1 entries"),
        ({**GOOD, "container_slot_counts": [2, 1.5]}, "container_slot_counts[1]", "integer"),
        ({**GOOD, "container_slot_counts": [2, 0]}, "container_slot_counts[1]", ">= 1"),
        ({**GOOD, "container_addrs": []}, "container_addrs", "at least one"),
        ({**GOOD, "container_addrs": "10.0.0.1"}, "container_addrs", "expected a list"),
        ({**GOOD, "container_addrs": ["a", 5]}, "container_addrs[1]", "expected a host"),
        ({**GOOD, "slot_ids": [0]}, "slot_ids", "has 1 entries"),
        ({**GOOD, "trial": {"hparams": {}}}, "trial.trial_id", "missing"),
        ({**GOOD, "trial": {"trial_id": 1, "hparams": []}}, "trial.hparams", "expected an object"),
        ({**GOOD, "container_adrs": []}, "container_adrs", "unknown key"),
        ({**GOOD, "job_secret": "short"}, "job_secret", "at least 16"),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, doc: Any, field: str, problem: str) -> None:
    message = error_for(tmp_path, doc)
    if field:
        assert f"field '{field}'" in message
    assert problem in message


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ClusterInfoError, match="cannot read"):
        detect({"DET_CLUSTER_INFO_FILE": str(tmp_path / "nope.json")})


def test_determined_info_dir(tmp_path: Path) -> None:
    (tmp_path / "rendezvous.json").write_text(json.dumps(GOOD | {"extra_future_field": 1}))
    (tmp_path / "cluster.json").write_text(
        json.dumps({"slot_ids": [4, 5, 6, 7], "latest_checkpoint": "uuid-1", "master_url": "x"})
    )
    (tmp_path / "trial.json").write_text(
        json.dumps({"trial_id": 3, "hparams": {"a": 1}, "trial_seed": 9, "experiment_id": 2})
    )
    report = detect({"DET_INFO_DIR": str(tmp_path)})
    info = report.info
    assert info.source == "determined"
    assert info.slot_ids == (4, 5, 6, 7)
    assert info.latest_checkpoint == "uuid-1"
    assert info.trial is not None and (info.trial.trial_id, info.trial.trial_seed) == (3, 9)
    assert [name for name, _ in report.skipped] == ["file"]


def test_local_default_and_slots() -> None:
    # Local mode: det.get_cluster_info() is None; core.init() runs on this machine.
    assert get_cluster_info({"DET_LAUNCH_SLOTS": "3", "DET_INFO_DIR": "/nonexistent"}) is None
    info = resolve_cluster_info({"DET_LAUNCH_SLOTS": "3", "DET_INFO_DIR": "/nonexistent"})
    assert (info.container_addrs, info.container_slot_counts) == (("127.0.0.1",), (3,))
    assert info.source == "local"
    gpus = resolve_cluster_info({"CUDA_VISIBLE_DEVICES": "0,1", "DET_INFO_DIR": "/nonexistent"})
    assert gpus.slots_per_node == 2
    with pytest.raises(ClusterInfoError, match="DET_LAUNCH_SLOTS: expected an integer from 1"):
        resolve_cluster_info({"DET_LAUNCH_SLOTS": "zero", "DET_INFO_DIR": "/nonexistent"})


def test_force_and_disable(tmp_path: Path) -> None:
    env = {"DET_INFO_DIR": "/nonexistent"}
    with pytest.raises(ClusterInfoError, match="'file' was forced but does not match"):
        detect(env, force="file")
    with pytest.raises(ClusterInfoError, match="unknown detector 'slurmm'"):
        detect(env, disable=["slurmm"])
    path = tmp_path / "i.json"
    path.write_text(json.dumps(GOOD))
    report = detect({**env, "DET_CLUSTER_INFO_FILE": str(path)}, disable=["file"])
    assert report.info.source == "local"
    assert ("file", "disabled") in report.skipped


def test_file_round_trip_keeps_source() -> None:
    info = ClusterInfo.from_mapping(GOOD, source="slurm", where="test")
    again = ClusterInfo.from_mapping(info.to_file_dict(), source="file", where="test")
    assert again == info
    assert "job_secret" not in info.to_file_dict()


def test_checkpoint_storage_field_string_or_block_and_secrets_hidden() -> None:
    base = {"container_addrs": ["127.0.0.1"], "container_rank": 0, "container_slot_counts": [1]}
    info = ClusterInfo.from_mapping({**base, "checkpoint_storage": "s3://b/p"},
                                    source="file", where="f.json")
    assert info.checkpoint_storage == "s3://b/p"
    block = {"type": "s3", "bucket": "b", "secret_key": "hunter2", "access_key": "AK"}
    info = ClusterInfo.from_mapping({**base, "checkpoint_storage": block},
                                    source="file", where="f.json")
    assert info.to_file_dict()["checkpoint_storage"] == block  # workers get it whole
    shown = info.to_dict()["checkpoint_storage"]
    assert shown["secret_key"] == "<set>" and shown["bucket"] == "b"
    assert "hunter2" not in repr(info) and "hunter2" not in str(info.to_dict())
    with pytest.raises(ClusterInfoError, match="f.json: field 'checkpoint_storage': expected"):
        ClusterInfo.from_mapping({**base, "checkpoint_storage": 3}, source="file", where="f.json")
