"""``--hang-timeout``: the progress beacon (core/_progress.py), the watchdog's
pure rules (supervisor/watchdog.py), the verdict's hung rank, and real jobs
whose rank hangs (asleep inside ``train_batch``, or SIGSTOPped) restarted
exactly from the last checkpoint."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from determined_launch import envvars
from determined_launch.core import _progress
from determined_launch.errors import EXIT_HUNG
from determined_launch.launch import config
from determined_launch.supervisor import verdict as v
from determined_launch.supervisor import watchdog as wd
from tests.conftest import WORKERS, Launch, base_env
from tests.test_restarts import CKPT_EVERY, STEPS, final_w, reference
from tests.test_verdict import make

WAITER = ('Thread 0x00007f01 (most recent call first):\n'
          '  File "/usr/lib/python3/threading.py", line 331 in wait\n\n'
          'Current thread 0x00007f00 (most recent call first):\n'
          '  File "/v/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
          '  File "/w/worker.py", line 30 in total\n')
DDP_BACKWARD = ('Current thread 0x00007f00 (most recent call first):\n'
                '  File "/v/torch/autograd/graph.py", line 979 in _engine_run_backward\n'
                '  File "/v/torch/_tensor.py", line 623 in backward\n'
                '  File "/r/determined_launch/pytorch/optim/opt.py", line 315 in backward\n'
                '  File "/w/train.py", line 66 in train_batch\n'
                '  File "/r/determined_launch/pytorch/loop/batch_step.py", line 129 in run\n')
SLEEPER = ('Current thread 0x00007f00 (most recent call first):\n'
           '  File "/w/hang_worker.py", line 33 in train_batch\n'
           '  File "/w/hang_worker.py", line 45 in main\n')


# ------------------------------------------------------------------ the beacon
def test_the_beacon_writes_at_most_once_a_second_and_counts_busy_time(tmp_path: Path) -> None:
    b = _progress.Beacon(str(tmp_path), 3)
    try:
        path = tmp_path / "rank-3.progress"
        assert path.read_text() == ""  # no progress yet: startup is never a hang
        b.beat(1)  # the first step beat starts the clock, and is written at once
        first = wd.parse_beat(path.read_text())
        assert first is not None and first.pid == os.getpid() and first.steps == 0
        for _ in range(5):
            time.sleep(0.02)
            b.beat(1)
        time.sleep(0.2)  # inside one of the Core API's agreements: not this rank's step
        b.waited(0.2)
        b.beat(1)
        assert wd.parse_beat(path.read_text()) == first  # within the second: not rewritten
        assert b.steps == 6 and 0.1 <= b.busy < 0.29, b.busy  # 5 x 0.02 s, not the 0.2 s
        b.write()
        now = wd.parse_beat(path.read_text())
        assert now is not None and now.steps == 6 and now.time >= first.time
    finally:
        b.close()
    assert not path.exists()  # closed: no longer judged


def test_outside_our_launchers_nothing_is_written(tmp_path: Path) -> None:
    _progress.start(0, env={})
    assert _progress._beacon is None
    _progress.beat(1)  # a no-op
    _progress.start(0, env={envvars.WRAP_RANK_STATUS_DIR: str(tmp_path / "missing")})
    assert _progress._beacon is None  # an unusable directory: no watchdog, no failure


def test_the_stack_signal_dumps_every_threads_stack(tmp_path: Path) -> None:
    code = ("import os, time\nfrom determined_launch.core import _progress\n"
            f"_progress.start(2, env={{'WRAP_RANK_STATUS_DIR': {str(tmp_path)!r}}})\n"
            "_progress.beat(1)\n"
            "def train_batch():\n    time.sleep(30)\n"
            "train_batch()\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        progress = tmp_path / "rank-2.progress"
        deadline = time.monotonic() + 20
        while not (progress.exists() and progress.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        dog = wd.Watchdog(str(tmp_path), timeout=0.01)
        hang, _ = dog.poll(0.0, time.time() + 5, done=())
        assert hang is not None and hang.rank == 2
        assert hang.lines[0] == "rank 2's Python stack (most recent call first):"
        assert any('line 6 in train_batch' in line for line in hang.lines), hang.lines
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ pure rules
def test_progress_lines_are_parsed_strictly() -> None:
    assert wd.parse_beat("12 40 1.5 1700000000.250   \n") == wd.Beat(12, 40, 1.5, 1.70000000025e9)
    for bad in ("", "12 40 1.5", "x 40 1.5 1", "12 40 1.5 1 extra", "\x00" * 80):
        assert wd.parse_beat(bad) is None


def test_a_rank_is_overdue_after_the_timeout_unless_its_work_is_done() -> None:
    beats = {0: wd.Beat(1, 5, 0.0, 100.0), 1: wd.Beat(2, 5, 0.0, 95.0)}
    assert wd.overdue(beats, 104.9, 10.0) == []
    assert wd.overdue(beats, 105.0, 10.0) == [1]
    assert wd.overdue(beats, 110.0, 10.0) == [0, 1]
    assert wd.overdue(beats, 110.0, 10.0, done={1}) == [0]


def test_where_a_rank_waits_is_its_main_threads_innermost_frame() -> None:
    assert wd.innermost(WAITER) == ("/v/torch/distributed/distributed_c10d.py", 2501, "all_reduce")
    assert wd.waiting(wd.innermost(WAITER)) and not wd.waiting(wd.innermost(SLEEPER))
    assert wd.describe_frame(wd.innermost(SLEEPER)) == "in train_batch (hang_worker.py:33)"
    assert wd.innermost("garbage") is None and not wd.waiting(None)
    assert wd.where(WAITER) == "in all_reduce (distributed_c10d.py:2501) from total (worker.py:30)"
    assert wd.where(SLEEPER) == "in train_batch (hang_worker.py:33)"
    assert wd.where("") == "somewhere: no Python stack came back"
    # DDP all-reduces inside backward(): a peer of a rank asleep in train_batch waits there
    # (seen with the Trainer: before, that peer was named hung instead)
    assert wd.waiting(wd.innermost(DDP_BACKWARD))
    assert wd.where(DDP_BACKWARD) == ("in _engine_run_backward (graph.py:979) from train_batch "
                                      "(train.py:66)")


def test_the_hung_rank_is_the_stopped_one_then_the_one_not_waiting() -> None:
    frames = {0: wd.innermost(WAITER), 1: wd.innermost(SLEEPER), 2: wd.innermost(WAITER)}
    silent = {0: 21.0, 1: 20.0, 2: 20.5}
    assert wd.choose(silent, stops={2}, frames=frames, timeout=20) == 2
    assert wd.choose(silent, stops=(), frames=frames, timeout=20) == 1
    # a rank whose stack did not come back is a candidate only after one known not to wait
    assert wd.choose({**silent, 3: 30.0}, (), frames, timeout=20) == 1
    assert wd.choose({0: 21.0, 3: 20.0}, (), frames, timeout=20) == 3
    # only waiters here (the hung rank is on another node, which names it first) ...
    waiters = {0: 21.0, 2: 20.5}
    assert wd.choose(waiters, (), frames, timeout=20) is None
    # ... unless nobody does within the margin (a collective every rank waits in)
    assert wd.choose({0: 20 + wd.WAIT_MARGIN, 2: 21.0}, (), frames, timeout=20) == 0


def test_a_hung_rank_fails_the_job_with_status_124() -> None:
    single = make()
    single.handle(v.RankHung(1, 20.4), now=1.0, wall=1.0)
    assert single.cause is not None and single.cause.status == EXIT_HUNG == 124
    assert single.cause.describe() == "rank 1 on node 0 (h0) hung: no progress for 20 s"
    assert single.phase == v.Phase.STOPPING
    # on a node that is not the chief: the existing failure path to the chief
    node = make(v.Role.NODE, node=1, nodes=2)
    out = node.handle(v.RankHung(3, 7.0), now=1.0, wall=1.0)
    sent = [a.msg for a in out if isinstance(a, v.SendToChief)]
    assert sent and sent[0]["how"] == "hung: no progress for 7 s" and sent[0]["what"] == "rank 3"


def test_hang_timeout_is_an_option_off_by_default() -> None:
    assert config.resolve({})["hang_timeout"] is None
    assert config.resolve({"DET_LAUNCH_HANG_TIMEOUT": "20"})["hang_timeout"] == 20.0
    assert config.resolve({}, {"hang_timeout": "7.5"})["hang_timeout"] == 7.5
    out = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--hang-timeout", "0",
                          "exec", "--", "true"], capture_output=True, text=True, timeout=60,
                         env=base_env())
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--hang-timeout" in out.stderr and "Traceback" not in out.stderr


# ------------------------------------------------------------------ real jobs
@pytest.mark.slow
@pytest.mark.parametrize("how", ["sleep", "stop"])
def test_a_hung_rank_is_named_and_the_job_restarts_exactly(
        tmp_path: Path, launches: list[Launch], how: str) -> None:
    timeout = 4
    env = base_env(DET_RUN_DIR=str(tmp_path / "run"), HANG_RANK="1", HANG_AT="6", HANG=how,
                   HANG_MARKER=str(tmp_path / "hung"), DET_KILL_AFTER="3", STEPS=str(STEPS),
                   CKPT_EVERY=str(CKPT_EVERY), PYTHONPATH=str(WORKERS))
    # asleep: 2 ranks (det.launch_per_slot, our DistributedContext: rank 0 waits in its
    # allgather; gloo's all_reduce under torchrun was checked by hand, docs/elastic.md);
    # stopped: one process (exec). Neither imports torch: 4x faster here
    ranks = 2 if how == "sleep" else 1
    env.update(HANG_RANK=str(ranks - 1), DET_LAUNCH_SLOTS=str(ranks),
               DET_LAUNCH_MAX_RESTARTS="1", DET_LAUNCH_HANG_TIMEOUT=str(timeout))
    worker = [sys.executable, str(WORKERS / "hang_worker.py")]
    argv = ([*worker, "launcher"] if how == "sleep"
            else [sys.executable, "-m", "determined_launch.cli", "exec", "--", *worker])
    if how == "stop":  # a stopped rank takes its TERM at once (SIGCONT), not after KILL
        env["DET_KILL_AFTER"] = "60"
    started = time.monotonic()
    launch = Launch(argv, env)
    launches.append(launch)
    assert launch.wait(150) == 0, launch.stderr
    assert time.monotonic() - started < 45, launch.stderr
    err = launch.stderr
    hung = ranks - 1
    found = re.findall(rf"det-launch: rank {hung} on node 0 \(\S+\) hung: no progress for "
                       r"(\d+) s", err)
    assert len(found) == 1, err
    assert timeout <= int(found[0]) <= timeout + 5, err  # silent since before the hang began
    if how == "stop":
        assert "det-launch: rank 0 is stopped (SIGSTOP or a debugger): no Python stack" in err
    else:
        assert re.search(r'det-launch:\s+File ".*hang_worker.py", line \d+ in train_batch', err)
        assert re.search(r"det-launch: rank 0 waits in \S+ \(\S+\.py:\d+\) from total "
                         r"\(hang_worker.py:\d+\)", err), err
    assert re.search(rf"det-launch: restart 1 of 1 after rank {hung} on node 0 \(\S+\) hung: "
                     r"no progress for \d+ s \(generation 0\); resuming from checkpoint \S+, "
                     r"steps_completed 4", err), err
    assert math.isclose(final_w(launch.stdout), reference(ranks=ranks), abs_tol=1e-5)
    assert launch.leftovers() == []


def test_a_stopped_process_is_seen_as_stopped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wd.alive(proc.pid) and not wd.stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not wd.stopped(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    assert not wd.alive(proc.pid)
