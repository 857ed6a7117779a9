"""det-launch experiment runs Determined's legacy `entrypoint: model_def:Class` (the legacy runner
with the experiment's own config: before, the config was refused, and the suggested command
omitted --config so every trial failed in get_data_config()), and a failing trial shows how its
output ended; the same failure again with no progress is said once and not restarted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.test_search import experiment, trial_dirs

pytest.importorskip("optuna", reason="the [search] extra is not installed")
pytestmark = pytest.mark.slow

MODEL_DEF = '''
import torch
from determined_launch import pytorch


class Tiny(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.records = context.get_data_config()["records"]  # only the config has it
        self.model = context.wrap_model(torch.nn.Linear(1, 1, bias=False))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(),
                                                          lr=context.get_hparam("lr")))

    def _data(self):
        data = [(torch.ones(1), torch.ones(1))] * self.records
        return pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

    build_training_data_loader = build_validation_data_loader = _data

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
'''


def test_a_model_def_entrypoint_runs_with_the_experiments_config(tmp_path: Path) -> None:
    (tmp_path / "model_def.py").write_text(MODEL_DEF)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(json.dumps({
        "name": "legacy", "entrypoint": "model_def:Tiny", "data": {"records": 8},
        "hyperparameters": {"lr": 0.1, "global_batch_size": 4},
        "searcher": {"name": "single", "metric": "validation_loss",
                     "max_length": {"batches": 2}},
        "max_restarts": 0}))
    r = experiment(cfg, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trial 1: completed, validation_loss=" in r.stdout, r.stdout
    assert "ignoring Determined-only fields: data" not in r.stderr  # the runner reads it
    (trial,) = trial_dirs(tmp_path / "exp").values()
    steps = [json.loads(line)["steps_completed"]
             for line in (trial / "validation.jsonl").read_text().splitlines()]
    assert steps == [2]


def test_a_failure_shows_its_output_and_is_not_restarted_the_same_way(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('loading the data')\n"
                      "print(\"KeyError: 'n_filters1'\", file=sys.stderr)\nsys.exit(1)\n")
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(json.dumps({
        "name": "fails", "entrypoint": [sys.executable, str(script)],
        "searcher": {"name": "single", "metric": "loss"}, "max_restarts": 5}))
    r = experiment(cfg, timeout=120)
    assert r.returncode != 0
    out = r.stdout
    restart = out.index("trial 1: exit status 1; restart 1 of 5 from its last checkpoint; its "
                        "output")
    assert "  | KeyError: 'n_filters1'" in out[restart:restart + 1000], out
    assert "trial 1: exit status 1 again, at the same point as before its restart" in out
    assert "restart 2 of 5" not in out  # 2 launches, not 6
    assert out.count("trial 1: started") == 2, out
