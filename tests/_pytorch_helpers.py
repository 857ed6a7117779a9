"""Shared plumbing for the det.pytorch tests: run a trial in-process with a
private run directory and checkpoint storage, and read back what it reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from determined_launch import pytorch
from determined_launch.core._rundir import read_jsonl
from tests.pytorch_fixtures.onevar import HPARAMS, OneVarTrial


def run_trial(
    root: Path,
    trial_cls: type = OneVarTrial,
    *,
    hparams: Optional[dict[str, Any]] = None,
    seed: int = 777,
    aggregation_frequency: int = 1,
    run: str = "run",
    trial_kwargs: Optional[dict[str, Any]] = None,
    **fit_kwargs: Any,
) -> tuple[Any, Any]:
    """One ``init`` + ``Trainer.fit``; returns (trial, trainer)."""
    with pytorch.init(
        hparams=dict(hparams or HPARAMS),
        seed=seed,
        aggregation_frequency=aggregation_frequency,
        run_dir=str(root / run),
        checkpoint_storage=str(root / "ckpt"),
    ) as ctx:
        trial = trial_cls(ctx, **(trial_kwargs or {}))
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(**fit_kwargs)
    return trial, trainer


def reports(root: Path, stream: str, run: str = "run") -> list[dict[str, Any]]:
    path = root / run / f"{stream}.jsonl"
    return read_jsonl(path) if path.exists() else []


def batch_metrics(root: Path, run: str = "run") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in reports(root, "training", run):
        out.extend(r["batch_metrics"])
    return out


def checkpoints(root: Path) -> dict[int, Path]:
    """Committed checkpoints in ``root/ckpt`` by ``steps_completed`` (newest wins)."""
    import json

    out: dict[int, tuple[float, Path]] = {}
    for meta in (root / "ckpt").glob("*/metadata.json"):
        steps = int(json.loads(meta.read_text())["steps_completed"])
        mtime = meta.stat().st_mtime
        if steps not in out or out[steps][0] < mtime:
            out[steps] = (mtime, meta.parent)
    return {k: v[1] for k, v in sorted(out.items())}
