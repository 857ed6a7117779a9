"""PreemptContext logic: modes, agreement on the same call index, acknowledgement.

The multi-rank tests here run ranks as threads over an in-process stand-in
for DistributedContext (pure logic). tests/test_preempt_processes.py runs
the same properties with real processes and the real DistributedContext.
"""

from __future__ import annotations

import os
import pathlib
import random
import threading
import time
from typing import Any

import pytest

from determined_launch import envvars
from determined_launch.core import PreemptContext, PreemptMode
from determined_launch.core.preempt import POOL_PERIOD
from tests._core_helpers import ThreadGroup, run_ranks


def node_files(tmp_path: pathlib.Path, node: int) -> dict[str, str]:
    d = tmp_path / f"node{node}"
    d.mkdir(exist_ok=True)
    return {"signal_file": str(d / "preempt-requested"), "ack_file": str(d / "preempt-ack")}


def loop_until_preempted(
    ctx: PreemptContext,
    *,
    block: bool,
    lockstep: threading.Barrier | None,
    on_step: Any = None,
    max_steps: int = 100_000,
    jitter: float = 0.0,
) -> int:
    """A training loop: returns the call index at which should_preempt said True."""
    for step in range(1, max_steps + 1):
        if jitter:
            time.sleep(random.random() * jitter)
        if lockstep is not None:
            lockstep.wait()  # stands in for the all-reduce of a training step
        if on_step is not None:
            on_step(step)
        if ctx.should_preempt(block=block):
            assert ctx.calls == step
            return step
    raise AssertionError("never preempted")


@pytest.mark.parametrize("block", [False, True])
@pytest.mark.parametrize("lockstep", [True, False])
def test_signal_on_one_node_stops_every_rank_on_the_same_call(
    tmp_path: pathlib.Path, block: bool, lockstep: bool
) -> None:
    """2 nodes x 2 ranks. Node 1's launcher is signalled: its signal file
    appears first, node 0's (the chief's) some steps later, as when the
    launchers pass the request on."""
    size, trigger = 4, 300
    barrier = threading.Barrier(size, timeout=20) if lockstep else None

    def rank_main(dist: Any) -> int:
        files = node_files(tmp_path, dist.rank // 2)
        ctx = PreemptContext(dist, sync_period=0.002, **files)

        def on_step(step: int) -> None:
            if (dist.rank, step) in ((3, trigger), (1, trigger + 25)):
                pathlib.Path(files["signal_file"]).touch()

        return loop_until_preempted(
            ctx, block=block, lockstep=barrier, on_step=on_step, jitter=0.0002
        )

    stops = run_ranks(size, rank_main)
    assert len(set(stops)) == 1, stops
    assert stops[0] >= trigger
    # every node's launcher was told the workers comply
    for node in (0, 1):
        assert os.path.exists(node_files(tmp_path, node)["ack_file"])


def test_nonblocking_checks_rarely_once_steps_are_fast(tmp_path: pathlib.Path) -> None:
    group = ThreadGroup(2)
    calls = 20_000
    results: list[bool] = []

    def rank_main(rank: int) -> None:
        ctx = PreemptContext(group.member(rank), sync_period=0.05, **node_files(tmp_path, 0))
        results.append(any(ctx.should_preempt(block=False) for _ in range(calls)))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    assert results == [False, False]
    # Intervals double from 1 up to max_sync_interval (1000) or sync_period:
    # about log2(1000) + calls / 1000 + elapsed / sync_period agreements.
    bound = 10 + calls / 1000 + elapsed / 0.05 + 2
    assert group.collectives <= bound, (group.collectives, elapsed)


def test_python_request_on_a_non_chief_rank_reaches_everyone(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> int:
        ctx = PreemptContext(dist, sync_period=0.001, **node_files(tmp_path, dist.rank))

        def on_step(step: int) -> None:
            if dist.rank == 2 and step == 50:
                ctx.request_preemption("test")

        return loop_until_preempted(ctx, block=False, lockstep=None, on_step=on_step, jitter=0.0005)

    stops = run_ranks(3, rank_main)
    assert len(set(stops)) == 1 and stops[0] >= 50


def test_blocking_latency_chief_next_call_others_next_pooled_agreement(
    tmp_path: pathlib.Path,
) -> None:
    """What the chief sees counts at the next call; what only another rank
    sees counts at the next pooled agreement (about every POOL_PERIOD s)."""

    def rank_main(dist: Any) -> list[tuple[int, float]]:
        stops = []
        for requester in (0, 1):
            ctx = PreemptContext(dist, **node_files(tmp_path, dist.rank))
            for _ in range(3):
                assert not ctx.should_preempt()
            if dist.rank == requester:
                ctx.request_preemption()
            start, t0 = ctx.calls, time.monotonic()
            while not ctx.should_preempt():
                time.sleep(0.001)
            stops.append((ctx.calls - start, time.monotonic() - t0))
        return stops

    chief_first, other_first = zip(*run_ranks(2, rank_main))
    assert {calls for calls, _ in chief_first} == {1}
    assert len({calls for calls, _ in other_first}) == 1
    assert other_first[0][0] > 1  # not at once: the chief had not seen it
    assert max(took for _, took in other_first) < POOL_PERIOD + 2


def test_operator_file_is_a_source(tmp_path: pathlib.Path) -> None:
    operator = tmp_path / "please-stop"

    def rank_main(dist: Any) -> list[bool]:
        ctx = PreemptContext(dist, preempt_file=str(operator))
        first = ctx.should_preempt()
        if dist.rank == 0:
            operator.touch()
        dist.allgather(None)
        return [first, ctx.should_preempt(), ctx.should_preempt()]

    assert run_ranks(2, rank_main) == [[False, True, True]] * 2


def test_decision_is_sticky_and_ack_once(tmp_path: pathlib.Path) -> None:
    files = node_files(tmp_path, 0)

    def rank_main(dist: Any) -> list[bool]:
        ctx = PreemptContext(dist, **files)
        pathlib.Path(files["signal_file"]).touch()
        out = [ctx.should_preempt(), ctx.should_preempt(block=False)]
        os.unlink(files["signal_file"]) if dist.rank == 0 else None
        dist.allgather(None)
        return out + [ctx.should_preempt(), ctx.should_preempt(block=False)]

    assert run_ranks(2, rank_main) == [[True] * 4] * 2
    lines = pathlib.Path(files["ack_file"]).read_text().splitlines()
    assert sorted(lines) == ["rank 0", "rank 1"]


def test_auto_ack_false_leaves_acknowledging_to_the_user(tmp_path: pathlib.Path) -> None:
    files = node_files(tmp_path, 0)
    group = ThreadGroup(1)
    ctx = PreemptContext(group.member(0), **files)
    pathlib.Path(files["signal_file"]).touch()
    assert ctx.should_preempt(auto_ack=False)
    assert not os.path.exists(files["ack_file"])
    ctx.acknowledge_preemption_signal()
    assert pathlib.Path(files["ack_file"]).read_text() == "rank 0\n"


def test_chief_only_misuse_on_a_worker_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    group = ThreadGroup(2)
    chief = PreemptContext(group.member(0), PreemptMode.ChiefOnly, **node_files(tmp_path, 0))
    worker = PreemptContext(group.member(1), PreemptMode.ChiefOnly, **node_files(tmp_path, 0))
    assert chief.should_preempt() is False  # no collective: would hang if it tried one
    for block in (True, False, False):
        with pytest.raises(RuntimeError, match=r"ChiefOnly.*non-chief worker \(rank=1\)"):
            worker.should_preempt(block=block)
    pathlib.Path(node_files(tmp_path, 0)["signal_file"]).touch()
    assert chief.should_preempt(block=False) is True
    assert group.collectives == 0


def test_workers_ask_master_reads_only_its_own_node(tmp_path: pathlib.Path) -> None:
    group = ThreadGroup(4)
    ctxs = [
        PreemptContext(
            group.member(r), PreemptMode.WorkersAskMaster, **node_files(tmp_path, r // 2)
        )
        for r in range(4)
    ]
    pathlib.Path(node_files(tmp_path, 1)["signal_file"]).touch()
    assert [c.should_preempt() for c in ctxs] == [False, False, True, True]
    assert group.collectives == 0


def test_from_env_reads_the_launcher_contract(tmp_path: pathlib.Path) -> None:
    files = node_files(tmp_path, 0)
    env = {
        envvars.PREEMPT_SIGNAL_FILE: files["signal_file"],
        envvars.PREEMPT_ACK_FILE: files["ack_file"],
        envvars.PREEMPT_FILE: str(tmp_path / "operator"),
    }
    ctx = PreemptContext.from_env(ThreadGroup(1).member(0), env=env)
    assert not ctx.should_preempt()
    (tmp_path / "operator").touch()
    assert ctx.should_preempt()
    assert os.path.exists(files["ack_file"])


def test_without_a_launcher_acknowledging_is_harmless() -> None:
    ctx = PreemptContext.from_env(ThreadGroup(1).member(0), env={})
    assert not ctx.should_preempt(block=False)
    ctx.request_preemption()
    assert ctx.should_preempt()  # blocking call: sees the request at once


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"sync_period": 0}, "sync_period"), ({"max_sync_interval": 0}, "max_sync_interval")],
)
def test_bad_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PreemptContext(ThreadGroup(1).member(0), **kwargs)
