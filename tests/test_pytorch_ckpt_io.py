"""Unit tests of the checkpoint file layer (determined_launch.pytorch.checkpoints.files).

Real torch files on disk; no mocks. The upstream-format cases build files the
way Determined 0.38.1 writes them (numpy array in np_rng_state, DDP-prefixed
keys, workload_sequencer.pkl), from the facts in spec section 4.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from determined_launch.errors import InvalidCheckpointException
from determined_launch.pytorch.checkpoints import files as ckio
from determined_launch.pytorch.checkpoints.code_copy import parse_ignore

# --- find_state_file ---------------------------------------------------------------


@pytest.mark.parametrize("name", ckio.STATE_FILE_CANDIDATES)
def test_find_state_file_each_candidate(tmp_path: Path, name: str) -> None:
    f = tmp_path / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(b"x")
    assert ckio.find_state_file(tmp_path) == f


def test_find_state_file_prefers_first_candidate(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    (tmp_path / "state_dict.pth").write_bytes(b"x")
    assert ckio.find_state_file(tmp_path).name == "state_dict.pth"


def test_find_state_file_missing_names_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidCheckpointException, match=str(tmp_path)):
        ckio.find_state_file(tmp_path)
    with pytest.raises(ckio.CheckpointFormatError, match="does not exist"):
        ckio.find_state_file(tmp_path / "nope")


# --- load_state / save_state (FIX-3) ------------------------------------------------


def _upstream_style_state() -> dict[str, Any]:
    """What Determined 0.38.1 puts in state_dict.pth: np_rng_state holds an ndarray."""
    return {
        "models_state_dict": [torch.nn.Linear(2, 1).state_dict()],
        "rng_state": {
            "cpu_rng_state": torch.random.get_rng_state(),
            "np_rng_state": np.random.get_state(),
            "random_rng_state": random.getstate(),
        },
        "callbacks": {"c": {"best": np.float64(0.5)}},
    }


def test_our_state_loads_with_plain_default_torch_load(tmp_path: Path) -> None:
    ckpt = {
        "rng_state": ckio.rng_state(),
        "models_state_dict": [torch.nn.Linear(2, 1).state_dict()],
    }
    ckio.save_state(ckpt, tmp_path)
    # torch>=2.6 defaults to weights_only=True: what users (and Determined) call.
    loaded = torch.load(tmp_path / "state_dict.pth")
    assert loaded["rng_state"]["np_rng_state"][0] == "MT19937"
    assert len(loaded["rng_state"]["np_rng_state"][1]) == 624


def test_upstream_state_fails_plain_torch_load_but_loads_with_allowlist(tmp_path: Path) -> None:
    torch.save(_upstream_style_state(), tmp_path / "state_dict.pth")
    with pytest.raises(pickle.UnpicklingError):  # upstream's FIX-3 defect, reproduced
        torch.load(tmp_path / "state_dict.pth")
    loaded = ckio.load_state(tmp_path, trusted=False)
    assert isinstance(loaded["rng_state"]["np_rng_state"][1], np.ndarray)
    assert float(loaded["callbacks"]["c"]["best"]) == 0.5


class _Custom:
    def __init__(self, v: int) -> None:
        self.v = v


def test_untrusted_custom_object_refused_with_fix(tmp_path: Path) -> None:
    torch.save({"x": _Custom(3)}, tmp_path / "state_dict.pth")
    with pytest.raises(ckio.CheckpointFormatError, match="weights_only': False"):
        ckio.load_state(tmp_path, trusted=False)


def test_trusted_custom_object_falls_back_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.save({"x": _Custom(3)}, tmp_path / "state_dict.pth")
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        loaded = ckio.load_state(tmp_path, trusted=True)
    assert loaded["x"].v == 3
    assert "weights_only=False" in caplog.text


def test_user_weights_only_wins(tmp_path: Path) -> None:
    torch.save({"x": _Custom(4)}, tmp_path / "state_dict.pth")
    assert ckio.load_state(tmp_path, trusted=False, weights_only=False)["x"].v == 4
    with pytest.raises(pickle.UnpicklingError):  # explicit True: no fallback even if trusted
        ckio.load_state(tmp_path, trusted=True, weights_only=True)


def test_load_state_accepts_file_path(tmp_path: Path) -> None:
    f = ckio.save_state({"a": torch.ones(2)}, tmp_path / "other.pt")
    assert torch.equal(ckio.load_state(f, trusted=False)["a"], torch.ones(2))


# --- rng ----------------------------------------------------------------------------


def _draw() -> tuple[float, int, float]:
    return float(np.random.rand()), random.randint(0, 10**9), float(torch.rand(1))


def test_rng_roundtrip_through_file(tmp_path: Path) -> None:
    np.random.seed(1)
    random.seed(2)
    torch.manual_seed(3)
    ckio.save_state({"rng_state": ckio.rng_state()}, tmp_path)
    expected = [_draw() for _ in range(3)]
    np.random.seed(99)
    random.seed(99)
    torch.manual_seed(99)
    ckio.restore_rng_state(torch.load(tmp_path / "state_dict.pth")["rng_state"])
    assert [_draw() for _ in range(3)] == expected


def test_restore_upstream_ndarray_rng_state() -> None:
    state = _upstream_style_state()["rng_state"]
    expected = _draw()
    ckio.restore_rng_state(state)
    assert _draw() == expected


def test_restore_rng_missing_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        ckio.restore_rng_state(None)
    assert "The checkpoint has no random state to restore." in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU warning")
def test_restore_rng_gpu_state_without_gpu_warns(caplog: pytest.LogCaptureFixture) -> None:
    state = dict(ckio.rng_state(), gpu_rng_state=torch.zeros(8, dtype=torch.uint8))
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        ckio.restore_rng_state(state)
    assert "gpu_rng_state in checkpoint but the system has no gpu" in caplog.text


# --- model state (FIX-4) ----------------------------------------------------------


class _DDPLike(torch.nn.parallel.DistributedDataParallel):
    """A DDP instance without a process group: enough for state_dict key layout."""

    def __init__(self, module: torch.nn.Module) -> None:  # noqa: D107
        torch.nn.Module.__init__(self)
        self.module = module


def test_model_state_for_save_strips_ddp_prefix() -> None:
    inner = torch.nn.Linear(3, 2)
    wrapped = _DDPLike(inner)
    assert list(wrapped.state_dict()) == ["module.weight", "module.bias"]  # upstream saves this
    assert list(ckio.model_state_for_save(wrapped)) == ["weight", "bias"]
    assert list(ckio.model_state_for_save(inner)) == ["weight", "bias"]


@pytest.mark.parametrize("saved_ddp", [False, True])
@pytest.mark.parametrize("target_ddp", [False, True])
def test_load_model_state_any_combination(saved_ddp: bool, target_ddp: bool) -> None:
    src = torch.nn.Linear(3, 2)
    with torch.no_grad():
        src.weight.fill_(0.25)
    state = (_DDPLike(src) if saved_ddp else src).state_dict()
    dst_inner = torch.nn.Linear(3, 2)
    dst = _DDPLike(dst_inner) if target_ddp else dst_inner
    ckio.load_model_state(dst, state)
    assert torch.equal(dst_inner.weight, torch.full((2, 3), 0.25))


def test_load_model_state_mismatch_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="size mismatch"):
        ckio.load_model_state(torch.nn.Linear(3, 2), torch.nn.Linear(4, 2).state_dict())


def test_load_model_state_does_not_mutate_input() -> None:
    state = _DDPLike(torch.nn.Linear(1, 1)).state_dict()
    ckio.load_model_state(torch.nn.Linear(1, 1), state)
    assert list(state) == ["module.weight", "module.bias"]


# --- trial_state.pkl ----------------------------------------------------------------


STATE = {
    "trial_id": 7,
    "last_ckpt": 6,
    "step_id": 0,
    "last_val": 3,
    "batches_trained": 6,
    "epochs_trained": 1,
}


def test_trial_state_roundtrip_and_plain_pickle(tmp_path: Path) -> None:
    ckio.write_trial_state(tmp_path, STATE)
    assert ckio.read_trial_state(tmp_path) == STATE
    # Determined reads it with plain pickle.load into _TrialState(**state).
    with open(tmp_path / "trial_state.pkl", "rb") as f:
        assert pickle.load(f) == STATE


def test_trial_state_missing_returns_none(tmp_path: Path) -> None:
    assert ckio.read_trial_state(tmp_path) is None


class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("echo pwned",))


def test_trial_state_refuses_classes(tmp_path: Path) -> None:
    (tmp_path / "trial_state.pkl").write_bytes(pickle.dumps({"trial_id": _Evil()}))
    with pytest.raises(ckio.CheckpointFormatError, match="refusing to unpickle"):
        ckio.read_trial_state(tmp_path)


def test_trial_state_non_dict_rejected(tmp_path: Path) -> None:
    (tmp_path / "trial_state.pkl").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ckio.CheckpointFormatError, match="expected a dict"):
        ckio.read_trial_state(tmp_path)


@pytest.mark.parametrize(
    "legacy,expected_batches",
    [
        ({"trial_id": 1, "last_ckpt": 1, "steps_completed": 1, "step_id": 1, "last_val": 0}, 1),
        ({"trial_id": 526, "last_ckpt": 5, "latest_batch": 5, "step_id": 1, "last_val": 0}, 5),
    ],
)
def test_legacy_workload_sequencer(tmp_path: Path, legacy: dict, expected_batches: int) -> None:
    (tmp_path / "workload_sequencer.pkl").write_bytes(pickle.dumps(legacy, protocol=4))
    got = ckio.read_trial_state(tmp_path, epoch_len=2)
    assert got is not None
    assert got["trial_id"] == legacy["trial_id"]
    assert got["batches_trained"] == expected_batches
    assert got["epochs_trained"] == expected_batches // 2
    assert got["last_ckpt"] == legacy["last_ckpt"]


# --- load_data.json (FIX-5) ---------------------------------------------------------


class OneTrial:
    pass


def test_load_data_roundtrip_keeps_hparams_without_config(tmp_path: Path) -> None:
    written = ckio.write_load_data(tmp_path, OneTrial, {"lr": 0.1}, None)
    raw = json.loads((tmp_path / "load_data.json").read_text())
    assert raw == written
    assert raw["hparams"] == {"lr": 0.1}  # upstream writes null here (FIX-5)
    assert raw["trial_cls_spec"] == f"{__name__}:OneTrial"
    assert raw["is_trainer"] is True and "trial_in_main" not in raw
    got = ckio.read_load_data(tmp_path)
    assert got["hparams"] == {"lr": 0.1} and got["is_trainer"] and not got["legacy_metadata"]


def test_load_data_legacy_runner_omits_is_trainer(tmp_path: Path) -> None:
    ckio.write_load_data(tmp_path, OneTrial, {"a": 1}, {"entrypoint": "x:Y"}, is_trainer=False)
    raw = json.loads((tmp_path / "load_data.json").read_text())
    assert "is_trainer" not in raw and raw["experiment_config"] == {"entrypoint": "x:Y"}
    assert ckio.read_load_data(tmp_path)["is_trainer"] is False


def test_trial_in_main_gets_importable_module(tmp_path: Path) -> None:
    """A class defined in the entry script is recorded as <script module>:Cls."""
    code = tmp_path / "proj"
    (code / "sub").mkdir(parents=True)
    (code / "sub" / "train.py").write_text(
        textwrap.dedent(
            """
            import sys
            from determined_launch.pytorch.checkpoints import files as ckio
            class MyTrial:
                pass
            print(ckio.trial_cls_spec(MyTrial, sys.argv[1]))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(Path(ckio.__file__).parents[2]))
    out = subprocess.run(
        [sys.executable, "sub/train.py", str(code)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "('sub.train:MyTrial', True)"
    out = subprocess.run(
        [sys.executable, "-m", "sub.train", str(code)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "('sub.train:MyTrial', True)"


def test_read_load_data_from_old_metadata(tmp_path: Path) -> None:
    (tmp_path / "metadata.json").write_text(
        json.dumps(
            {
                "framework": "torch-1.4",
                "hparams": {"h": 1},
                "experiment_config": {"entrypoint": "model_def:T"},
            }
        )
    )
    got = ckio.read_load_data(tmp_path)
    assert got["trial_cls_spec"] == "model_def:T" and got["legacy_metadata"]
    assert got["hparams"] == {"h": 1} and got["is_trainer"] is False


def test_read_load_data_missing_is_clear(tmp_path: Path) -> None:
    # Our own metadata.json (from core store_path) has no experiment_config.
    (tmp_path / "metadata.json").write_text(json.dumps({"steps_completed": 3}))
    with pytest.raises(AssertionError, match="no load_data.json"):
        ckio.read_load_data(tmp_path)
    (tmp_path / "load_data.json").write_text("{nope")
    with pytest.raises(InvalidCheckpointException, match="unreadable"):
        ckio.read_load_data(tmp_path)


# --- code/ copy (FIX-14) ------------------------------------------------------------


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_copy_code_excludes_storage_rundir_and_defaults(tmp_path: Path) -> None:
    src = tmp_path / "work"
    for rel in [
        "train.py",
        "pkg/model.py",
        "pkg/__pycache__/model.cpython-311.pyc",
        ".git/HEAD",
        "runs/events",
        "det_runs/checkpoints/abc/state_dict.pth",
        "det_runs/run/training.jsonl",
        "det_runs/other-run/tensorboard/events",
        "sub/det_runs/kept.py",
        "store/ckpts/abc/state_dict.pth",
        "store/run/validation.jsonl",
        "store/other.py",
        "data/big.bin",
        "notes.txt",
        "x.pyc",
    ]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    (src / ".detignore").write_text("# comment\ndata/\n*.txt\n!keep.txt\n")
    (src / "keep.txt").write_text("k")
    # Storage and run directory given explicitly (not under ./det_runs, which is
    # ignored by default); the destination lies inside the storage, inside the source.
    dst = src / "store" / "ckpts" / "new" / "code"
    stats = ckio.copy_code(src, dst, exclude=[src / "store" / "ckpts", src / "store" / "run"])
    assert _tree(dst) == {
        "train.py",
        "pkg",
        "pkg/model.py",
        "keep.txt",
        "sub",
        "sub/det_runs",
        "sub/det_runs/kept.py",
        "store",
        "store/other.py",
    }
    assert stats.files == 5 and stats.skipped_reason is None


def test_copy_code_leaves_out_the_default_experiment_and_run_directories(tmp_path: Path
                                                                        ) -> None:
    # A model directory that ran `det-launch experiment` holds every trial's checkpoints.
    src = tmp_path / "model"
    for rel in ["model_def.py", "det_experiments/exp/trials/1/output.log",
                "det_experiments/exp/checkpoints/abc/state_dict.pth", "det_runs/local/x.jsonl"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    stats = ckio.copy_code(src, tmp_path / "code")
    assert _tree(tmp_path / "code") == {"model_def.py"} and stats.files == 1


def test_copy_code_never_follows_symlinks(tmp_path: Path) -> None:
    src = tmp_path / "work"
    src.mkdir()
    (src / "a.py").write_text("a")
    (src / "loop").symlink_to(src)  # would recurse forever if followed
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (src / "ext").symlink_to(outside)
    dst = tmp_path / "dst"
    stats = ckio.copy_code(src, dst)
    assert (dst / "loop").is_symlink() and (dst / "ext").is_symlink()
    assert not (dst / "ext").resolve() == dst / "ext"
    assert _tree(dst) == {"a.py", "loop", "ext"}
    assert stats.links == 2 and stats.files == 1


def test_copy_code_size_cap_copies_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "work"
    src.mkdir()
    (src / "big.bin").write_bytes(b"0" * 3 * 1024 * 1024)
    monkeypatch.setenv("DET_CHECKPOINT_CODE_MAX_MB", "1")
    with caplog.at_level(logging.WARNING, logger="determined_launch.pytorch"):
        stats = ckio.copy_code(src, tmp_path / "dst")
    assert stats.skipped_reason and "over the 1.0 MiB limit" in stats.skipped_reason
    assert not (tmp_path / "dst").exists()
    assert ".detignore" in caplog.text


def test_copy_code_disabled_by_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.py").write_text("a")
    monkeypatch.setenv("DET_CHECKPOINT_CODE", "0")
    stats = ckio.copy_code(tmp_path, tmp_path / "dst")
    assert stats.skipped_reason == "DET_CHECKPOINT_CODE=0" and not (tmp_path / "dst").exists()


def test_copy_code_skips_uncopyable(tmp_path: Path) -> None:
    """A file that cannot be copied (here a named pipe, which also defeats root's
    permissions) is left out with a warning instead of failing the checkpoint."""
    src = tmp_path / "work"
    src.mkdir()
    (src / "ok.py").write_text("a")
    os.mkfifo(src / "locked")
    stats = ckio.copy_code(src, tmp_path / "dst")
    assert stats.unreadable == ["locked"] and stats.files == 1


@pytest.mark.parametrize(
    "pattern,rel,is_dir,ignored",
    [
        ("data/", "data", True, True),
        ("data/", "data", False, False),
        ("data/", "a/data", True, True),
        ("/data", "a/data", True, False),
        ("a/b", "a/b", False, True),
        ("a/b", "x/a/b", False, False),
        ("**/cache", "x/y/cache", True, True),
        ("*.ckpt", "deep/m.ckpt", False, True),
    ],
)
def test_ignore_patterns(pattern: str, rel: str, is_dir: bool, ignored: bool) -> None:
    from determined_launch.pytorch.checkpoints.code_copy import _ignored

    assert _ignored(parse_ignore([pattern]), rel, is_dir) is ignored
