"""Issue 23 item 1b: a rank that finished must not abort at interpreter exit.

The abort ("terminate called without an active exception", status 134):
a gloo worker thread releases a finished collective's Python tensors after
the rank moved on; at interpreter exit that release needs the GIL and kills
the process (see determined_launch/pytorch/_teardown.py). It cannot happen
once the group's destructor has joined gloo's threads, so these tests check
the mechanism deterministically: no gloo thread is left when teardown returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Launch, base_env, free_port_block

EXAMPLE = REPO / "examples" / "ddp_train.py"
SCRIPT = Path(__file__).resolve().parent / "pytorch_fixtures" / "teardown_script.py"

_COUNT_GLOO = """
import os
def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
    return sum("gloo" in n for n in names)
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _COUNT_GLOO + code], env=base_env(**env),
                          capture_output=True, text=True, timeout=120)


def test_ddp_example_leaves_no_gloo_thread(tmp_path: Path) -> None:
    """The README's example ends its group so that gloo's threads are joined
    before exit (the old one destroyed the group, yet its DDP model and
    torch.distributed.nn kept it, and 3 gloo threads, alive until exit)."""
    code = f"""
import runpy, sys
example = runpy.run_path({str(EXAMPLE)!r}, run_name="example")
sys.argv = ["ddp_train.py", "--epochs", "1", "--samples", "256"]
example["main"]()
print("gloo threads left:", gloo_threads())
"""
    done = _run(code, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port_block(1)), RANK="0",
                WORLD_SIZE="1", LOCAL_RANK="0")
    assert done.returncode == 0, done.stderr
    assert "done: world=1" in done.stdout
    assert "gloo threads left: 0" in done.stdout, done.stdout


def test_stale_default_group_is_released(tmp_path: Path) -> None:
    """torch.distributed.nn imported after init_process_group (DDP's constructor
    does) keeps the group as a default argument; release_stale_defaults() lets
    the destroyed group, and its threads, go."""
    code = f"""
import gc, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
import torch.distributed.nn.functional as F
from determined_launch.pytorch.loop.teardown import release_stale_defaults
dist.all_reduce(torch.ones(2))
dist.destroy_process_group(); gc.collect()
before = gloo_threads()
released = release_stale_defaults(); gc.collect()
print(before, released, gloo_threads(), F.all_reduce.__defaults__)
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    before, released, after = done.stdout.split()[:3]
    assert int(before) > 0 and int(released) > 0 and int(after) == 0, done.stdout


@pytest.mark.slow
def test_init_exit_ends_the_group_it_started(tmp_path: Path, launches: list[Launch]) -> None:
    """pytorch.init() started the group, so its exit ends it: every rank sees
    no group and no gloo thread afterwards, although the script still holds
    the DDP model (the old exit destroyed the group but left gloo's threads)."""
    launch = Launch([sys.executable, "-m", "determined_launch.cli", "--slots", "2", "torch",
                     "--", sys.executable, str(SCRIPT)],
                    base_env(DET_RUN_DIR=str(tmp_path / "run"),
                             DET_CHECKPOINT_STORAGE=str(tmp_path / "ckpt")))
    launches.append(launch)
    assert launch.wait(120) == 0, launch.stdout + launch.stderr
    lines = [json.loads(line.split("] ", 1)[-1]) for line in launch.stdout.splitlines()
             if '"gloo_threads"' in line]
    assert sorted(r["rank"] for r in lines) == [0, 1], launch.stdout
    for r in lines:
        assert r["ddp"] == "_DDP" and r["during"] > 0
        assert not r["initialized"] and r["gloo_threads"] == 0, r


def test_core_init_notes_a_clean_exit_only(tmp_path: Path) -> None:
    """core.init()'s clean exit leaves "rank-N.finished" in the launcher's status
    directory (what the summary below reads); an exception exit leaves none."""
    code = """
import determined_launch as det
with det.core.init():
    pass
try:
    with det.core.init():
        raise KeyError("x")
except KeyError:
    pass
"""
    status = tmp_path / "status"
    status.mkdir()
    done = _run(code, WRAP_RANK_STATUS_DIR=str(status), DET_RUN_DIR=str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in status.iterdir()) == ["rank-0.finished"]
    (status / "rank-0.finished").unlink()
    done = _run(code.replace("with det.core.init():\n    pass\n", ""),
                WRAP_RANK_STATUS_DIR=str(status), DET_RUN_DIR=str(tmp_path / "run"))
    assert done.returncode == 0 and not list(status.iterdir()), done.stderr


@pytest.mark.slow
def test_summary_names_a_finished_rank_killed_at_exit(tmp_path: Path,
                                                      launches: list[Launch]) -> None:
    """A rank whose core.init() exited cleanly and that then aborts (as gloo did
    at interpreter exit) is reported as having finished first."""
    script = tmp_path / "finish_then_abort.py"
    script.write_text(
        "import os\n"
        "import determined_launch as det\n"
        "from determined_launch.core import DistributedContext\n"
        "with det.core.init(distributed=DistributedContext.from_torch_distributed()) as ctx:\n"
        "    rank = ctx.distributed.rank\n"
        "if rank == 1:\n"
        "    os.abort()\n")
    launch = Launch([sys.executable, "-m", "determined_launch.cli", "--slots", "2", "torch",
                     "--", sys.executable, str(script)],
                    base_env(DET_RUN_DIR=str(tmp_path / "run")))
    launches.append(launch)
    assert launch.wait(120) == 134, launch.stdout + launch.stderr
    assert ("rank 1 on node 0 (127.0.0.1) had finished its work (core.init() exited cleanly) "
            "and then was killed by SIGABRT (status 134) first") in launch.stderr, launch.stderr
