"""Determined's module names in worker commands (issue 15, item 4):
``python3 -m determined.launch.X`` runs ours when the real ``determined`` is
not importable; any other ``import determined`` fails with a one-line hint;
a real installation wins; ``--no-determined-compat`` turns it off."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from determined_launch import compat
from determined_launch.backends import exec as exec_backend
from determined_launch.backends.plan import BackendArgs, JobRuntime
from determined_launch.cluster.info import ClusterInfo
from determined_launch.launch import config
from determined_launch.launch.launcher import LauncherOptions
from tests.conftest import WORKERS, Launch, base_env, exec_on_two_nodes

LAUNCHER = str(WORKERS / "det_compat_launcher.py")
PEER_SITE = sorted(glob.glob(os.path.expanduser(
    "~/.cache/det-peer-torch/lib/python3*/site-packages")))
PEER_PYTHON = os.path.expanduser("~/.cache/det-peer-torch/bin/python")


def test_compat_dir_goes_first_when_determined_is_missing() -> None:
    got = compat.worker_pythonpath({"PYTHONPATH": "/a:/b"}, enabled=True)
    assert got.split(os.pathsep) == [compat.COMPAT_DIR, "/a", "/b"]


def test_compat_dir_is_never_added_twice_and_removed_when_off() -> None:
    nested = {"PYTHONPATH": os.pathsep.join([compat.COMPAT_DIR, "/a"])}
    assert compat.worker_pythonpath(nested, enabled=True).split(os.pathsep) == [
        compat.COMPAT_DIR, "/a"]
    assert compat.worker_pythonpath(nested, enabled=False) == "/a"


def test_our_stand_in_is_not_a_real_determined() -> None:
    assert not compat.real_determined_importable([compat.COMPAT_DIR, *sys.path])


@pytest.mark.skipif(not PEER_SITE, reason="no side venv with determined")
def test_a_real_determined_is_found_behind_our_dir() -> None:
    assert compat.real_determined_importable([compat.COMPAT_DIR, PEER_SITE[0]])


def test_option_is_declared_with_its_variable() -> None:
    assert config.resolve({"DET_LAUNCH_NO_DETERMINED_COMPAT": "1"})["no_determined_compat"]
    assert LauncherOptions.from_env({}).determined_compat
    assert not LauncherOptions.from_env({"DET_LAUNCH_NO_DETERMINED_COMPAT": "yes"}
                                        ).determined_compat


def test_plan_passes_the_pythonpath_to_workers() -> None:
    runtime = JobRuntime(job_dir="/j", master_port=1, control_port=2, dist_port=3,
                         secret="s" * 32, python=sys.executable, pythonpath="/c:/a")
    info = ClusterInfo.from_mapping({"container_addrs": ["a"], "container_rank": 0,
                                     "container_slot_counts": [1]}, source="t", where="t")
    plan = exec_backend.build_plan(info, runtime, BackendArgs((), ("x",)))
    assert plan.env["PYTHONPATH"] == "/c:/a"


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_import_determined_outside_the_entry_points_names_the_fix() -> None:
    env = base_env(PYTHONPATH=os.pathsep.join([compat.COMPAT_DIR, base_env()["PYTHONPATH"]]))
    r = _run([sys.executable, "-c", "import determined"], env)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("ModuleNotFoundError: 'determined' is not")
    assert "import determined_launch as det" in last
    r = _run([sys.executable, "-m", "determined.core"], env)
    assert r.returncode == 1 and "import determined_launch as det" in r.stderr


@pytest.mark.slow
def test_tutorial_launcher_with_determined_module_names_on_two_nodes(
    tmp_path: Path, launches: list[Launch]
) -> None:
    nodes = exec_on_two_nodes(tmp_path, [sys.executable, LAUNCHER], launches)
    for node, launch in enumerate(reversed(nodes)):
        rank = 1 - node
        assert launch.wait(60) == 0, launch.stderr
        line = f"[rank={rank}] worker rank={rank} gathered=[0, 1] import determined: "
        assert line + "'determined' is not installed" in launch.stdout, launch.stdout
        assert launch.leftovers(settle=0.0) == []


def test_no_determined_compat_leaves_the_module_missing(tmp_path: Path) -> None:
    env = base_env()
    r = _run([sys.executable, "-m", "determined_launch.cli", "--no-determined-compat", "exec",
              "--", sys.executable, "-m", "determined.launch.wrap_rank", "0", "--", "true"], env)
    assert r.returncode == 1 and "No module named 'determined'" in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists(PEER_PYTHON), reason="no side venv with determined")
def test_a_real_determined_installation_wins() -> None:
    code = "import determined, os; print('real', determined.__file__, os.environ['PYTHONPATH'])"
    r = _run([PEER_PYTHON, "-m", "determined_launch.cli", "exec", "--", PEER_PYTHON, "-c", code],
             base_env())
    assert r.returncode == 0, r.stderr
    assert "real " + PEER_SITE[0] in r.stdout and compat.COMPAT_DIR not in r.stdout


def test_exec_keeps_the_commands_own_separator() -> None:
    """``exec -- CMD -- ARGS``: argparse drops the first ``--``; the second is CMD's."""
    from determined_launch.cli import _keep_separator, _parser

    argv = ["exec", "--", "python3", "-m", "determined.launch.torch_distributed", "--", "t.py"]
    ns = _parser().parse_args(argv)
    _keep_separator(argv, ns)
    assert ns.args == argv[1:]


@pytest.mark.slow
def test_determined_torch_distributed_entrypoint_runs_ours(tmp_path: Path) -> None:
    """A config's ``entrypoint: python3 -m determined.launch.torch_distributed -- ...``
    under ``det-launch exec``: the inner launcher takes the outer's resolved info."""
    code = "import determined_launch as det; print('trial', det.get_cluster_info().trial.hparams)"
    r = _run([sys.executable, "-m", "determined_launch.cli", "--hparams", '{"a": 1}', "exec",
              "--", sys.executable, "-m", "determined.launch.torch_distributed", "--",
              sys.executable, "-c", code], base_env())
    assert r.returncode == 0, r.stderr
    assert "[rank=0] trial {'a': 1}" in r.stdout
