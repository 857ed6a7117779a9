"""DistributedContext.from_tf_config(): TF_CONFIG read as Determined 0.38.1 reads it.

TensorFlow is not a dependency (and not installed in CI), so the strategy
half is covered by its one-line error; the layout half is pure and, for
several workers, checked against real contexts on loopback.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from determined_launch.core.distributed import DistributedConfigError, DistributedContext
from determined_launch.core.distributed.env import Layout, read_tf_config
from tests.conftest import free_port_block


def tf_config(workers: Any, index: Any = 0, task_type: str = "worker", **extra: Any) -> str:
    return json.dumps(
        {"cluster": {"worker": workers, **extra}, "task": {"type": task_type, "index": index}}
    )


def test_unset_or_one_worker_is_a_single_process_job() -> None:
    assert read_tf_config({}) is None
    assert read_tf_config({"TF_CONFIG": tf_config(["h0:2222"])}) is None


def test_several_workers_one_per_node_chief_on_the_first() -> None:
    env = {"TF_CONFIG": tf_config(["10.0.0.5:2222", "10.0.0.6:2222", "h2:1"], index=2)}
    assert read_tf_config(env) == Layout(2, 3, 0, 1, 2, 3, "TF_CONFIG", "10.0.0.5")


@pytest.mark.parametrize(
    ("first", "host"),
    [("[fd00::1]:2222", "fd00::1"), ("node-a:2222", "node-a"), ("node-a", "node-a")],
)
def test_chief_host_from_the_first_worker_address(first: str, host: str) -> None:
    layout = read_tf_config({"TF_CONFIG": tf_config([first, "b:2"], index=1)})
    assert layout is not None and layout.chief_ip == host


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("{not json", "TF_CONFIG: not JSON"),
        (json.dumps({"cluster": {"worker": ["a:1"]}}), "TF_CONFIG: missing 'task'"),
        (json.dumps({"task": {"type": "worker"}, "cluster": {}}), "TF_CONFIG: missing 'worker'"),
        (json.dumps([1, 2]), "TF_CONFIG: not JSON"),
        (tf_config(["a:1", "b:1"], task_type="ps"), "task type 'ps'"),
        (tf_config(["a:1", "b:1"], task_type="chief"), "supports only worker tasks"),
        (tf_config("a:1,b:1"), "cluster.worker is not a list"),
        (tf_config(["a:1", "b:1"], index=2), "task.index 2 is not a worker index (0..1)"),
        (tf_config(["a:1", "b:1"], index="1"), "task.index '1'"),
    ],
)
def test_bad_tf_config_is_one_line_naming_the_field(raw: str, says: str) -> None:
    with pytest.raises(DistributedConfigError) as info:
        read_tf_config({"TF_CONFIG": raw})
    assert says in str(info.value) and "\n" not in str(info.value)
    # Determined raises RuntimeError for a non-worker task; ours is one too.
    assert isinstance(info.value, RuntimeError)


def test_without_tensorflow_a_one_line_error_names_the_install() -> None:
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover
        pytest.skip("TensorFlow is installed here")
    with pytest.raises(DistributedConfigError, match=r"needs TensorFlow.*pip install tensorflow"):
        DistributedContext.from_tf_config(env={})
    # A bad TF_CONFIG is reported as such, before TensorFlow is looked for.
    with pytest.raises(DistributedConfigError, match="task type 'ps'"):
        DistributedContext.from_tf_config(env={"TF_CONFIG": tf_config(["a:1", "b:1"], 0, "ps")})


def test_the_layout_makes_real_contexts_that_agree() -> None:
    """Two workers on loopback: the contexts built from TF_CONFIG's layout
    connect (one per "node", chief on worker 0's host) and allgather."""
    port = free_port_block(1)
    workers = ["127.0.0.1:2222", "127.0.0.1:2223"]
    results: dict[int, Any] = {}

    def work(index: int) -> None:
        env = {"TF_CONFIG": tf_config(workers, index), "DET_DIST_SECRET": "s" * 32}
        layout = read_tf_config(env)
        assert layout is not None
        kwargs = {"port": port, "timeout": 20}
        with DistributedContext._from_layout(layout, None, env, kwargs) as ctx:
            results[index] = (ctx.cross_rank, ctx.cross_size, ctx.allgather(index * 10))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: (0, 2, [0, 10]), 1: (1, 2, [0, 10])}
