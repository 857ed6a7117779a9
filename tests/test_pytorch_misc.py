"""det.pytorch packaging (lazy import), InvalidHP, import_from_path, errors, TB, progress."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest

import determined_launch as det
from determined_launch.pytorch._units import Batch, Epoch
from determined_launch.pytorch.loop import progress as _progress
from determined_launch.pytorch.metrics import tensorboard as _tensorboard
from tests.conftest import base_env

# ---- lazy import --------------------------------------------------------------------

H1_NAMES = [
    "samplers", "DataLoader", "TorchData", "adapt_batch_sampler", "data_length", "to_device",
    "PyTorchCallback", "LRScheduler", "MetricReducer", "Reducer", "Batch", "Epoch", "TrainUnit",
    "_Data", "_dataset_repro_warning", "_PyTorchReducerContext", "_SimpleReducer",
    "_simple_reduce_metrics", "_combine_and_average_training_metrics",
    "_prepare_metrics_reducers", "_reduce_metrics", "_convert_metrics_to_numpy",
    "_log_tb_metrics", "_TrainBoundary", "_TrainBoundaryType",
]  # fmt: skip


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_determined_launch_never_imports_torch() -> None:
    out = run_python(
        """
        import sys
        import determined_launch as det
        assert "torch" not in sys.modules, "import determined_launch imported torch"
        # The cheap top-level additions stay torch-free too.
        det.InvalidHP("x"); det.import_from_path; det.errors.InternalException
        assert det._DistributedBackend().use_torch() in (True, False)
        assert "torch" not in sys.modules, "det.InvalidHP/import_from_path/errors imported torch"
        print("light")
        pt = det.pytorch
        assert "torch" in sys.modules
        print(pt.__name__, det.Epochs.__name__, det.Batches.__name__)
        """
    )
    assert out.split() == ["light", "determined_launch.pytorch", "Epoch", "Batch"]


def test_det_pytorch_exports() -> None:
    missing = [name for name in H1_NAMES if not hasattr(det.pytorch, name)]
    assert missing == []
    assert det.Epochs is det.pytorch.Epoch and det.Batches is det.pytorch.Batch
    assert det.pytorch.Epochs is det.pytorch.Epoch
    assert {"pytorch", "Epochs", "Batches", "InvalidHP", "import_from_path"} <= set(det.__all__)


SPEC_2_1 = [
    "samplers", "DataLoader", "TorchData", "adapt_batch_sampler", "data_length", "to_device",
    "PyTorchCallback", "LRScheduler", "MetricReducer", "Reducer", "Batch", "Epoch", "TrainUnit",
    "PyTorchExperimentalContext", "PyTorchTrialContext", "PyTorchTrial", "CheckpointLoadContext",
    "load_trial_from_checkpoint_path", "init", "Trainer",
    "_Data", "_dataset_repro_warning", "_PyTorchReducerContext", "_SimpleReducer",
    "_simple_reduce_metrics", "_combine_and_average_training_metrics",
    "_prepare_metrics_reducers", "_reduce_metrics", "_convert_metrics_to_numpy",
    "_log_tb_metrics", "_ShouldExit", "_TrainBoundary", "_TrainBoundaryType", "_TrialState",
    "_PyTorchTrialController",
]  # fmt: skip


def test_det_pytorch_has_the_whole_upstream_surface() -> None:
    missing = [name for name in SPEC_2_1 if not hasattr(det.pytorch, name)]
    assert missing == []
    assert callable(det.pytorch.Trainer) and callable(det.pytorch.init)


# ---- InvalidHP, errors --------------------------------------------------------------


def test_invalid_hp() -> None:
    e = det.InvalidHP("lr too large")
    assert isinstance(e, Exception) and e.msg == "lr too large" and str(e) == "lr too large"
    assert det.InvalidHP().msg == "InvalidHP raised"
    with pytest.raises(TypeError, match="str message"):
        det.InvalidHP(3)  # type: ignore[arg-type]
    with pytest.raises(det.InvalidHP):
        raise det.InvalidHP("x")


def test_errors_names() -> None:
    for name in ("InvalidExperimentException", "InternalException", "InvalidCheckpointException"):
        cls = getattr(det.errors, name)
        assert issubclass(cls, Exception)
    assert det.errors.EXIT_PREEMPTED == 75  # the existing content is kept


# ---- import_from_path ---------------------------------------------------------------


def write_module(root: Path, value: int) -> Path:
    root.mkdir()
    (root / "h1_model_def.py").write_text(f"VALUE = {value}\nimport h1_helper\n")
    (root / "h1_helper.py").write_text("HELP = True\n")
    return root


def test_import_from_path_isolates_same_named_modules(tmp_path: Path) -> None:
    a = write_module(tmp_path / "a", 1)
    b = write_module(tmp_path / "b", 2)
    path_before = list(sys.path)
    with det.import_from_path(str(a)):
        import h1_model_def as first  # type: ignore[import-not-found]

        assert sys.path[0] == str(a)
    assert "h1_model_def" not in sys.modules and "h1_helper" not in sys.modules
    assert sys.path == path_before
    with det.import_from_path(b):
        import h1_model_def as second  # type: ignore[import-not-found]
    assert (first.VALUE, second.VALUE) == (1, 2)  # objects stay usable after the block
    assert "h1_model_def" not in sys.modules


def test_import_from_path_keeps_modules_from_elsewhere(tmp_path: Path) -> None:
    code = write_module(tmp_path / "code", 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "h1_elsewhere_mod.py").write_text("X = 1\n")
    sys.path.insert(0, str(elsewhere))
    try:
        with det.import_from_path(code):
            import h1_elsewhere_mod  # type: ignore[import-not-found]  # noqa: F401
        assert "h1_elsewhere_mod" in sys.modules
    finally:
        sys.path.remove(str(elsewhere))
        sys.modules.pop("h1_elsewhere_mod", None)


def test_import_from_path_restores_on_error(tmp_path: Path) -> None:
    code = write_module(tmp_path / "code", 1)
    with pytest.raises(RuntimeError):
        with det.import_from_path(code):
            import h1_model_def  # type: ignore[import-not-found]  # noqa: F401

            raise RuntimeError("boom")
    assert str(code) not in sys.path and "h1_model_def" not in sys.modules


# ---- TensorBoard --------------------------------------------------------------------


class RecordingWriter:
    def __init__(self) -> None:
        self.calls: List[Tuple[str, Any, int]] = []

    def add_scalar(self, tag: str, value: Any, step: int) -> None:
        self.calls.append((tag, value, step))


def test_log_tb_metrics_training() -> None:
    w = RecordingWriter()
    batch = [
        {"loss": np.array(0.5), "out": np.zeros((4, 1)), "n": 1},
        {"loss": np.array(0.25), "out": np.zeros((4, 1)), "n": 2},
    ]
    det.pytorch._log_tb_metrics(w, "train", 10, {"loss": 0.375, "cls": 7.0}, batch)
    assert w.calls == [
        ("Determined/loss", np.array(0.5), 8),
        ("Determined/n", 1, 8),
        ("Determined/loss", np.array(0.25), 9),
        ("Determined/n", 2, 9),
        ("Determined/cls", 7.0, 10),  # only metrics not already logged per batch
    ]


def test_log_tb_metrics_validation_prefix() -> None:
    w = RecordingWriter()
    metrics = {"loss": 1.0, "val_acc": 0.5, "validation_x": 2, "vec": np.ones(3)}
    det.pytorch._log_tb_metrics(w, "val", 5, metrics)
    assert w.calls == [
        ("Determined/val_loss", 1.0, 5),
        ("Determined/val_acc", 0.5, 5),
        ("Determined/validation_x", 2, 5),
    ]
    det.pytorch._log_tb_metrics(None, "val", 5, metrics)  # no writer: nothing, no error


def test_missing_tensorboard_warns_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if _tensorboard.tensorboard_available():
        pytest.skip("a TensorBoard backend is installed here")
    monkeypatch.setattr(_tensorboard, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        assert _tensorboard.make_writer(tmp_path / "tb") is None
        assert _tensorboard.make_writer(tmp_path / "tb") is None
    warnings = [r for r in caplog.records if "TensorBoard logging is off" in r.getMessage()]
    assert len(warnings) == 1


def test_real_writer_when_installed(tmp_path: Path) -> None:
    if not _tensorboard.tensorboard_available():
        pytest.skip("neither tensorboard nor tensorboardX is installed")
    w = _tensorboard.make_writer(tmp_path / "tb")
    assert w is not None
    det.pytorch._log_tb_metrics(w, "train", 2, {"loss": 1.0}, [{"loss": 2.0}, {"loss": 1.0}])
    w.close()
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())


PEER_PYTHON = Path(
    os.environ.get("DET_PEER_TORCH_VENV", str(Path.home() / ".cache" / "det-peer-torch")),
    "bin",
    "python",
)
TB_SCRIPT = """
import sys
from pathlib import Path
import determined_launch as det
from determined_launch.pytorch.metrics import tensorboard as _tensorboard
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = Path(sys.argv[1])
w = _tensorboard.make_writer(out)
batches = [{"loss": 2.0}, {"loss": 1.0}]
det.pytorch._log_tb_metrics(w, "train", 2, {"loss": 1.5, "cls": 3.0}, batches)
det.pytorch._log_tb_metrics(w, "val", 2, {"loss": 0.5})
w.close()
ea = EventAccumulator(str(out))
ea.Reload()
for tag in sorted(ea.Tags()["scalars"]):
    print(tag, [(e.step, e.value) for e in ea.Scalars(tag)])
"""


@pytest.mark.slow
def test_event_files_with_real_tensorboard(tmp_path: Path) -> None:
    """Real event files, read back with TensorBoard's own reader (in the benchmarks' side
    environment, which has tensorboard; this project's environment need not)."""
    if not PEER_PYTHON.exists():
        pytest.skip("no side environment with tensorboard (benchmarks/peer_pytorch_env.sh)")
    proc = subprocess.run(
        [str(PEER_PYTHON), "-c", TB_SCRIPT, str(tmp_path / "tb")],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "No module named 'tensorboard'" in proc.stderr:
        pytest.skip("the side environment has no tensorboard")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "Determined/cls [(2, 3.0)]",
        "Determined/loss [(0, 2.0), (1, 1.0)]",
        "Determined/val_loss [(2, 0.5)]",
    ]


# ---- progress -----------------------------------------------------------------------


def test_progress_info_line(caplog: pytest.LogCaptureFixture) -> None:
    p = _progress.Progress(Batch(100), is_chief=True, use_tqdm=False)
    with caplog.at_level(logging.INFO, logger="determined_launch.pytorch"):
        for b in range(1, 51):
            p.batch_done(b, b // 16)
        line = p.training_report(50, 3, {"loss": np.float64(0.9080740), "out": np.zeros((4, 1))})
        vline = p.validation_report(50, 3, {"val_loss": 0.8185668})
    assert line.startswith("training: batches=50 epochs=3 (50%)")
    assert "loss=0.908074" in line and "out=<ndarray shape=(4, 1)>" in line
    assert vline == "validation: batches=50 epochs=3 (50%): val_loss=0.818567"
    assert [r.getMessage() for r in caplog.records] == [line, vline]
    p.close()


def test_progress_quiet_on_workers(caplog: pytest.LogCaptureFixture) -> None:
    p = _progress.Progress(Epoch(2), is_chief=False, use_tqdm=True)
    with caplog.at_level(logging.INFO, logger="determined_launch.pytorch"):
        p.training_report(16, 1, {"loss": 1.0})
    assert caplog.records == [] and p._bar is None


def test_progress_bar_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    unused = _progress.Progress(Epoch(2), is_chief=True, use_tqdm=True)
    assert unused._bar is None  # nothing drawn until the first batch
    p = _progress.Progress(Epoch(2), is_chief=True, start_batch=4, epoch_len=16, use_tqdm=True)
    p.batch_done(5, 0)
    assert p._bar is not None and p._bar.total == 32 and p._bar.n == 5
    p.batch_done(10, 0)
    assert p._bar.n == 10
    p.close()
    assert "/32" in capsys.readouterr().err  # drawn on stderr (redraws are throttled)


def test_progress_bar_env_and_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DET_PROGRESS_BAR", "0")
    assert not _progress._want_bar(True, None)
    monkeypatch.setenv("DET_PROGRESS_BAR", "1")
    assert _progress._want_bar(True, None)
    assert not _progress._want_bar(False, None)
    monkeypatch.delenv("DET_PROGRESS_BAR")
    assert _progress._want_bar(True, None) == sys.stderr.isatty()


# ---- callbacks ----------------------------------------------------------------------


def test_callback_defaults_are_no_ops() -> None:
    cb = det.pytorch.PyTorchCallback()
    assert cb.on_trial_startup(0, None) is None
    assert cb.on_training_workload_end({}, {}) is None
    assert cb.on_checkpoint_save_start({}) is None
    assert cb.state_dict() == {}
    cb.load_state_dict({"x": 1})


def test_callback_override_detection() -> None:
    from determined_launch.pytorch.api.callback import _epoch_start_takes_no_index, _overrides

    class New(det.pytorch.PyTorchCallback):
        def on_checkpoint_end(self, checkpoint_dir: str) -> None:
            pass

        def on_training_epoch_start(self, epoch_idx: int) -> None:
            pass

    class Legacy(det.pytorch.PyTorchCallback):
        def on_training_epoch_start(self) -> None:  # type: ignore[override]
            pass

    new, legacy, plain = New(), Legacy(), det.pytorch.PyTorchCallback()
    assert _overrides(new, "on_checkpoint_end") and not _overrides(legacy, "on_checkpoint_end")
    assert not _overrides(plain, "on_validation_end")
    plain.on_validation_end = lambda metrics: None  # type: ignore[method-assign]
    assert _overrides(plain, "on_validation_end")
    assert _epoch_start_takes_no_index(legacy)
    assert not _epoch_start_takes_no_index(new)
    assert not _epoch_start_takes_no_index(det.pytorch.PyTorchCallback())
