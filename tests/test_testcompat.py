"""The test-compat names (``det.gpu``, ``det.workload``, ``det.common.util``,
``det.EnvContext``, ``det.LegacyTrial``, ``det.TrialController``,
``det._make_local_execution_env``, ``det._local_execution_manager``,
``det.experimental.test_one_batch``) that Determined's own unit tests and
their helpers import: they exist, behave, and never pull torch into
``import determined_launch``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import determined_launch as det
from determined_launch import errors
from tests.conftest import REPO, base_env


def test_the_names_load_without_torch() -> None:
    code = (
        "import sys, determined_launch as det\n"
        "from determined_launch import gpu, workload, experimental\n"
        "from determined_launch.common import util\n"
        "names = [det.EnvContext, det._make_local_execution_env, det._local_execution_manager,\n"
        "         det._catch_sys_exit, det.experimental.test_one_batch, workload.Stream,\n"
        "         gpu.get_gpu_uuids, util.safe_load_yaml_with_exceptions]\n"
        "before = 'torch' in sys.modules\n"
        "legacy, controller = det.LegacyTrial, det.TrialController\n"
        "print(before, legacy.__name__, controller.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=base_env(), cwd=REPO, timeout=120, check=True)
    assert out.stdout.split() == ["False", "PyTorchTrial", "_PyTorchTrialController"]


def test_gpu_uuids_come_from_nvidia_smi(tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert det.gpu.get_gpu_uuids() == []  # no nvidia-smi
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=uuid ] || exit 9\n"
                    "printf 'GPU-aaa\\n GPU-bbb \\n'\n")
    tool.chmod(0o755)
    assert det.gpu.get_gpu_uuids() == ["GPU-aaa", "GPU-bbb"]
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n")
    assert det.gpu.get_gpu_uuids() == []


def test_workload_has_only_the_type_names() -> None:
    from determined_launch import workload

    assert workload.Stream is not None and workload.Metrics is not None
    with pytest.raises(AttributeError, match="legacy workloads do not exist here"):
        workload.train_workload  # noqa: B018


def test_safe_load_yaml(tmp_path: pathlib.Path) -> None:
    from determined_launch.common import util

    path = tmp_path / "const.yaml"
    path.write_text("hyperparameters:\n  lr: 0.1\nsearcher: {metric: loss}\n")
    with open(path) as f:
        assert util.safe_load_yaml_with_exceptions(f)["hyperparameters"] == {"lr": 0.1}
    assert util.safe_load_yaml_with_exceptions("a: [1, 2]") == {"a": [1, 2]}
    path.write_text("a: 1\n b: [\n")
    with open(path) as f, pytest.raises(ValueError, match=r"const.yaml: invalid YAML at line"):
        util.safe_load_yaml_with_exceptions(f)


def test_make_local_execution_env(tmp_path: pathlib.Path) -> None:
    config = {"hyperparameters": {"global_batch_size": 4,
                                  "lr": {"type": "double", "minval": 0.1, "maxval": 0.2},
                                  "n": {"type": "int", "minval": 2, "maxval": 3},
                                  "opt": {"kind": {"type": "categorical", "vals": ["a", "b"]},
                                          "m": {"type": "const", "val": 0.9}}},
              "reproducibility": {"experiment_seed": 42}}
    core_context, env = det._make_local_execution_env(
        managed_training=False, test_mode=True, config=config,
        checkpoint_dir=str(tmp_path / "ck"), limit_gpus=1)
    assert isinstance(env, det.EnvContext)
    hp = env.hparams
    assert hp["global_batch_size"] == 4 and 0.1 <= hp["lr"] <= 0.2 and hp["n"] in (2, 3)
    assert hp["opt"]["kind"] in ("a", "b") and hp["opt"]["m"] == 0.9
    assert (env.trial_seed, env.test_mode, env.managed_training) == (42, True, False)
    assert env.experiment_config == config and env.latest_checkpoint is None
    with core_context.checkpoint.store_path({"steps_completed": 1}) as (path, sid):
        (path / "w").write_text("x")
    assert (tmp_path / "ck" / sid / "w").read_text() == "x"
    _, given = det._make_local_execution_env(False, False, {}, str(tmp_path), hparams={"a": 1})
    assert (given.hparams, given.trial_seed) == ({"a": 1}, 0)


def test_local_execution_manager(tmp_path: pathlib.Path) -> None:
    cwd, first = os.getcwd(), sys.path[0]
    (tmp_path / "compat_probe_mod.py").write_text("VALUE = 7\n")
    with det._local_execution_manager(tmp_path):
        assert pathlib.Path.cwd() == tmp_path.resolve() and sys.path[0] == ""
        import compat_probe_mod  # found in the context directory

        assert compat_probe_mod.VALUE == 7
    sys.modules.pop("compat_probe_mod", None)
    assert (os.getcwd(), sys.path[0]) == (cwd, first)
    with pytest.raises(errors.InvalidExperimentException, match="sys.exit"):
        with det._local_execution_manager(tmp_path):
            sys.exit(3)
    assert os.getcwd() == cwd


def test_test_one_batch_trains_one_batch_and_leaves_nothing(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    code = (
        "import json, determined_launch as det\n"
        "from tests.pytorch_fixtures.onevar import OneVarTrial\n"
        "seen = []\n"
        "class Probe(OneVarTrial):\n"
        "    def train_batch(self, batch, epoch_idx, batch_idx):\n"
        "        seen.append(batch_idx)\n"
        "        return super().train_batch(batch, epoch_idx, batch_idx)\n"
        "det.experimental.test_one_batch(Probe, {'hyperparameters': {'global_batch_size': 4,\n"
        "    'x': {'type': 'int', 'minval': 1, 'maxval': 2}}, 'searcher': {'metric': 'loss'}})\n"
        "print(json.dumps(seen))\n"
    )
    env = base_env(PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [0]
    assert list(tmp_path.iterdir()) == []  # no det_runs/, no checkpoint left behind
    with pytest.raises(TypeError, match="not a PyTorchTrial"):
        det.experimental.test_one_batch(dict, {})
