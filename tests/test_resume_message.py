"""A bare Trainer script rerun beside its own checkpoint: the log says what
happens (fit() without latest_checkpoint starts from batch 0), never that it
resumes when it does not."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from tests.conftest import base_env

pytest.importorskip("torch")

SCRIPT = """
import sys
from determined_launch import pytorch
from tests.pytorch_fixtures.onevar import OneVarTrial

with pytorch.init(hparams={"global_batch_size": 4}, seed=1) as ctx:
    kwargs = {"latest_checkpoint": sys.argv[1]} if len(sys.argv) > 1 else {}
    pytorch.Trainer(OneVarTrial(ctx), ctx).fit(max_length=pytorch.Batch(2), **kwargs)
"""


def test_a_rerun_without_latest_checkpoint_says_it_starts_over(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def run() -> str:
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=base_env(),
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        return r.stderr

    run()  # trains 2 batches and checkpoints into ./det_runs
    again = run()
    assert "starting from batch 0, not from checkpoint" in again, again
    assert "resuming" not in again.lower() and "Restoring" not in again, again
