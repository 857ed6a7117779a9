"""``det-launch checkpoints list``: committed checkpoints by step, newest last."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from determined_launch import core
from determined_launch.cluster import ClusterInfo
from determined_launch.storage_cli import by_step
from tests.conftest import REPO, base_env


def test_list_orders_by_steps_completed(tmp_path: pathlib.Path) -> None:
    info = ClusterInfo(container_addrs=("127.0.0.1",), container_rank=0,
                       container_slot_counts=(1,), slot_ids=(0,), source="test")
    storage = tmp_path / "ck"
    ids = {}
    with core.init(info=info, run_dir=str(tmp_path / "run"),
                   checkpoint_storage=str(storage)) as ctx:
        for steps in (30, 5, 200, 12, 100, 7):  # uuids in another order (1 in 720 the same)
            with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, sid):
                (path / "w").write_text(str(steps))
            ids[sid] = steps
        with ctx.checkpoint.store_path({"note": "no steps"}) as (path, unnumbered):
            (path / "w").write_text("x")
    out = subprocess.run([sys.executable, "-m", "determined_launch.cli", "checkpoints", "list",
                          str(storage)], capture_output=True, text=True, env=base_env(),
                         cwd=REPO, timeout=60, check=True)
    listed = [line.split("\t")[0] for line in out.stdout.splitlines()]
    assert listed == [unnumbered] + sorted(ids, key=ids.__getitem__), out.stdout
    assert json.loads(out.stdout.splitlines()[-1].split("\t")[1]) == {"steps_completed": 200}


def test_by_step_ties_and_odd_metadata() -> None:
    rows = [("b", {"steps_completed": 2}), ("a", {"steps_completed": 2}),
            ("c", {"steps_completed": True}), ("d", {"steps_completed": 1.5}), ("e", {})]
    assert [sid for sid, _ in by_step(rows)] == ["c", "e", "d", "a", "b"]


def test_list_of_nothing_says_so_and_fails(tmp_path: pathlib.Path) -> None:
    """Was: no output and exit 0, the same as a listing a script could trust."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".partial-abc").mkdir()  # an interrupted save is not a checkpoint
    for path, status, said in [
        (tmp_path / "empty", 1, "no committed checkpoints in "),
        (tmp_path / "typo", 2, "typo: no such directory"),
    ]:
        r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "checkpoints", "list",
                            str(path)], capture_output=True, text=True, env=base_env(),
                           timeout=60)
        assert (r.returncode, r.stdout) == (status, ""), r.stderr
        assert r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert "1 leftover(s) of interrupted saves" in subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", "checkpoints", "list",
         str(tmp_path / "empty")], capture_output=True, text=True, env=base_env(),
        timeout=60).stderr
