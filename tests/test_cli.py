"""det-launch's own arguments, through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import base_env

CLI = [sys.executable, "-m", "determined_launch"]


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=base_env(**env), capture_output=True, text=True, timeout=60
    )


def test_dry_run_prints_the_plan_and_masks_the_secret() -> None:
    r = run("--slots", "3", "--dry-run", "torch", "--nnodes", "1", "--", "train.py", "-x",
            DET_DIST_SECRET="topsecret-value-1234")
    assert r.returncode == 0, r.stderr
    assert "--nproc_per_node 3" in r.stdout
    assert "--nnodes 1 " in r.stdout and "train.py -x" in r.stdout
    assert "DET_DIST_SECRET=<secret>" in r.stdout
    assert "topsecret" not in r.stdout


def test_info_reports_detector_and_skipped_reasons() -> None:
    r = run("--slots", "2", "info", DET_INFO_DIR="/nonexistent")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["detector"] == "local"
    assert out["cluster_info"]["container_slot_counts"] == [2]
    skipped = {s["detector"]: s["reason"] for s in out["skipped"]}
    assert skipped["file"] == "DET_CLUSTER_INFO_FILE is not set"


def test_usage_errors_exit_2_with_one_line() -> None:
    for args, message in [
        (("--slots", "0", "torch", "x.py"), "--slots: expected an integer from 1 to 4096"),
        (("--preempt-signals", "NOPE", "torch", "x.py"), "unknown signal 'NOPE'"),
        (("torch",), "no command to run"),
        (("--detector", "nosuch", "info"), "unknown detector 'nosuch'"),
    ]:
        r = run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr
        assert "Traceback" not in r.stderr
    assert run("frobnicate").returncode == 2


def test_help_lists_every_command() -> None:
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--help"],
                       capture_output=True, text=True, env=base_env(), timeout=60, check=False)
    assert r.returncode == 0
    listed = [line.split()[0] for line in r.stdout.split("commands:\n")[1].splitlines()
              if line.startswith("  ") and line.split()]
    for command in ("torch", "horovod", "deepspeed", "exec", "info", "experiment",
                    "checkpoints", "ui"):
        assert command in listed, r.stdout
    # Commands with their own parser come first; after launcher options they are one line.
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--slots", "2",
                        "checkpoints", "list", "x"], capture_output=True, text=True,
                       env=base_env(), timeout=60, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "launcher options do not apply to checkpoints" in r.stderr
