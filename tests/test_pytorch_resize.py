"""Resuming a PyTorch trial on another world size keeps the math (issue 27 §2):
the same global batch, the same global sample stream, split differently."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from determined_launch import pytorch
from determined_launch.errors import InvalidExperimentException
from determined_launch.pytorch.data.batch_sizes import resize_check
from tests._pytorch_helpers import reports, run_trial
from tests.conftest import Launch, base_env
from tests.pytorch_fixtures import resize_script
from tests.pytorch_fixtures.resize_script import HPARAMS, SEED, StreamTrial, Targets


def _train(root: Path, batches: int, **fit: Any) -> float:
    trial, _ = run_trial(root, StreamTrial, hparams=HPARAMS, seed=SEED,
                         max_length=pytorch.Batch(batches), latest_checkpoint="latest",
                         checkpoint_policy="none", **fit)
    return float(trial.model.weight.data.flatten()[0])


def _newest_metadata(root: Path) -> dict[str, Any]:
    pointer = json.loads((root / "run" / "latest_checkpoint.json").read_text())
    return dict(pointer["metadata"])


# ---------------------------------------------------------------- pure parts


def _rank_batches(world: int, rank: int, done: int, n: int) -> list[list[int]]:
    """Rank ``rank``'s next ``n`` batches after ``done`` global batches of 8."""
    loader = pytorch.DataLoader(Targets(32), batch_size=8 // world, shuffle=True)
    torch_loader = loader.get_data_loader(repeat=True, skip=done, num_replicas=world,
                                          rank=rank, seed=SEED)
    batches = iter(torch_loader.batch_sampler)
    return [list(next(batches)) for _ in range(n)]


@pytest.mark.parametrize("slots", [1, 2, 4])
@pytest.mark.parametrize("done", [0, 3, 6, 9])
def test_each_rank_continues_its_share_of_the_same_global_batches(slots: int, done: int
                                                                  ) -> None:
    """After ``done`` global batches (on any world size), the ranks' next batches
    are the 1-process stream's next global batches split in rank order: nothing
    skipped, repeated or moved, across epoch ends (32 shuffled records, 4 global
    batches of 8 per epoch)."""
    uninterrupted = _rank_batches(1, 0, 0, done + 6)
    # each epoch is its own permutation of all 32 records
    assert sorted(i for b in uninterrupted[:4] for i in b) == list(range(32))
    assert uninterrupted[:4] != uninterrupted[4:8]
    ranks = [_rank_batches(slots, r, done, 6) for r in range(slots)]
    for step in range(6):
        assert [i for r in range(slots) for i in ranks[r][step]] == uninterrupted[done + step]


def test_resize_check_keeps_the_global_batch() -> None:
    assert resize_check(None, None, 2, 8) is None  # an older checkpoint: nothing known
    assert resize_check(2, 8, 2, 8) is None
    assert resize_check(2, 8, 1, 8) == (
        "resuming on 1 slot from a checkpoint taken on 2: global batch 8 → 8 per slot")
    assert resize_check(1, 8, 4, 8) == (
        "resuming on 4 slots from a checkpoint taken on 1: global batch 8 → 2 per slot")
    assert resize_check(2, None, 1, None) == "resuming on 1 slot from a checkpoint taken on 2"
    with pytest.raises(InvalidExperimentException) as e:
        resize_check(2, 8, 3, 8)
    assert str(e.value) == (
        "resuming on 3 slots from a checkpoint taken on 2: global_batch_size 8 does not "
        "divide over 3 slots, so the global batch would change; resume on a number of "
        "slots that divides 8")
    with pytest.raises(InvalidExperimentException, match=r"global batch of 6 \(global_batch_"
                       r"size over 3 slots\) but 2 slots would use 8"):
        resize_check(3, 6, 2, 8)


# ---------------------------------------------------------------- the loop


def test_resume_that_would_change_the_global_batch_stops_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint taken on 3 slots trained with global batch 6 (8 does not
    divide over 3: Determined's rule uses 2 per slot); 1 slot would use 8."""
    monkeypatch.chdir(tmp_path)
    _train(tmp_path, 2)
    pointer = json.loads((tmp_path / "run" / "latest_checkpoint.json").read_text())
    meta_file = tmp_path / "ckpt" / pointer["storage_id"] / "metadata.json"
    meta = json.loads(meta_file.read_text())
    assert (meta["world_size"], meta["global_batch_size"]) == (1, 8)
    meta_file.write_text(json.dumps({**meta, "world_size": 3, "global_batch_size": 6}))
    with pytest.raises(InvalidExperimentException) as e:
        _train(tmp_path, 4)
    assert "\n" not in str(e.value) and "global batch of 6" in str(e.value)
    assert "taken on 3" in str(e.value) and "would use 8" in str(e.value)


class ShortLastBatch(StreamTrial):
    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(
            Targets(20), batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )


def test_resume_on_another_world_size_warns_when_epochs_cut_differently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """20 records, global batch 8: the short last batch of each epoch is cut
    into per-slot batches differently on 1 slot than on 2, so the stream
    cannot stay the same, and the resume says why."""
    monkeypatch.chdir(tmp_path)
    run_trial(tmp_path, ShortLastBatch, hparams=HPARAMS, seed=SEED, max_length=pytorch.Batch(2),
              checkpoint_policy="none")
    pointer = json.loads((tmp_path / "run" / "latest_checkpoint.json").read_text())
    meta_file = tmp_path / "ckpt" / pointer["storage_id"] / "metadata.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "world_size": 2}))
    with caplog.at_level(logging.INFO, logger="determined_launch.pytorch"):
        run_trial(tmp_path, ShortLastBatch, hparams=HPARAMS, seed=SEED,
                  max_length=pytorch.Batch(3), latest_checkpoint="latest",
                  checkpoint_policy="none")
    assert "resuming on 1 slot from a checkpoint taken on 2: global batch 8 → 8 per slot" in (
        caplog.text)
    assert "20 records per epoch, not a multiple of the global batch 8" in caplog.text


SCRIPT = Path(resize_script.__file__)


@pytest.mark.slow
def test_one_slot_to_two_and_back_continue_the_same_stream(
    tmp_path: Path, launches: list[Launch], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1 process trains batches 0-5, 2 ranks (real torchrun, gloo, DDP) 6-9,
    1 process 10-13, each resuming mid-epoch: after every part the weight is
    the uninterrupted 1-process run's (within 1e-5; a skipped, repeated or
    shifted batch moves it by more than 3e-4)."""
    monkeypatch.chdir(tmp_path)
    _train(tmp_path / "ref", 14, validation_period=pytorch.Batch(1))
    expected = [r["metrics"]["weight"] for r in reports(tmp_path / "ref", "validation")]
    assert len(expected) == 14

    root = tmp_path / "resized"
    assert _train(root, 6) == pytest.approx(expected[5], abs=1e-5)

    env = base_env(DET_RUN_DIR=str(root / "run"), DET_CHECKPOINT_STORAGE=str(root / "ckpt"),
                   DET_CHECKPOINT_CODE="0")
    launch = Launch([sys.executable, "-m", "determined_launch.cli", "--slots", "2", "torch",
                     "--", sys.executable, str(SCRIPT), "10"], env)
    launches.append(launch)
    assert launch.wait(120) == 0, launch.stdout + launch.stderr
    out = re.sub(r"^\[rank=\d+\] ", "", launch.stdout + launch.stderr, flags=re.M)
    assert "resuming on 2 slots from a checkpoint taken on 1: global batch 8 → 4 per slot" in out
    finals = [json.loads(m) for m in re.findall(r"^(\{\"rank\".*\})$", out, re.M)]
    assert sorted(f["rank"] for f in finals) == [0, 1]
    for final in finals:
        assert final["weight"] == pytest.approx(expected[9], abs=1e-5)
    meta = _newest_metadata(root)
    assert (meta["steps_completed"], meta["world_size"], meta["global_batch_size"]) == (10, 2, 8)
    assert not launch.leftovers()

    with caplog.at_level(logging.INFO, logger="determined_launch.pytorch"):
        assert _train(root, 14) == pytest.approx(expected[13], abs=1e-5)
    assert "resuming on 1 slot from a checkpoint taken on 2: global batch 8 → 8 per slot" in (
        caplog.text)


def test_runner_resume_that_would_change_the_global_batch_exits_2_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m determined_launch.pytorch`` (legacy trials, experiment trials):
    the same check is a config error: one line, exit status 2, no traceback."""
    from determined_launch.pytorch import __main__ as runner_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DET_CLUSTER_INFO_FILE", raising=False)
    _train(tmp_path, 2)
    pointer = json.loads((tmp_path / "run" / "latest_checkpoint.json").read_text())
    ckpt = tmp_path / "ckpt" / pointer["storage_id"]
    meta_file = ckpt / "metadata.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "world_size": 3,
                                     "global_batch_size": 6}))
    (tmp_path / "c.yaml").write_text(
        "hyperparameters: {global_batch_size: 8}\n"
        "searcher: {name: single, metric: weight, max_length: {batches: 4}}\n")
    capsys.readouterr()
    status = runner_main.main(["--config", "c.yaml", "--latest-checkpoint", str(ckpt),
                               "tests.pytorch_fixtures.resize_script:StreamTrial"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m determined_launch.pytorch: error: invalid experiment: "
                           "resuming on 1 slot from a checkpoint taken on 3: "), last
    assert "global batch of 6" in last and "would use 8" in last
