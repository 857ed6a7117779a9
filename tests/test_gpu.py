"""GPU checks under the real launcher: skipped without CUDA (CI has none).

They run when a machine with NVIDIA GPUs is at hand: `det-launch torch` gives
one rank per visible GPU without ``--slots``, NCCL collectives run on each
rank's own device beside our DistributedContext, and the PyTorch Trainer
trains on CUDA under the launcher with the same weights as on CPU.
(AMP on CUDA: tests/test_pytorch_trainer_amp.py.)
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import WORKERS, Launch, base_env
from tests.test_pytorch_loop_dist import AGG_WEIGHTS, _cmd, _env, _finals, _weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _gpu_env(env: dict[str, str]) -> dict[str, str]:
    """base_env hides GPUs from launched jobs; these tests want them back."""
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


def test_nccl_job_gets_one_rank_per_visible_gpu(launches: list[Launch]) -> None:
    gpus = torch.cuda.device_count()
    launch = Launch([sys.executable, "-m", "determined_launch.cli", "torch", "--",
                     sys.executable, str(WORKERS / "nccl_worker.py")], _gpu_env(base_env()))
    launches.append(launch)
    assert launch.wait(180) == 0, launch.stdout + launch.stderr
    rows = [json.loads(m) for m in re.findall(r"^\[rank=\d+\] (\{.*\})$", launch.stdout, re.M)]
    assert sorted(r["rank"] for r in rows) == list(range(gpus)), launch.stdout
    for r in rows:
        assert r["world"] == gpus and r["backend"] == "nccl"
        assert r["device"] == f"cuda:{r['rank']}"  # LOCAL_RANK picks the device
        assert r["sum"] == gpus * (gpus + 1) / 2
        assert r["gathered"] == list(range(gpus))
    assert not launch.leftovers()


def test_trainer_on_cuda_under_the_launcher_gives_the_cpu_weights(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """One rank (NCCL allows one rank per GPU): the model and batches move to
    cuda, and the weight after each batch is the CPU run's (spec section 7)."""
    launch = Launch(_cmd("agg", 1), _gpu_env(_env(tmp_path)))
    launches.append(launch)
    assert launch.wait(180) == 0, launch.stdout + launch.stderr
    assert _weights(tmp_path) == pytest.approx(AGG_WEIGHTS, abs=1e-5)
    (final,) = _finals(launch.stdout)
    assert final["size"] == 1
    (state,) = (tmp_path / "ckpt").glob("*/state_dict.pth")
    ckpt = torch.load(state, weights_only=True, map_location="cpu")
    assert float(ckpt["models_state_dict"][0]["weight"].flatten()[0]) == pytest.approx(
        final["weight"], abs=1e-7)
    assert not launch.leftovers()


def test_more_ranks_than_gpus_is_named(tmp_path: Path, launches: list[Launch]) -> None:
    """--slots above the GPU count: one line naming the rank and the counts,
    not CUDA's "invalid device ordinal"."""
    gpus = torch.cuda.device_count()
    launch = Launch(_cmd("agg", gpus + 1), _gpu_env(_env(tmp_path)))
    launches.append(launch)
    assert launch.wait(180) != 0
    assert (f"local rank {gpus} has no GPU of its own: {gpus + 1} ranks on this node but "
            f"{gpus} visible GPU(s)") in launch.stdout + launch.stderr
    assert "invalid device ordinal" not in launch.stdout + launch.stderr
    assert not launch.leftovers()
