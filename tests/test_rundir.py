"""The run directory's one owner (determined_launch/rundir.py): its identity
(the command), THE newest-committed-checkpoint rule, and the one live job's
lease. Unit tests of the pure rules, then three short real-process checks:
another command never resumes (issue 33 §2.3), a checkpoint without its
marker is skipped and named on directory and S3 storage (issue 34 §10), and a
second job on a run directory is refused while a killed one's lease is not in
the way (issue 35 §0.1)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from determined_launch import rundir
from determined_launch.launch import run_lease
from tests.conftest import base_env

# --- identity --------------------------------------------------------------------


def test_the_command_is_the_program(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.py").write_text("")
    a = (str(tmp_path / "a.py"),)
    assert rundir.command_of(["python3", "-u", "a.py", "--lr", "1"], tmp_path) == a
    assert rundir.command_of([sys.executable, "./a.py"], tmp_path) == a
    assert rundir.command_of(["a.py", "--batches", "600"], tmp_path) == a  # a bare sys.argv
    assert rundir.command_of(["bash", "-e", "b.sh", "x"], tmp_path) == ("b.sh",)
    assert rundir.command_of(["python", "-m", "pkg.train", "x"]) == ("-m", "pkg.train")
    assert rundir.command_of(["python", "-c", "print(1)"]) == ("-c",)
    assert rundir.command_key(a) != rundir.command_key(["b.py"])
    assert rundir.show(["a b.py", "\x1b[2J"]) == "'a b.py' '\\x1b[2J'"


def test_the_default_run_directory_belongs_to_one_command(tmp_path: pathlib.Path) -> None:
    a, b = ("a.py",), ("train/b.py", "--x", "1")
    shared = tmp_path / "det_runs" / "local"
    assert rundir.default_run_dir("local", b, tmp_path) == shared  # free
    shared.mkdir(parents=True)
    assert rundir.default_run_dir("local", b, tmp_path) == shared  # from before commands
    rundir.record_command(shared, a)
    assert rundir.default_run_dir("local", a, tmp_path) == shared
    own = rundir.default_run_dir("local", b, tmp_path)
    assert own.parent == shared.parent and own.name == f"local-b-{rundir.command_key(b)[:8]}"
    assert rundir.default_run_dir("trial-3", b, tmp_path).name.startswith("trial-3")
    (shared / rundir.COMMAND_FILE).write_text("[not json")  # unreadable: nobody's
    assert rundir.default_run_dir("local", b, tmp_path) == shared


def test_identity_matches_the_same_trial_hparams_and_command() -> None:
    me = rundir.Identity(0, True, {"lr": 1}, "k1")
    assert me.matches({})  # written before any of them was recorded
    assert me.matches({"trial_id": None, "hparams": {"lr": 1}, "command": "k1"})
    assert not me.matches({"command": "k2"})
    assert not me.matches({"hparams": {"lr": 2}})
    assert not me.matches({"trial_id": 4})
    assert rundir.Identity().matches({"trial_id": 4, "command": "k2"})  # any


# --- the newest committed checkpoint ---------------------------------------------------


def _log(*entries: Any) -> list[dict[str, Any]]:
    return [e if isinstance(e, dict) else {"storage_id": e[0], "steps_completed": e[1]}
            for e in entries]


def test_the_newest_committed_one_wins_and_newer_ones_are_named() -> None:
    log = _log(("c10", 10), ("c20", 20), ("c30", 30), ("c33", 33))
    pointer = {"storage_id": "c33", "metadata": {"steps_completed": 33}}
    cands = rundir.candidates(pointer, log, rundir.Identity())
    assert cands == [("c33", 33), ("c30", 30), ("c20", 20), ("c10", 10)]
    resume = rundir.newest_of(cands, lambda sid: sid != "c33")
    assert (resume.storage_id, resume.steps, resume.skipped) == ("c30", 30, ("c33",))
    assert "c33" in resume.skipped_line() and "resuming from c30" in resume.skipped_line()
    none = rundir.newest_of(cands, lambda sid: False)
    assert none.storage_id is None and "none older is committed" in none.skipped_line()
    assert rundir.newest_of(cands, lambda sid: True).skipped_line() == ""


def test_candidates_pending_first_deletes_and_other_runs_left_out() -> None:
    log = _log(("c1", 1), {"storage_id": "x", "command": "other"}, ("c2", 2), {"deleted": "c2"},
               ("../etc", 3), ("c3", 3))
    pointer = {"storage_id": "c3", "pending": "c4", "command": "mine"}
    cands = rundir.candidates(pointer, log, rundir.Identity(command="mine"))
    assert [sid for sid, _ in cands] == ["c4", "c3", "c1"]
    # another command's pointer: only the log's own records count
    assert [sid for sid, _ in rundir.candidates(pointer, log, rundir.Identity(command="x"))
            ] == ["c3", "c1"]


def test_the_log_is_read_as_untrusted(tmp_path: pathlib.Path) -> None:
    lines = ['{"storage_id": "a"}', "[" * 100_000, "not json", '{"storage_id": "b"', "7",
             '{"storage_id": "c"}']
    (tmp_path / rundir.CHECKPOINT_LOG_FILE).write_text("\n".join(lines))
    assert [r["storage_id"] for r in rundir.read_log(tmp_path)] == ["a", "c"]
    (tmp_path / rundir.POINTER_FILE).symlink_to("/etc/passwd")
    resume = rundir.newest_committed(tmp_path, rundir.Identity(), lambda sid: True)
    assert resume.storage_id == "c"  # the symlinked pointer is not followed


# --- the lease -------------------------------------------------------------------------


def test_lease_verdicts() -> None:
    def v(record: Any, age: float, alive: bool = True) -> str:
        return run_lease.lease_verdict(record, age, "h1", "me", lambda pid: alive)

    theirs_here = {"job": "them", "host": "h1", "pid": 42}
    theirs_there = {"job": "them", "host": "h2", "pid": 42}
    assert v(None, 0) == run_lease.FREE
    assert v({"job": "me", "host": "h2", "pid": 1}, 1) == run_lease.MINE  # a node of this job
    assert v(theirs_here, 1) == run_lease.HELD
    assert v(theirs_here, 1, alive=False) == run_lease.WAIT  # SIGKILLed: free in a moment
    assert v(theirs_here, run_lease.MISSED + 1, alive=False) == run_lease.FREE
    assert v(theirs_there, 1) == run_lease.HELD
    assert v(theirs_there, run_lease.MISSED + 1) == run_lease.WAIT
    assert v(theirs_there, run_lease.STALE + 1) == run_lease.FREE
    # a launcher started by a job's worker (launch_per_slot as a trial's entrypoint) runs
    # inside that job: the holder is its ancestor on this host; never one on another host
    inside = run_lease.lease_verdict(theirs_here, 1, "h1", "me", lambda pid: True,
                                     lambda pid: pid == 42)
    assert inside == run_lease.MINE
    assert run_lease.lease_verdict(theirs_there, 1, "h1", "me", lambda pid: True,
                                   lambda pid: pid == 42) == run_lease.HELD


def test_the_ancestor_check_sees_our_parents_only() -> None:
    assert run_lease._is_ancestor(os.getppid())
    assert not run_lease._is_ancestor(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert not run_lease._is_ancestor(child.pid)
    finally:
        child.kill()
        child.wait()


def test_job_keys_are_shared_by_the_nodes_of_one_job() -> None:
    shape = (("10.0.0.1", "10.0.0.2"), (1, 1))
    assert run_lease.job_key("s", {}) == run_lease.job_key("s", {"SLURM_JOB_ID": "9"})
    nodes = run_lease.job_key(None, {}, shape, lone=False)
    assert nodes == run_lease.job_key(None, {}, shape, lone=False)
    assert run_lease.job_key(None, {}) != run_lease.job_key(None, {})  # a lone launcher: its own
    slurm = {"SLURM_JOB_ID": "9"}
    assert run_lease.job_key(None, slurm, shape) == run_lease.job_key(None, slurm, shape)


def test_a_second_job_is_refused_and_the_same_job_shares(tmp_path: pathlib.Path) -> None:
    first = run_lease.Lease(tmp_path / "run", "job-1", "a.py")
    first.acquire()
    try:
        with pytest.raises(run_lease.LeaseHeld, match=r"in use by another job \(a\.py, launcher"):
            run_lease.Lease(tmp_path / "run", "job-2").acquire(wait=0)
        node = run_lease.Lease(tmp_path / "run", "job-1")
        node.acquire(wait=0)
        node.release(remove=False)
        assert (tmp_path / "run" / rundir.LEASE_FILE).is_file()
    finally:
        first.release()
    assert not (tmp_path / "run" / rundir.LEASE_FILE).exists()
    run_lease.Lease(tmp_path / "run", "job-2").acquire(wait=0)


# --- real processes -----------------------------------------------------------------

#: a Core API script: says where it resumes, then commits checkpoints at $STEPS
#: (not arguments: they are part of the command, and only the same command resumes)
SAVE = """
import os
from determined_launch import core
with core.init() as ctx:
    print("resume", ctx.info.latest_checkpoint, ctx.checkpoint.latest(), flush=True)
    for steps in map(int, os.environ.get("STEPS", "").split()):
        with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, sid):
            (path / "w").write_text(str(steps))
        print("saved", steps, sid, flush=True)
"""


def _run(argv: list[str], cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, cwd=cwd, env=base_env(**env), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def _exec(script: str, cwd: pathlib.Path, steps: str = "") -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "determined_launch.cli", "exec", "--", sys.executable,
                 script], cwd, STEPS=steps)


def _resumed(r: subprocess.CompletedProcess[str]) -> list[str]:
    return next(line.split()[1:] for line in r.stdout.splitlines() if line.startswith("resume"))


def _saved(r: subprocess.CompletedProcess[str]) -> dict[int, str]:
    return {int(p[1]): p[2] for p in (line.split() for line in r.stdout.splitlines())
            if p[0] == "saved"}


@pytest.mark.slow
def test_another_command_in_the_same_directory_does_not_resume(tmp_path: pathlib.Path) -> None:
    """Issue 33 §2.3: ``det-launch exec -- python b.py`` where ``a.py`` ran."""
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(SAVE)
    a = _saved(_exec("a.py", tmp_path, "5"))[5]
    b = _exec("b.py", tmp_path, "7")
    assert _resumed(b) == ["None", "None"], b.stdout  # not a.py's checkpoint
    again = _exec("a.py", tmp_path)
    assert _resumed(again) == [a, a]
    line = next(x for x in again.stderr.splitlines() if "info.latest_checkpoint is" in x)
    assert f"{a} (steps_completed 5)" in line and "`a.py`" in line, again.stderr
    assert _resumed(_exec("b.py", tmp_path)) == [_saved(b)[7]] * 2


def _s3_env(tmp_path: pathlib.Path, s3_server: Any) -> tuple[dict[str, str], Any]:
    yaml = pytest.importorskip("yaml")
    pytest.importorskip("s3fs")
    bucket = s3_server.new_bucket()
    block = tmp_path / "storage.yaml"
    block.write_text(yaml.safe_dump(s3_server.block(bucket)))

    def unmark(sid: str) -> None:
        s3_server.client().delete_object(Bucket=bucket, Key=f"exp/{sid}/{rundir.METADATA_FILE}")

    return {"DET_CHECKPOINT_STORAGE": str(block)}, unmark


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["directory", "s3"])
def test_a_checkpoint_without_its_marker_is_skipped_and_named(
        tmp_path: pathlib.Path, storage: str, request: pytest.FixtureRequest) -> None:
    """Issue 34 §10: committed at 10, 20, 30, stopped at 33 whose marker is gone."""
    (tmp_path / "train.py").write_text(SAVE)
    if storage == "s3":
        env, unmark = _s3_env(tmp_path, request.getfixturevalue("s3_server"))
    else:
        env = {}

        def unmark(sid: str) -> None:
            (tmp_path / "det_runs" / "checkpoints" / sid / rundir.METADATA_FILE).unlink()

    argv = [sys.executable, "train.py"]
    saved = _saved(_run(argv, tmp_path, STEPS="10 20 30 33", **env))
    unmark(saved[33])
    rerun = _run(argv, tmp_path, **env)
    assert _resumed(rerun) == [saved[30], saved[30]], rerun.stdout + rerun.stderr
    skipped = [x for x in rerun.stderr.splitlines() if "without a commit marker" in x]
    assert len(skipped) == 1 and saved[33] in skipped[0], rerun.stderr
    if storage == "directory":  # the UI shows it uncommitted, not deleted
        from determined_launch.ui.runs import RunReader

        reader = RunReader([str(tmp_path)])
        states = {c["uuid"]: c["state"] for c in reader.checkpoints(
            str(tmp_path / "det_runs" / "local"), [str(tmp_path / "det_runs" / "checkpoints")])}
        assert states[saved[33]] == "UNCOMMITTED" and states[saved[30]] == "COMPLETED"


WAIT = """
import os, pathlib, sys, time
print(os.getpid(), flush=True)
stop = pathlib.Path(sys.argv[1])
for _ in range(400):
    if stop.exists():
        break
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_one_live_job_per_run_directory(tmp_path: pathlib.Path) -> None:
    """Issue 35 §0.1: a second job gets one line and exit 2; after the first
    one's launcher is SIGKILLed, a relaunch is not blocked."""
    for name in ("wait.py", "other.py"):
        (tmp_path / name).write_text(WAIT)
    stop = tmp_path / "stop"
    env = base_env(DET_RUN_DIR=str(tmp_path / "run"))
    launch = [sys.executable, "-m", "determined_launch.cli", "exec", "--", sys.executable,
              "wait.py", str(stop)]
    first = subprocess.Popen(launch, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert first.stdout is not None
        worker = int(first.stdout.readline().split()[-1])
        second = subprocess.run([*launch[:-2], "other.py", str(stop)], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("is in use by another job") == 1
        assert "Traceback" not in second.stderr
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        record = json.loads((tmp_path / "run" / rundir.LEASE_FILE).read_text())
        assert record["pid"] == first.pid and record["host"] == socket.gethostname()
        _kill(worker)
        stop.touch()
        started = time.monotonic()
        relaunch = subprocess.run(launch, cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=60)
        assert relaunch.returncode == 0, relaunch.stderr
        assert time.monotonic() - started < 30
        assert not (tmp_path / "run" / rundir.LEASE_FILE).exists()  # given back at the end
    finally:
        stop.touch()
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
