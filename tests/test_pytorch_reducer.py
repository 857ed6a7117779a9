"""Reducers and metric arithmetic (spec 2.8, 3.8, 7), across real ranks too."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import torch

from determined_launch import core, errors, pytorch
from determined_launch.pytorch.metrics import utils as mu
from determined_launch.pytorch.metrics.reducer import _PyTorchReducerContext
from tests._distributed_helpers import run_threads
from tests.conftest import base_env

VALUES = np.array([0.25, 0.5, 0.75, 1, 25.5, 1.9])


def test_simple_reduce_numbers() -> None:
    R = pytorch.Reducer
    assert round(float(pytorch._simple_reduce_metrics(R.AVG, VALUES)), 2) == 4.98
    assert float(pytorch._simple_reduce_metrics(R.SUM, VALUES)) == pytest.approx(29.9)
    assert float(pytorch._simple_reduce_metrics(R.MIN, VALUES)) == 0.25
    assert float(pytorch._simple_reduce_metrics(R.MAX, VALUES)) == 25.5
    weighted = pytorch._simple_reduce_metrics(R.AVG, VALUES, [1, 2, 5, 4, 5, 6])
    assert round(float(weighted), 2) == 6.43
    with pytest.raises(RuntimeError, match="Lengths of metrics and num_batches are not equal"):
        pytorch._simple_reduce_metrics(R.AVG, VALUES, [1, 2])


def batches_of_two(n: int = 47) -> List[List[int]]:
    return [list(range(i, min(i + 2, n))) for i in range(0, n, 2)]


def flatten(batches: List[List[int]]) -> List[int]:
    return [v for b in batches for v in b]


def reduce_on_ranks(ctx: core.DistributedContext) -> Dict[str, Any]:
    """Every rank takes batches round-robin, updates a function reducer and a class reducer."""
    reducers = _PyTorchReducerContext(ctx.allgather)
    seen = reducers.wrap_reducer(flatten, name="order")
    total = reducers.wrap_reducer(SumCount(), name=None)
    reducers.reset_reducers()
    for batch in batches_of_two()[ctx.rank :: ctx.size]:
        seen.update(batch)  # type: ignore[attr-defined]
        total.update(batch)  # type: ignore[attr-defined]
    return reducers.reduce_metrics(for_training=True)


class SumCount(pytorch.MetricReducer):
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sum, self.count = 0, 0

    def update(self, batch: List[int]) -> None:
        self.sum += sum(batch)
        self.count += len(batch)

    def per_slot_reduce(self) -> Any:
        return self.sum, self.count

    def cross_slot_reduce(self, per_slot_metrics: List) -> Any:
        sums, counts = zip(*per_slot_metrics)
        return {"sum": sum(sums), "mean": sum(sums) / sum(counts)}


@pytest.mark.parametrize("size", [1, 3, 9])
def test_function_reducer_restores_order_across_ranks(size: int) -> None:
    results = run_threads(1, size, reduce_on_ranks)
    for res in results:  # every rank gets the same answer
        assert res["order"] == list(range(47))
        assert sum(res["order"]) == 1081
        assert res["sum"] == 1081 and res["mean"] == pytest.approx(23.0)


def test_default_allgather_is_single_process() -> None:
    reducers = _PyTorchReducerContext()
    r = reducers.wrap_reducer(lambda vs: sum(vs), name="s")
    for v in (1, 2, 3):
        r.update(v)  # type: ignore[attr-defined]
    assert reducers.reduce_metrics(for_training=False) == {"s": 6}
    reducers.reset_reducers()
    assert reducers.reduce_metrics(for_training=True) == {"s": 0}


def test_training_validation_selection() -> None:
    reducers = _PyTorchReducerContext()
    reducers.wrap_reducer(lambda vs: 1, name="t", for_validation=False)
    reducers.wrap_reducer(lambda vs: 2, name="v", for_training=False)
    assert reducers.reduce_metrics(for_training=True) == {"t": 1}
    assert reducers.reduce_metrics(for_training=False) == {"v": 2}
    assert _PyTorchReducerContext().reduce_metrics(True) == {}


def test_name_rules() -> None:
    def not_a_dict(values: List) -> int:
        return 3

    reducers = _PyTorchReducerContext()
    reducers.wrap_reducer(not_a_dict, name=None)
    with pytest.raises(AssertionError, match="name=None but it did not return a dict") as e:
        reducers.reduce_metrics(True)
    assert "not_a_dict()" in str(e.value)

    class DictReducer(SumCount):
        pass

    reducers = _PyTorchReducerContext()
    reducers.wrap_reducer(DictReducer(), name="x").update([1])  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="with name set but it returned a dict anyway") as e:
        reducers.reduce_metrics(True)
    assert "MetricReducer DictReducer" in str(e.value)


@pytest.mark.parametrize("method", ["reset", "per_slot_reduce", "cross_slot_reduce"])
def test_user_reducer_errors_name_the_reducer(method: str) -> None:
    class Broken(SumCount):
        pass

    def boom(*args: Any) -> None:
        raise KeyError("inside")

    broken = Broken()
    setattr(Broken, method, boom)
    reducers = _PyTorchReducerContext()
    reducers.wrap_reducer(broken, name="b")
    with pytest.raises(ValueError) as e:
        reducers.reset_reducers()
        reducers.reduce_metrics(True)
    assert str(e.value) == (
        f'reducer of type Broken for name="b" failed in a call to {method}()'
    )
    assert isinstance(e.value.__cause__, KeyError)


def test_wrap_reducer_rejects_double_and_invalid() -> None:
    reducers = _PyTorchReducerContext()
    r = SumCount()
    assert reducers.wrap_reducer(r) is r
    with pytest.raises(AssertionError, match="same reducer"):
        reducers.wrap_reducer(r)
    with pytest.raises(AssertionError, match="function or a subclass"):
        reducers.wrap_reducer(42)  # type: ignore[arg-type]
    assert isinstance(reducers.wrap_reducer(sum, name="s"), pytorch._SimpleReducer)


# ---- metric utils -------------------------------------------------------------------


def test_make_metrics_averages_and_keeps_unaverageable_keys() -> None:
    batch = [
        {"loss": np.array(0.5), "n": 1, "text": "a", "maybe": None},
        {"loss": np.array(1.5), "n": 3, "text": "b", "maybe": 2.0},
    ]
    out = mu._make_metrics(None, batch)
    avg = out["avg_metrics"]
    assert avg["loss"] == 1.0 and avg["n"] == 2.0 and avg["maybe"] == 2.0
    assert avg["text"] is None and "text" in avg
    assert out["batch_metrics"] == batch and "num_inputs" not in out
    assert mu._make_metrics(8, [])["num_inputs"] == 8
    with pytest.raises(ValueError, match="inconsistent training metrics"):
        mu._make_metrics(None, [{"a": 1}, {"b": 1}])


def test_average_training_metrics_over_ranks() -> None:
    combined = {
        "loss": [[1.0, 2.0], [3.0, None]],
        "vec": [[np.array([1.0, 3.0]), np.array([0.0])], [np.array([3.0, 5.0]), np.array([2.0])]],
    }
    out = mu._average_training_metrics(combined, [2, 2])
    assert [b["loss"] for b in out] == [2.0, 2.0]  # None ignored
    assert isinstance(out[0]["vec"], np.ndarray) and float(out[0]["vec"]) == 3.0


def test_process_combined_drops_empty_ranks() -> None:
    metrics, counts = mu._process_combined_metrics_and_batches(
        [({"a": 1}, 2), ({}, 0), ({"a": 5}, 3)]
    )
    assert metrics == {"a": [1, 5]} and counts == [2, 3]
    assert mu._process_combined_metrics_and_batches([({}, 0)]) == ({}, [])


def test_prepare_metrics_reducers() -> None:
    R = pytorch.Reducer
    assert pytorch._prepare_metrics_reducers(R.SUM, ["a", "b"]) == {"a": R.SUM, "b": R.SUM}
    assert pytorch._prepare_metrics_reducers({"a": R.MAX}, {"a": 1}.keys()) == {"a": R.MAX}
    with pytest.raises(errors.InvalidExperimentException, match="reducer for every"):
        pytorch._prepare_metrics_reducers({"a": R.MAX}, ["a", "b"])
    with pytest.raises(errors.InvalidExperimentException, match="determined.pytorch.Reducer"):
        pytorch._prepare_metrics_reducers({"a": "avg"}, ["a"])


def test_convert_metrics_to_numpy() -> None:
    m = {"t": torch.tensor([1.0, 2.0]), "f": 1.0}
    out = pytorch._convert_metrics_to_numpy(m)
    assert out is m and isinstance(m["t"], np.ndarray) and m["f"] == 1.0


def validation_on_ranks(ctx: core.DistributedContext) -> Dict[str, Any]:
    # Rank r has r batches: rank 0's shard is empty (FIX-11), rank 2 has 2 batches.
    batches = [{"x": np.float64(10 * ctx.rank + i), "y": np.float64(1)} for i in range(ctx.rank)]
    keys = batches[0].keys() if batches else None
    reducers = {"x": pytorch.Reducer.AVG, "y": pytorch.Reducer.SUM}
    return pytorch._reduce_metrics(ctx, batches, keys, reducers)


def test_reduce_metrics_across_ranks_with_an_empty_shard() -> None:
    results = run_threads(1, 3, validation_on_ranks)
    # Per-batch values: rank1 [10], rank2 [20, 21]. AVG weighted by batch counts == mean of
    # per-batch values; SUM sums per-rank sums.
    assert results[0]["x"] == pytest.approx((10 + 20 + 21) / 3)
    assert results[0]["y"] == 3
    assert results[1] == {} and results[2] == {}


def test_reduce_metrics_single_process() -> None:
    class One:
        size, rank = 1, 0

        def gather(self, stuff: Any) -> Any:
            raise AssertionError("no gather in a single process")

    batches = [{"a": np.float64(v)} for v in VALUES]
    out = pytorch._reduce_metrics(One(), batches, ["a"], {"a": pytorch.Reducer.AVG})
    assert round(float(out["a"]), 2) == 4.98
    assert pytorch._reduce_metrics(One(), [], None, {}) == {}


def test_combine_and_average_training_metrics_threads() -> None:
    def body(ctx: core.DistributedContext) -> List[Dict[str, Any]]:
        per_batch = [{"loss": float(ctx.rank + b)} for b in range(3)]
        return pytorch._combine_and_average_training_metrics(ctx, per_batch)

    results = run_threads(1, 2, body)
    assert [m["loss"] for m in results[0]] == [0.5, 1.5, 2.5]  # chief: mean over ranks
    assert [m["loss"] for m in results[1]] == [1.0, 2.0, 3.0]  # others keep theirs


def test_to_python() -> None:
    assert mu._to_python({"a": np.float32(1.5), "b": [torch.tensor([1, 2])]}) == {
        "a": 1.5,
        "b": [[1, 2]],
    }


GLOO_SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    from determined_launch.pytorch.metrics.reducer import _PyTorchReducerContext

    def allgather(obj):
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    reducers = _PyTorchReducerContext(allgather)
    order = reducers.wrap_reducer(lambda batches: [v for b in batches for v in b], name="order")
    batches = [list(range(i, min(i + 2, 47))) for i in range(0, 47, 2)]
    for b in batches[rank::size]:
        order.update(b)
    result = reducers.reduce_metrics(for_training=False)["order"]
    print(f"rank {rank} sum {sum(result)} ordered {result == list(range(47))}", flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_reducer_over_real_gloo_ranks_under_the_launcher(tmp_path: Path) -> None:
    script = tmp_path / "reduce.py"
    script.write_text(GLOO_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", "--slots", "2", "torch", "--",
         sys.executable, str(script)],
        env=base_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for rank in range(2):
        assert f"rank {rank} sum 1081 ordered True" in out, out
