"""The workers' shared resume: ``w`` and ``steps_completed`` from the
checkpoint the launcher hands them (``info.latest_checkpoint``), or a fresh
start; and the matching save (the chief's)."""

import json

import determined_launch as det


def restore(ctx: "det.core.Context", info: "det.ClusterInfo") -> "tuple[float, int]":
    """(w, steps_completed) to continue from."""
    if info.latest_checkpoint is None:
        return 0.0, 0
    with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
        state = json.loads((path / "state.json").read_text())
    return state["w"], state["steps_completed"]


def save(ctx: "det.core.Context", w: float, steps: int) -> None:
    """Commit a checkpoint holding ``w`` after ``steps`` steps."""
    with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, _):
        (path / "state.json").write_text(json.dumps({"w": w, "steps_completed": steps}))
