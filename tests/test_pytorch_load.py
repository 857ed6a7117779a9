"""load_trial_from_checkpoint_path and CheckpointLoadContext (spec 2.10).

Checkpoints come from real Trainer runs (in-process, one rank) or are built
file by file in Determined 0.38.1's format (spec section 4) to cover FIX-3
(numpy rng state), FIX-4 (DDP prefix) and the legacy layouts.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import determined_launch as det
from determined_launch import errors, pytorch

REPO = Path(__file__).resolve().parents[1]

MODEL_DEF = """
import torch
from torch import nn
from determined_launch import pytorch


class Ones(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([1.0]), torch.tensor([1.0])


class LoadTrial(pytorch.PyTorchTrial):
    def __init__(self, context, extra=0.0):
        self.context = context
        self.extra = extra
        self.lr = context.get_hparam("lr")  # FIX-5: needs hparams at load time
        model = nn.Linear(1, 1, bias=False)
        model.weight.data.fill_(0.0)
        self.model = context.wrap_model(model)
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=self.lr))

    def build_training_data_loader(self):
        return pytorch.DataLoader(Ones(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self):
        return pytorch.DataLoader(Ones(), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}
"""

HPARAMS = {"lr": 0.001, "global_batch_size": 4}


def _latest(workdir: Path) -> Path:
    pointer = json.loads((workdir / "det_runs" / "local" / "latest_checkpoint.json").read_text())
    return workdir / "det_runs" / "checkpoints" / pointer["storage_id"]


@pytest.fixture
def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A checkpoint of 10 batches written by our Trainer, the trial in its own module."""
    module = f"h3_model_def_{uuid.uuid4().hex[:8]}"
    work = tmp_path / "work"
    work.mkdir()
    (work / f"{module}.py").write_text(MODEL_DEF)
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    for var in ("DET_CLUSTER_INFO_FILE", "DET_RUN_DIR", "DET_CHECKPOINT_STORAGE"):
        monkeypatch.delenv(var, raising=False)
    mod = __import__(module)
    with pytorch.init(hparams=dict(HPARAMS)) as ctx:
        pytorch.Trainer(mod.LoadTrial(ctx), ctx).fit(
            max_length=pytorch.Batch(10), checkpoint_policy="none"
        )
    sys.modules.pop(module, None)  # later imports must come from the checkpoint's code/
    sys.path.remove(str(work))
    return _latest(work), module


def test_roundtrip_weights_hparams_and_class(trained: tuple[Path, str]) -> None:
    ckpt, module = trained
    assert (ckpt / "code" / f"{module}.py").is_file()
    assert not (ckpt / "code" / "det_runs").exists()  # FIX-14: no self-recursion
    trial = pytorch.load_trial_from_checkpoint_path(str(ckpt), trial_kwargs={"extra": 2.0})
    assert type(trial).__name__ == "LoadTrial" and type(trial).__module__ == module
    assert trial.extra == 2.0
    assert trial.context.get_hparams() == HPARAMS
    assert isinstance(trial.context, pytorch.CheckpointLoadContext)
    assert trial.model.weight.item() == pytest.approx(1 - 0.998**10, abs=1e-6)


def test_explicit_trial_class_and_torch_load_kwargs(trained: tuple[Path, str]) -> None:
    ckpt, module = trained
    with det.import_from_path(ckpt / "code"):
        cls = __import__(module).LoadTrial
    trial = pytorch.load_trial_from_checkpoint_path(
        str(ckpt), trial_class=cls, torch_load_kwargs={"map_location": "cpu"}
    )
    assert trial.model.weight.item() == pytest.approx(1 - 0.998**10, abs=1e-6)


def test_deprecated_kwargs(trained: tuple[Path, str]) -> None:
    ckpt, _ = trained
    with pytest.warns(FutureWarning, match="torch_load_kwargs"):
        pytorch.load_trial_from_checkpoint_path(str(ckpt), map_location="cpu")
    with pytest.raises(ValueError, match="may not be set"):
        pytorch.load_trial_from_checkpoint_path(
            str(ckpt), torch_load_kwargs={"map_location": "cpu"}, map_location="cpu"
        )


def test_unimportable_class_says_use_trial_class(trained: tuple[Path, str]) -> None:
    ckpt, module = trained
    (ckpt / "code" / f"{module}.py").unlink()
    with pytest.raises(ValueError, match="via the trial_class argument"):
        pytorch.load_trial_from_checkpoint_path(str(ckpt))


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidCheckpointException, match="state_dict.pth"):
        pytorch.load_trial_from_checkpoint_path(str(tmp_path))
    (tmp_path / "state_dict.pth").write_bytes(b"")
    with pytest.raises(AssertionError, match="no load_data.json"):
        pytorch.load_trial_from_checkpoint_path(str(tmp_path))


def test_trial_defined_in_main_script(tmp_path: Path) -> None:
    """FIX-5: a Trainer script that defines its trial class itself; upstream records
    "__main__:Cls", which nothing can import."""
    work = tmp_path / "proj"
    work.mkdir()
    script = MODEL_DEF + textwrap.dedent(
        """
        if __name__ == "__main__":
            with pytorch.init(hparams={"lr": 0.001, "global_batch_size": 4}) as ctx:
                pytorch.Trainer(LoadTrial(ctx), ctx).fit(max_length=pytorch.Batch(3))
        """
    )
    (work / "train_main.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["PYTHONPATH"] = str(REPO)
    subprocess.run(
        [sys.executable, "train_main.py"],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    ckpt = _latest(work)
    data = json.loads((ckpt / "load_data.json").read_text())
    assert data["trial_cls_spec"] == "train_main:LoadTrial" and data["trial_in_main"] is True
    trial = pytorch.load_trial_from_checkpoint_path(str(ckpt))
    assert trial.model.weight.item() == pytest.approx(1 - 0.998**3, abs=1e-6)
    sys.modules.pop("train_main", None)


# --- Determined-format checkpoints built file by file --------------------------------

SIMPLE_TRIAL = """
import torch
from determined_launch import pytorch

class T(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.a = context.wrap_model(torch.nn.Linear(2, 1))
        self.b = context.wrap_model(torch.nn.Linear(1, 1, bias=False))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.a.parameters(), lr=0.1))
    def build_training_data_loader(self): ...
    def build_validation_data_loader(self): ...
    def train_batch(self, batch, epoch_idx, batch_idx): ...
    def evaluate_batch(self, batch): ...
"""


def _upstream_checkpoint(path: Path, module: str, *, ddp: bool, is_trainer: bool) -> None:
    """The files Determined 0.38.1 writes (spec 4): np.random state as an ndarray,
    and with DDP the ``module.`` prefix on every key."""
    (path / "code").mkdir(parents=True)
    (path / "code" / f"{module}.py").write_text(SIMPLE_TRIAL)
    a, b = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        a.weight.fill_(0.5)
        a.bias.fill_(-1.0)
        b.weight.fill_(3.0)

    def sd(m: torch.nn.Module) -> dict:
        return {("module." if ddp else "") + k: v for k, v in m.state_dict().items()}

    torch.save(
        {
            "models_state_dict": [sd(a), sd(b)],
            "optimizers_state_dict": [torch.optim.SGD(a.parameters(), lr=0.1).state_dict()],
            "lr_schedulers_state_dict": [],
            "callbacks": {},
            "rng_state": {
                "cpu_rng_state": torch.random.get_rng_state(),
                "np_rng_state": np.random.get_state(),
                "random_rng_state": random.getstate(),
            },
        },
        path / "state_dict.pth",
    )
    load_data: dict[str, Any] = {
        "trial_type": "PyTorchTrial",
        "experiment_config": None
        if is_trainer
        else {"entrypoint": f"{module}:T", "optimizations": {}},
        "hparams": None if is_trainer else {},
        "trial_cls_spec": f"{module}:T",
    }
    if is_trainer:
        load_data["is_trainer"] = True
    (path / "load_data.json").write_text(json.dumps(load_data))
    (path / "trial_state.pkl").write_bytes(pickle.dumps({"trial_id": 0, "batches_trained": 1}))


@pytest.mark.parametrize("ddp", [False, True])
@pytest.mark.parametrize("is_trainer", [True, False])
def test_loads_upstream_format(tmp_path: Path, ddp: bool, is_trainer: bool) -> None:
    module = f"h3_simple_{uuid.uuid4().hex[:8]}"
    _upstream_checkpoint(tmp_path, module, ddp=ddp, is_trainer=is_trainer)
    with pytest.raises(pickle.UnpicklingError):  # what upstream's own loader hits (FIX-3)
        torch.load(tmp_path / "state_dict.pth")
    trial = pytorch.load_trial_from_checkpoint_path(str(tmp_path))
    assert torch.equal(trial.a.weight, torch.full((1, 2), 0.5))
    assert torch.equal(trial.a.bias, torch.tensor([-1.0]))
    assert torch.equal(trial.b.weight, torch.tensor([[3.0]]))
    assert isinstance(trial.context, pytorch.CheckpointLoadContext) is is_trainer
    sys.modules.pop(module, None)


def test_incompatible_trial_is_clear(tmp_path: Path) -> None:
    module = f"h3_simple_{uuid.uuid4().hex[:8]}"
    _upstream_checkpoint(tmp_path, module, ddp=False, is_trainer=True)
    state = torch.load(tmp_path / "state_dict.pth", weights_only=False)
    state["models_state_dict"] = state["models_state_dict"][:1]
    torch.save(state, tmp_path / "state_dict.pth")
    with pytest.raises(errors.InvalidCheckpointException, match="wrapped 2 model"):
        pytorch.load_trial_from_checkpoint_path(str(tmp_path))
    sys.modules.pop(module, None)


ANCIENT_TRIAL = """
import torch
from determined_launch import pytorch

class Old(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
    def build_model(self):
        return torch.nn.Linear(1, 1, bias=False)
    def build_training_data_loader(self): ...
    def build_validation_data_loader(self): ...
    def train_batch(self, batch, epoch_idx, batch_idx): ...
    def evaluate_batch(self, batch): ...
"""


@pytest.mark.parametrize("key", ["model_state_dict", "models_state_dict"])
def test_ancient_build_model_checkpoint_returns_module(tmp_path: Path, key: str) -> None:
    """Determined <= 0.17.7: metadata.json only, and the pre-0.12.13 build_model() API."""
    module = f"h3_old_{uuid.uuid4().hex[:8]}"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{module}.py").write_text(ANCIENT_TRIAL)
    (tmp_path / "metadata.json").write_text(
        json.dumps(
            {
                "framework": "torch-1.4.0",
                "hparams": {"global_batch_size": 2},
                "experiment_config": {"entrypoint": f"{module}:Old"},
            }
        )
    )
    weights = {"weight": torch.tensor([[0.75]])}
    torch.save(
        {key: weights if key == "model_state_dict" else [weights]}, tmp_path / "state_dict.pth"
    )
    model = pytorch.load_trial_from_checkpoint_path(str(tmp_path))
    assert isinstance(model, torch.nn.Linear)
    assert model.weight.item() == 0.75
    sys.modules.pop(module, None)


def test_checkpoint_load_context_is_unmanaged_single_process() -> None:
    ctx = pytorch.CheckpointLoadContext(hparams={"global_batch_size": 8})
    assert ctx.distributed.size == 1 and ctx.distributed.rank == 0
    assert ctx.get_per_slot_batch_size() == 8
    assert ctx.get_trial_seed() == 0
    model = ctx.wrap_model(torch.nn.Linear(1, 1))
    assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)
    with pytest.raises(ValueError):
        ctx.get_experiment_config()


def test_same_named_module_already_imported_does_not_shadow(
    trained: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two experiments' `model_def`: the one already imported (not from this
    checkpoint's code/) is set aside for the import and restored afterwards."""
    import types

    ckpt, module = trained
    other = types.ModuleType(module)
    monkeypatch.setitem(sys.modules, module, other)
    trial = pytorch.load_trial_from_checkpoint_path(str(ckpt))
    assert type(trial).__name__ == "LoadTrial"
    assert sys.modules[module] is other
