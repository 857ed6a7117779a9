"""The DeepSpeed launcher for real: deepspeed 0.19.8 on CPU with gloo.

Start-up is the cost here (each worker imports deepspeed and torch), so
there are few runs and each checks several things. DeepSpeed JIT-compiles
a C++ op on first use; ``scripts/install_deepspeed.sh`` builds it into the
shared TORCH_EXTENSIONS_DIR cache that these runs use.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from determined_launch.backends.ssh import HostFacts
from tests._hvdds_helpers import (
    REPO,
    Launch,
    extensions_dir,
    installed,
    node_launches,
    rank_lines,
    real_env,
    worker,
)
from tests.conftest import free_port_block, launcher_cmd, wait_for_file

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not installed("deepspeed"),
        reason="deepspeed is not installed (scripts/install_deepspeed.sh)",
    ),
]
MODULE = "determined_launch.deepspeed"
HAVE_DCTX = (REPO / "determined_launch" / "core" / "distributed.py").exists()
PROBE = "two words 'quoted' \"double\" $HOME `tick` back\\slash;"


@pytest.fixture(autouse=True, scope="module")
def _no_stale_jit_lock() -> None:
    """A killed JIT build leaves a lock that makes init_distributed wait forever."""
    lock = extensions_dir() / "deepspeed_shm_comm" / "lock"
    if lock.exists():
        pytest.fail(f"stale torch JIT lock {lock}: remove it or run scripts/install_deepspeed.sh")


def check_ranks(out: str, ranks: range, world: int, **expect: str) -> dict[int, dict[str, str]]:
    lines = rank_lines(out)
    assert set(lines) == set(ranks), out
    for r in ranks:
        f = lines[r]
        assert f["world"] == str(world), f
        assert f["sum"] == str(world * (world + 1) // 2), f
        assert f["use"] == "1" and f["chief"] == "127.0.0.1", f
        assert f["secret"] == "True" and f["leak"] == "False", f
        if HAVE_DCTX:
            assert f["dctx"] == "ok", f
        for k, v in expect.items():
            assert f[k] == v, (k, f)
    return lines


def test_single_node_two_workers(tmp_path: Path, launches: list[Launch]) -> None:
    launch = Launch(
        launcher_cmd(*worker("ds_worker.py"), module=MODULE),
        real_env(tmp_path / "tmp", DET_LAUNCH_SLOTS="2"),
    )
    launches.append(launch)
    assert launch.wait(300) == 0, launch.stdout + launch.stderr
    check_ranks(launch.stdout, range(2), 2, cross="0/1")
    assert "job succeeded" in launch.stderr
    assert launch.leftovers() == []
    assert list((tmp_path / "tmp").iterdir()) == []  # job directory removed
    assert not (tmp_path / ".deepspeed_env").exists()


def test_two_nodes_without_ssh(tmp_path: Path, launches: list[Launch]) -> None:
    nodes = node_launches(
        tmp_path, MODULE, worker("ds_worker.py"), ["127.0.0.1", "127.0.0.2"], [2, 2]
    )
    launches += nodes
    for node in reversed(nodes):
        assert node.wait(300) == 0, node.stdout + node.stderr
    check_ranks(nodes[0].stdout, range(0, 2), 4, cross="0/2")
    check_ranks(nodes[1].stdout, range(2, 4), 4, cross="1/2")
    assert all(n.leftovers() == [] for n in nodes)


def test_two_nodes_over_ssh_with_pdsh(tmp_path: Path, launches: list[Launch]) -> None:
    """Real sshd on 127.0.0.1 and 127.0.0.2 (one port), pdsh from the chief.
    The remote workers get the launcher's environment through the export
    file (PROBE survives DeepSpeed's quoting and the remote shell) and
    their own node's job directory through sshd."""
    facts = HostFacts.current()
    if not (facts.sshd and facts.ssh and shutil.which("pdsh")):
        pytest.skip("ssh mode needs sshd, ssh and pdsh (apt: openssh-server pdsh)")
    nodes = node_launches(
        tmp_path,
        MODULE,
        ["--ssh", "--", *worker("ds_worker.py")],
        ["127.0.0.1", "127.0.0.2"],
        [2, 2],
        DTRAIN_SSH_PORT=str(free_port_block(1)),
        DS_TEST_PROBE=PROBE,
    )
    launches += nodes
    assert nodes[0].wait(300) == 0, nodes[0].stdout + nodes[0].stderr
    assert nodes[1].wait(60) == 0, nodes[1].stdout + nodes[1].stderr
    # pdsh brings every rank's output back to the chief.
    lines = check_ranks(nodes[0].stdout, range(4), 4, probe=PROBE.encode().hex())
    for r in range(4):
        own_tmp = tmp_path / f"tmp{r // 2}"
        assert lines[r]["jobdir"].startswith(str(own_tmp)), lines[r]
    assert all(n.leftovers() == [] for n in nodes)


def test_failure_on_one_node_stops_both(tmp_path: Path, launches: list[Launch]) -> None:
    nodes = node_launches(
        tmp_path,
        MODULE,
        worker("ds_worker.py"),
        ["127.0.0.1", "127.0.0.2"],
        [1, 1],
        FAIL_RANK="1",
        FAIL_CODE="7",
    )
    launches += nodes
    assert nodes[1].wait(300) == 7, nodes[1].stdout + nodes[1].stderr
    failed_at = time.monotonic()
    assert nodes[0].wait(60) == 7, nodes[0].stdout + nodes[0].stderr
    assert time.monotonic() - failed_at < 20  # not a gloo timeout
    for node in nodes:
        assert "job failed: rank 1 on node 1 (127.0.0.2) exited with status 7 first" in (
            node.stderr
        ), node.stderr
        assert node.leftovers() == []


def test_sigterm_stops_every_worker(tmp_path: Path, launches: list[Launch]) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    env = real_env(
        tmp_path / "tmp",
        DET_LAUNCH_SLOTS="2",
        SLEEP_FOREVER="1",
        DET_PREEMPT_GRACE="1",
        READY_DIR=str(ready),
    )
    launch = Launch(launcher_cmd(*worker("ds_worker.py"), module=MODULE), env)
    launches.append(launch)
    for r in range(2):
        wait_for_file(ready / f"rank-{r}", 300, f"rank {r}")
    launch.send_signal(signal.SIGTERM)
    assert launch.wait(60) == 128 + signal.SIGTERM, launch.stderr
    assert "preemption grace period" in launch.stderr
    assert launch.leftovers() == []
