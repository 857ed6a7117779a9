"""The Core API across real worker processes: sharded checkpoints and
ChiefOnly misuse, with the real DistributedContext under our launcher."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import WORKERS, Launch, base_env

pytestmark = pytest.mark.slow


def run_scenario(
    tmp_path: Path, launches: list[Launch], scenario: str, **extra: str
) -> dict[int, str]:
    env = base_env(
        DET_LAUNCH_SLOTS="3",
        SCENARIO=scenario,
        DET_RUN_DIR=str(tmp_path / "run"),
        DET_CHECKPOINT_STORAGE=str(tmp_path / "ckpt"),
        **extra,
    )
    launch = Launch([sys.executable, str(WORKERS / "core_ranks.py"), "launcher"], env)
    launches.append(launch)
    assert launch.wait(90) == 0, launch.stderr
    assert launch.leftovers() == []
    return {int(r): line for r, line in re.findall(r"\] rank=(\d) (.*)", launch.stdout)}


def test_sharded_checkpoint_every_rank_writes_chief_commits(
    tmp_path: Path, launches: list[Launch]
) -> None:
    out = run_scenario(tmp_path, launches, "sharded")
    assert sorted(out) == [0, 1, 2], out
    ids = {re.search(r"committed=(\S+)", line).group(1) for line in out.values()}
    assert len(ids) == 1
    for line in out.values():
        assert "files=metadata.json,shard-0,shard-1,shard-2 " in line
        assert "metadata={'r0': 0, 'r1': 1, 'r2': 2, 'steps_completed': 7}" in line
    assert os.listdir(tmp_path / "ckpt") == list(ids)


def test_sharded_checkpoint_failure_on_one_rank_commits_nothing(
    tmp_path: Path, launches: list[Launch]
) -> None:
    out = run_scenario(tmp_path, launches, "sharded", FAIL_RANK="2")
    assert out[2] == "error=OSError: disk full"
    for rank in (0, 1):
        assert re.fullmatch(
            r"error=RuntimeError: checkpoint \S+ was not committed: rank 2 "
            r"failed with OSError\('disk full'\)",
            out[rank],
        ), out[rank]
    assert os.listdir(tmp_path / "ckpt") == []


def test_chief_only_misuse_on_a_worker_is_a_clear_error(
    tmp_path: Path, launches: list[Launch]
) -> None:
    out = run_scenario(tmp_path, launches, "chief-only")
    assert out[0] == "answer=False"
    for rank in (1, 2):
        assert out[rank] == (
            "error=PreemptContext was configured with preempt_mode=ChiefOnly but "
            f"should_preempt() was called on a non-chief worker (rank={rank}); "
            "call it only on rank 0, or use PreemptMode.WorkersAskChief"
        )
