"""Trial logs, printed or followed (``det trial logs [-f]``, ``det e create -f``).

A trial's log is its launcher's output, ``<exp>/trials/<id>/output.log`` (every
line ``[rank=N] ...``; a restart appends). Following ends when the trial ends,
or when nothing runs it any more (its experiment paused, killed or gone)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from typing import Optional

from determined_launch.det import state
from determined_launch.exproot import Root, TrialRef
from determined_launch.rundir import OUTPUT_FILE
from determined_launch.ui.study import Studies

POLL = 0.2
CHUNK = 1 << 16


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def print_log(path: os.PathLike[str], head: Optional[int] = None,
              tail: Optional[int] = None) -> int:
    """The log so far (its first or last N lines); the offset printed up to."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return 0
    with f:
        if head is not None:
            for _ in range(head):
                line = f.readline()
                if not line:
                    break
                _write(line)
            return f.seek(0, os.SEEK_END)
        if tail is not None:  # bounded memory whatever the log's size
            _write(b"".join(deque(iter(f.readline, b""), maxlen=max(tail, 0))))
            return f.tell()
        while chunk := f.read(CHUNK):
            _write(chunk)
        return f.tell()


def _more(path: os.PathLike[str], offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK):
                _write(chunk)
            return f.tell()
    except FileNotFoundError:
        return offset


def _trial_running(root: Root, ref: TrialRef, studies: Studies) -> bool:
    v = state.view(root.experiment(ref.experiment.id), studies)
    trial = next((t for t in v.trials if t.id == ref.id), None)
    if trial is not None and trial.state in state.FINAL:
        return False
    return v.state in ("ACTIVE", "RUNNING", "QUEUED", "STOPPING_CANCELED")


def follow_trial(root: Root, ref: TrialRef, offset: int = 0) -> None:
    path = ref.dir / OUTPUT_FILE
    studies = state.new_studies(root.path)
    while True:
        offset = _more(path, offset)
        if not _trial_running(root, ref, studies):
            _more(path, offset)  # what came between the last read and the end
            return
        time.sleep(POLL)


def _reap(proc: Optional[subprocess.Popen[bytes]]) -> Optional[int]:
    return None if proc is None else proc.poll()


def _first_trial(root: Root, exp_id: int,
                 proc: Optional[subprocess.Popen[bytes]]) -> Optional[TrialRef]:
    """Wait for the experiment's first trial; None when its driver ended without one."""
    studies = state.new_studies(root.path)
    while True:
        v = state.view(root.experiment(exp_id), studies)
        if v.trials:
            first = min(v.trials, key=lambda t: t.id)
            return TrialRef(first.id, v.exp, first.dir)
        alive = _reap(proc) is None if proc is not None else v.state == "ACTIVE"
        if not alive:
            print(f"experiment {exp_id} ended before its first trial began; its driver's "
                  f"output ({v.exp.dir / state.LOG}) ended:", file=sys.stderr)
            print_log(v.exp.dir / state.LOG, tail=10)
            return None
        time.sleep(POLL)


def first_trial(root: Root, exp_id: int, proc: Optional[subprocess.Popen[bytes]]) -> int:
    """``det e create -f``: Determined's lines around the first trial's log; 0
    when the stream ends, as Determined's (``det e wait`` tells success)."""
    print("Waiting for first trial to begin...", flush=True)
    ref = _first_trial(root, exp_id, proc)
    if ref is None:
        return 1
    print(f"Following first trial with ID {ref.id}", flush=True)
    try:
        follow_trial(root, ref)
    finally:
        print(f"Trial log stream ended. To reopen log stream, run: det trial logs -f {ref.id}",
              flush=True)
    return 0


def test_mode(root: Root, exp_id: int, proc: Optional[subprocess.Popen[bytes]]) -> int:
    """``det e create --test``: the one small trial's log, then Determined's verdict."""
    ref = _first_trial(root, exp_id, proc)
    if ref is not None:
        follow_trial(root, ref)
        v = state.view(root.experiment(exp_id))
        trial = next((t for t in v.trials if t.id == ref.id), None)
        if trial is not None and trial.state == "COMPLETED":
            print("Model definition test succeeded! 🎉", flush=True)
            return 0
    print(f"Model definition test failed. Trial logs: det trial logs {ref.id if ref else ''}"
          .rstrip(), file=sys.stderr, flush=True)
    return 1
