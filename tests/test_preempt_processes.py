"""Synchronized preemption with real launchers, real processes and the real
DistributedContext: 2 simulated nodes x 2 slots on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests._core_helpers import (
    PREEMPT_GRACE,
    common_stop,
    preempt_through_non_chief,
    start_two_nodes,
)
from tests.conftest import WORKERS, Launch, base_env

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("block", [False, True], ids=["nonblocking", "blocking"])
def test_signal_to_non_chief_launcher_stops_all_ranks_on_the_same_call(
    tmp_path: Path, launches: list[Launch], block: bool
) -> None:
    argv = [sys.executable, str(WORKERS / "core_preempt.py"), "launcher"]
    env = base_env(
        PREEMPT_BLOCK="1" if block else "0",
        DET_RUN_DIR=str(tmp_path / "run"),
        DET_PREEMPT_GRACE=str(PREEMPT_GRACE),
    )
    chief, other = start_two_nodes(argv, env, launches)
    preempt_through_non_chief(chief, other, tmp_path / "run" / "training.jsonl")
    common_stop(r"stopped rank=(\d) call=(\d+)", chief.stdout + other.stdout)
