"""The supervisor's process set stops only what it started (or adopted): a program that runs
a Supervisor in-process keeps the children it had before (CI found the test suite's azurite
killed by an in-process Supervisor test of test_min_nodes)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from determined_launch.supervisor.processes import ProcessSet

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_ensure_gone_leaves_the_children_this_process_already_had() -> None:
    before = subprocess.Popen(SLEEP)  # a storage server of the test session, say
    try:
        procs = ProcessSet()
        after = subprocess.Popen(SLEEP)  # started later: inside what the set stops
        procs.ensure_gone(kill_after=2.0)
        assert not psutil.pid_exists(after.pid)  # stopped and reaped
        assert before.poll() is None  # untouched
    finally:
        before.kill()
        before.wait()
