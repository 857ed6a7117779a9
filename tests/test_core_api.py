"""The local Core API: train, checkpoint, searcher and init's directories."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from determined_launch import ClusterInfo, core
from determined_launch.core._rundir import read_jsonl
from determined_launch.core.checkpoint import PARTIAL_PREFIX, merge_metadata
from determined_launch.errors import LaunchError
from tests._core_helpers import run_ranks
from tests.conftest import base_env


def make_info(trial_id: int | None = 7, max_length: int | None = 20, **extra: Any) -> ClusterInfo:
    doc: dict[str, Any] = {
        "container_addrs": ["127.0.0.1"],
        "container_rank": 0,
        "container_slot_counts": [1],
        **extra,
    }
    if trial_id is not None:
        doc["trial"] = {"trial_id": trial_id, "hparams": {"increment_by": 2}}
        if max_length is not None:
            doc["trial"]["max_length"] = max_length
    return ClusterInfo.from_mapping(doc, source="test", where="test")


def make_context(tmp_path: pathlib.Path, dist: Any, **kwargs: Any) -> core.Context:
    kwargs.setdefault("info", make_info())
    return core.init(distributed=dist, run_dir=str(tmp_path / "run"), **kwargs)


def solo() -> core.DistributedContext:
    """The real single-process context (it opens no sockets)."""
    return core.DistributedContext(
        rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1
    )


# --- train -------------------------------------------------------------------


class Scalar:
    """Duck-types a numpy or torch scalar (``.item()``), without either."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def test_metrics_are_json_lines_in_the_run_dir(tmp_path: pathlib.Path) -> None:
    with make_context(tmp_path, solo()) as ctx:
        ctx.train.report_training_metrics(steps_completed=10, metrics={"x": Scalar(1.5)})
        ctx.train.report_training_metrics(10, {"loss": float("nan")}, batch_metrics=[{"a": 1}])
        ctx.train.report_validation_metrics(steps_completed=10, metrics={"val": 3})
        ctx.train.report_metrics("custom-group", 11, {"y": 2})
        ctx.train.report_progress(0.5)
    run = tmp_path / "run"
    training = read_jsonl(run / "training.jsonl")
    assert [r["metrics"] for r in training][0] == {"x": 1.5}
    assert training[0]["steps_completed"] == 10 and training[0]["trial_id"] == 7
    assert training[1]["batch_metrics"] == [{"a": 1}]
    assert read_jsonl(run / "validation.jsonl")[0]["metrics"] == {"val": 3}
    assert read_jsonl(run / "custom-group.jsonl")[0]["steps_completed"] == 11
    assert read_jsonl(run / "progress.jsonl")[0]["progress"] == 0.5


def test_metrics_reject_bad_groups_and_values(tmp_path: pathlib.Path) -> None:
    with make_context(tmp_path, solo()) as ctx:
        for group in ("a/b", "", "progress"):
            with pytest.raises(ValueError, match="metrics group"):
                ctx.train.report_metrics(group, 1, {})
        with pytest.raises(ValueError, match="progress"):
            ctx.train.report_progress(1.5)
        with pytest.raises(TypeError, match="not JSON-serializable"):
            ctx.train.report_training_metrics(1, {"x": object()})


def test_only_the_chief_reports(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> str:
        ctx = make_context(tmp_path, dist)
        if dist.rank == 0:
            ctx.train.report_training_metrics(1, {"x": 1})
            return "ok"
        calls = [
            lambda: ctx.train.report_training_metrics(1, {"x": 1}),
            lambda: ctx.train.report_validation_metrics(1, {"x": 1}),
            lambda: ctx.train.report_progress(0.1),
            lambda: ctx.checkpoint.store_path({}).__enter__(),
        ]
        messages = []
        for call in calls:
            with pytest.raises(RuntimeError, match=r"only be called on the chief.*rank 1") as e:
                call()
            messages.append(str(e.value))
        return "\n".join(messages)

    out = run_ranks(2, rank_main)
    assert out[0] == "ok"
    assert "report_training_metrics()" in out[1] and "store_path(shard=False)" in out[1]
    assert len(read_jsonl(tmp_path / "run" / "training.jsonl")) == 1


# --- checkpoint --------------------------------------------------------------


def test_store_restore_metadata_and_latest(tmp_path: pathlib.Path) -> None:
    with make_context(tmp_path, solo()) as ctx:
        assert ctx.checkpoint.latest() is None
        with ctx.checkpoint.store_path({"steps_completed": 10}) as (path, storage_id):
            (path / "state").write_text("10")
        assert ctx.checkpoint.get_metadata(storage_id) == {"steps_completed": 10}
        with ctx.checkpoint.restore_path(storage_id) as restored:
            assert (restored / "state").read_text() == "10"
            assert json.loads((restored / "metadata.json").read_text())["steps_completed"] == 10
        assert ctx.checkpoint.latest() == storage_id
        assert ctx.checkpoint.storage_dir == tmp_path / "checkpoints"

        second = ctx.checkpoint.upload(restored, {"steps_completed": 20})
        assert ctx.checkpoint.latest() == second
        ctx.checkpoint.download(second, tmp_path / "dl")
        assert (tmp_path / "dl" / "state").read_text() == "10"

        ctx.checkpoint.delete(second)
        assert ctx.checkpoint.latest() == storage_id  # the newest still committed
        with pytest.raises(FileNotFoundError, match=second):
            ctx.checkpoint.get_metadata(second)
        with pytest.raises(ValueError, match="invalid checkpoint storage id"):
            ctx.checkpoint.get_metadata("../run")
        # What a crashed save leaves behind is "not found", as documented.
        with pytest.raises(FileNotFoundError, match="never committed"):
            with ctx.checkpoint.restore_path(PARTIAL_PREFIX + "abc"):
                pass
    assert not list((tmp_path / "checkpoints").glob(PARTIAL_PREFIX + "*"))


def test_error_inside_store_path_commits_nothing(tmp_path: pathlib.Path) -> None:
    with make_context(tmp_path, solo()) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (_, good):
            pass
        with pytest.raises(KeyError):
            with ctx.checkpoint.store_path({"steps_completed": 2}) as (path, bad):
                (path / "half").write_text("x")
                raise KeyError("boom")
        with pytest.raises(FileNotFoundError):
            ctx.checkpoint.get_metadata(bad)
        assert ctx.checkpoint.latest() == good
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [good]


def test_crash_during_store_path_leaves_no_complete_checkpoint(tmp_path: pathlib.Path) -> None:
    """A worker killed mid-save (SIGKILL: no cleanup code runs)."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from determined_launch import ClusterInfo, core
        info = ClusterInfo.from_mapping(
            {{"container_addrs": ["127.0.0.1"], "container_rank": 0,
              "container_slot_counts": [1],
              "trial": {{"trial_id": 7, "hparams": {{"increment_by": 2}}}}}},
            source="test", where="test")
        ctx = core.init(info=info, run_dir={str(tmp_path / "run")!r})
        with ctx.checkpoint.store_path({{"steps_completed": 1}}) as (path, sid):
            (path / "weights").write_text("complete")
        print(sid, flush=True)
        with ctx.checkpoint.store_path({{"steps_completed": 2}}) as (path, sid):
            (path / "weights").write_text("half")
            print(sid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=base_env(),
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    good, crashed = proc.stdout.split()
    with make_context(tmp_path, solo()) as ctx:
        assert ctx.checkpoint.latest() == good
        assert ctx.checkpoint.get_metadata(good) == {"steps_completed": 1}
        with pytest.raises(FileNotFoundError, match=crashed):
            with ctx.checkpoint.restore_path(crashed):
                pass
    entries = sorted(os.listdir(tmp_path / "checkpoints"))
    assert entries == sorted([good, PARTIAL_PREFIX + crashed])
    assert not (tmp_path / "checkpoints" / (PARTIAL_PREFIX + crashed) / "metadata.json").exists()


def test_sharded_store_every_rank_writes_chief_commits(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> tuple[str, list[str], dict[str, Any]]:
        ctx = make_context(tmp_path, dist)
        md = {"steps_completed": 5, f"rank{dist.rank}": dist.rank}
        with ctx.checkpoint.store_path(md, shard=True) as (path, storage_id):
            (path / f"shard-{dist.rank}").write_text(str(dist.rank))
        # every rank returns only after the commit
        with ctx.checkpoint.restore_path(storage_id) as p:
            files = sorted(os.listdir(p))
        return storage_id, files, ctx.checkpoint.get_metadata(storage_id)

    out = run_ranks(3, rank_main)
    assert len({sid for sid, _, _ in out}) == 1
    for _, files, md in out:
        assert files == ["metadata.json", "shard-0", "shard-1", "shard-2"]
        assert md == {"steps_completed": 5, "rank0": 0, "rank1": 1, "rank2": 2}


def test_sharded_store_failure_on_one_rank_commits_nothing(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> str:
        ctx = make_context(tmp_path, dist)
        try:
            with ctx.checkpoint.store_path({}, shard=True) as (path, _):
                (path / f"shard-{dist.rank}").write_text("x")
                if dist.rank == 1:
                    raise OSError("disk full")
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "committed"

    out = run_ranks(3, rank_main)
    assert out[1] == "OSError: disk full"
    for rank in (0, 2):
        assert out[rank].startswith("RuntimeError: checkpoint") and "rank 1 failed" in out[rank]
    assert os.listdir(tmp_path / "checkpoints") == []


def test_sharded_metadata_conflict_aborts_on_every_rank(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> str:
        ctx = make_context(tmp_path, dist)
        with pytest.raises(RuntimeError, match="conflict at steps_completed") as e:
            with ctx.checkpoint.store_path({"steps_completed": dist.rank}, shard=True):
                pass
        return str(e.value)

    run_ranks(2, rank_main)
    assert os.listdir(tmp_path / "checkpoints") == []


def test_merge_metadata() -> None:
    assert merge_metadata([{"a": {"x": 1}, "b": (1, 2)}, {"a": {"y": 2}, "b": [1, 2]}]) == {
        "a": {"x": 1, "y": 2},
        "b": [1, 2],
    }
    with pytest.raises(ValueError, match=r"a\.x"):
        merge_metadata([{"a": {"x": 1}}, {"a": {"x": 2}}])


# --- searcher ----------------------------------------------------------------


def test_searcher_yields_the_configured_length_and_records_completion(
    tmp_path: pathlib.Path,
) -> None:
    with make_context(tmp_path, solo()) as ctx:
        ops = ctx.searcher.operations()
        op = next(ops)
        assert op.length == 20
        op.report_progress(5)
        op.report_completed(0.25)
        with pytest.raises(RuntimeError, match="only be called once"):
            op.report_completed(0.25)
        assert list(ops) == []
    assert read_jsonl(tmp_path / "run" / "searcher.jsonl")[0]["searcher_metric"] == 0.25
    assert read_jsonl(tmp_path / "run" / "progress.jsonl")[0]["progress"] == 0.25

    with make_context(tmp_path, solo(), max_length=3) as ctx:
        ops = ctx.searcher.operations()
        assert next(ops).length == 3
        with pytest.raises(RuntimeError, match="report_completed"):
            next(ops)

    with make_context(tmp_path, solo(), info=make_info(max_length=None)) as ctx:
        with pytest.raises(RuntimeError, match="max_length"):
            next(ctx.searcher.operations())


def test_searcher_on_workers(tmp_path: pathlib.Path) -> None:
    def rank_main(dist: Any) -> list[int]:
        ctx = make_context(tmp_path, dist)
        lengths = []
        for op in ctx.searcher.operations():
            lengths.append(op.length)
            if dist.rank == 0:
                op.report_completed(1.0)
            else:
                with pytest.raises(RuntimeError, match="chief"):
                    op.report_completed(1.0)
        return lengths

    assert run_ranks(2, rank_main) == [[20], [20]]


# --- init --------------------------------------------------------------------


def test_default_directories(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DET_RUN_DIR", raising=False)
    monkeypatch.delenv("DET_CHECKPOINT_STORAGE", raising=False)
    with core.init(distributed=solo(), info=make_info(trial_id=3)) as ctx:
        assert ctx.run_dir == tmp_path / "det_runs" / "trial-3"
        assert ctx.checkpoint.storage_dir == tmp_path / "det_runs" / "checkpoints"
        assert ctx.info.trial is not None and ctx.info.trial.hparams == {"increment_by": 2}
    with core.init(distributed=solo(), info=make_info(trial_id=None)) as ctx:
        assert ctx.run_dir == tmp_path / "det_runs" / "local"
        assert ctx.searcher.max_length is None
    monkeypatch.setenv("DET_RUN_DIR", "elsewhere/run")
    monkeypatch.setenv("DET_CHECKPOINT_STORAGE", str(tmp_path / "ckpts"))
    with core.init(distributed=solo(), info=make_info()) as ctx:
        assert ctx.run_dir == tmp_path / "elsewhere" / "run"
        assert ctx.checkpoint.storage_dir == tmp_path / "ckpts"
    with core.init(distributed=solo(), info=make_info(), checkpoint_storage="c2") as ctx:
        assert ctx.checkpoint.storage_dir == tmp_path / "c2"


def test_init_errors(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(LaunchError, match="unsupported scheme 'ftp'"):
        core.init(distributed=solo(), info=make_info(), checkpoint_storage="ftp://bucket/x")
    with pytest.raises(LaunchError, match="only directories"):
        core.init(distributed=solo(), info=make_info(), run_dir="s3://bucket/x")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(LaunchError, match="WORLD_SIZE=4.*DistributedContext"):
        core.init(info=make_info(), run_dir=str(tmp_path))


def test_context_closes_distributed(tmp_path: pathlib.Path) -> None:
    dist = solo()
    with make_context(tmp_path, dist) as ctx:
        assert ctx.distributed is dist and dist.allgather(1) == [1]
    assert "closed" in repr(dist)


def test_without_distributed_init_makes_a_single_process_context(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with core.init(info=make_info(), run_dir=str(tmp_path)) as ctx:
        assert isinstance(ctx.distributed, core.DistributedContext)
        assert (ctx.distributed.rank, ctx.distributed.size) == (0, 1)
        assert ctx.preempt.should_preempt() is False


def test_run_dir_lines_of_threads_never_mix_and_files_close_with_it(tmp_path: pathlib.Path) -> None:
    """Streams stay open (one write per line, O_APPEND): lines of 4 threads,
    up to 200 KB each, come out whole; the files close when the RunDir goes."""
    import gc
    import threading

    from determined_launch.core._rundir import RunDir

    held = [RunDir(tmp_path / "run", trial_id=7)]

    def writer(t: int) -> None:
        for i in range(60):
            held[0].append("training", {"steps_completed": i, "metrics": {"t": t, "pad": "x" * (
                (i * 3_331 + t) % 200_000)}})

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = read_jsonl(tmp_path / "run" / "training.jsonl")
    assert sorted((r["metrics"]["t"], r["steps_completed"]) for r in rows) == sorted(
        (t, i) for t in range(4) for i in range(60))
    assert {r["trial_id"] for r in rows} == {7}
    # this RunDir's stream only: earlier tests in the same process may hold their own
    stream = os.path.realpath(tmp_path / "run" / "training.jsonl")

    def opened() -> list[str]:
        return [fd for fd in os.listdir("/proc/self/fd")
                if os.path.realpath(f"/proc/self/fd/{fd}") == stream]

    assert len(opened()) == 1
    held.clear()
    gc.collect()
    assert not opened()
