"""det-launch's own arguments, through the real console entry point."""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import subprocess
import sys

import pytest

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
        (("--detector", "nosuch", "info"), "--detector: expected one of file, determined"),
        (("--disable-detector", "local", "--disable-detector", "nosuch", "info"),
         "--disable-detector: expected one of file, determined"),
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


def test_subcommand_help_starts_nothing(tmp_path: pathlib.Path) -> None:
    """``det-launch torch --help`` used to launch ``--help`` as the script (exit 127)."""
    for args in (["torch", "--help"], ["exec", "--help"], ["--slots", "2", "horovod", "-h"],
                 ["deepspeed", "--nnodes", "1", "--help", "--", "x.py"],
                 ["experiment", "exp.yaml", "torch", "--help"]):  # not --help in every trial
        r = subprocess.run([*CLI, *args], env=base_env(), cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, (args, r.stderr)
        sub = next(a for a in args if a in ("torch", "exec", "horovod", "deepspeed"))
        assert r.stdout.startswith(f"usage: det-launch [LAUNCHER OPTIONS] {sub} "), r.stdout
        assert "[rank=" not in r.stdout + r.stderr and not list(tmp_path.iterdir()), args
    r = subprocess.run([sys.executable, "-m", "determined_launch.torch_distributed", "--help"],
                       env=base_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "python -m determined_launch.torch_distributed" in r.stdout


def test_help_after_the_separator_is_the_scripts() -> None:
    r = run("exec", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--help",
            DET_LAUNCH_SLOTS="1")
    assert r.returncode == 0, r.stderr
    assert "['--help']" in r.stdout


def test_version_is_the_packages() -> None:
    import determined_launch

    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"det-launch {determined_launch.__version__}"
    assert determined_launch.__version__ == importlib.metadata.version("determined_launch")


def test_launcher_words_typos_and_misplaced_options_are_one_line() -> None:
    for args, message in [
        (("--slotz", "2", "torch", "--", "x.py"), "unknown launcher option --slotz (did you mean "
                                                  "--slots?)"),
        (("tourch", "--", "x.py"), "unknown command 'tourch' (did you mean torch?)"),
        (("torch", "--slots", "2", "--", "x.py"), "--slots is a launcher option: put it before "
                                                  "the subcommand (det-launch --slots N torch"),
        # horovodrun would have taken it as its --slots-per-host
        (("horovod", "--slots=2", "--", "x.py"), "--slots is a launcher option"),
        (("exec", "--dry-run", "--", "true"), "--dry-run is a launcher option"),
        (("exec",), "usage: det-launch [LAUNCHER OPTIONS] exec -- CMD..."),
        (("info", "extra"), "info takes no arguments"),
    ]:
        r = run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and message in r.stderr, (args, r.stderr)
    # a launcher flag that torchrun has too stays torchrun's
    r = run("--dry-run", "torch", "--max-restarts", "3", "--", "x.py")
    assert r.returncode == 0 and "--max-restarts 3" in r.stdout, r.stderr


def test_experiment_status_takes_a_name_or_id(tmp_path: pathlib.Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``det-launch experiment --status NAME`` finds it in the experiments root (was:
    "not an experiment directory" unless given the directory)."""
    from determined_launch.errors import LaunchError
    from determined_launch.experiment.cli import status_dir

    exp = tmp_path / "root" / "mnist-search"
    exp.mkdir(parents=True)
    (exp / "experiment.json").write_text("{}")
    monkeypatch.setenv("DET_EXPERIMENTS_DIR", str(tmp_path / "root"))
    monkeypatch.chdir(tmp_path)
    assert status_dir("mnist-search") == exp
    assert status_dir("1") == exp  # the root's first id
    assert status_dir(str(exp)) == exp
    with pytest.raises(LaunchError, match="--status nope: not an experiment directory, and no "
                                          "experiment 'nope' in "):
        status_dir("nope")
