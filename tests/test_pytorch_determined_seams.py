"""What Determined 0.38.1's own PyTorch tests (and users' tests written like
them) drive: its module paths and the controller's seams. The whole upstream
suite runs with scripts/determined_pytorch_tests.py (not vendored here)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from determined_launch import pytorch
from tests.pytorch_fixtures.onevar import HPARAMS, OneVarTrial

REPO = Path(__file__).resolve().parent.parent

#: Determined 0.38.1's determined/pytorch/_*.py and names its tests import from them
OLD_PATHS = {
    "_callback": ["PyTorchCallback"],
    "_data": ["DataLoader", "TorchData", "to_device", "data_length"],
    "_experimental": ["PyTorchExperimentalContext"],
    "_load": ["CheckpointLoadContext", "load_trial_from_checkpoint_path"],
    "_lr_scheduler": ["LRScheduler"],
    "_metric_utils": ["_process_combined_metrics_and_batches", "_average_training_metrics",
                      "_prepare_metrics_reducers", "_convert_metrics_to_numpy", "_reduce_metrics",
                      "_combine_and_average_training_metrics", "_log_tb_metrics"],
    "_pytorch_context": ["PyTorchTrialContext"],
    "_pytorch_trial": ["PyTorchTrial", "_PyTorchTrialController", "_TrialState"],
    "_reducer": ["Reducer", "MetricReducer", "_PyTorchReducerContext", "_simple_reduce_metrics"],
    "_trainer": ["Trainer", "init"],
    "_trainer_utils": ["Batch", "Epoch", "TrainUnit", "_TrainBoundary", "_TrainBoundaryType",
                       "_ShouldExit", "_TrialState"],
}


@pytest.mark.parametrize("module", sorted(OLD_PATHS))
def test_determineds_module_paths_import(module: str) -> None:
    mod = importlib.import_module(f"determined_launch.pytorch.{module}")
    for name in OLD_PATHS[module]:
        ours = getattr(pytorch, name, None)
        assert getattr(mod, name) is (ours if ours is not None else getattr(mod, name))


def _controller(tmp_path: Path) -> tuple[Any, Any]:
    handle = pytorch.init(hparams=dict(HPARAMS), seed=1, run_dir=str(tmp_path / "run"),
                          checkpoint_storage=str(tmp_path / "ckpt"))
    ctx = handle.__enter__()
    trial = OneVarTrial(ctx)
    controller = trial.trial_controller_class(
        trial_inst=trial, context=ctx, checkpoint_period=pytorch.Batch(sys.maxsize),
        validation_period=pytorch.Batch(sys.maxsize), reporting_period=pytorch.Batch(100),
        smaller_is_better=True, steps_completed=0, latest_checkpoint=None,
        local_training=True, test_mode=False, searcher_metric_name=None, checkpoint_policy="all",
        step_zero_validation=False, max_length=pytorch.Batch(100), global_batch_size=4,
        profiling_enabled=False)
    controller._set_data_loaders()
    controller.training_iterator = iter(controller.training_loader)
    return handle, controller


def test_train_with_boundaries_takes_a_training_enumerator(tmp_path: Path) -> None:
    handle, controller = _controller(tmp_path)
    for n in (1, 2, 3):  # as Determined's test_variable_workload_size: indices restart at 0
        boundary = pytorch._TrainBoundary(pytorch._TrainBoundaryType.TRAIN, pytorch.Batch(n))
        steps, metrics = controller._train_with_boundaries(
            training_enumerator=enumerate(controller.training_iterator),
            train_boundaries=[boundary])
        assert steps[0].limit_reached and len(metrics) == n
    assert controller.state.batches_trained == 6
    handle.close()


def test_controller_settings_drive_the_checkpoint_after_validation(tmp_path: Path) -> None:
    handle, controller = _controller(tmp_path)
    calls: list[bool] = []
    controller._checkpoint = lambda already_exiting: calls.append(already_exiting)
    controller._checkpoint_is_current = lambda: True  # as Determined's tests set them
    controller._validate()
    controller._checkpoint_is_current = lambda: False
    controller._validate()
    assert calls == [False]
    controller.smaller_is_better = False
    assert controller.checkpoint_policy.smaller_is_better is False
    handle.close()


def test_the_scripts_rewrite_changes_only_imports() -> None:
    spec = importlib.util.spec_from_file_location(
        "determined_pytorch_tests", REPO / "scripts" / "determined_pytorch_tests.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    src = ("import determined as det\n"
           "import determined.errors\n"
           "import determined.pytorch._metric_utils as metric_utils\n"
           "from determined import pytorch\n"
           "    from determined.pytorch import samplers\r\n"
           'x = {"dataloader_type": "determined"}  # determined stays\n')
    assert script.rewrite_imports(src) == (
        "import determined_launch as det\n"
        "import determined_launch.errors; import determined_launch as determined\n"
        "import determined_launch.pytorch._metric_utils as metric_utils\n"
        "from determined_launch import pytorch\n"
        "    from determined_launch.pytorch import samplers\r\n"
        'x = {"dataloader_type": "determined"}  # determined stays\n')
