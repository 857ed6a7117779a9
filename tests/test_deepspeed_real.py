"""The DeepSpeed launcher for real: deepspeed 0.19.8 on CPU with gloo.

Start-up is the cost here (each worker imports deepspeed and torch), so
there are few runs and each checks several things. DeepSpeed JIT-compiles
a C++ op on first use; ``scripts/install_deepspeed.sh`` builds it into the
shared TORCH_EXTENSIONS_DIR cache that these runs use.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from determined_launch.backends.ssh import HostFacts
from tests._hvdds_helpers import (
    Launch,
    assert_failure_stops_both_nodes,
    assert_sigterm_stops_every_worker,
    check_worker_lines,
    extensions_dir,
    installed,
    node_launches,
    real_env,
    worker,
)
from tests.conftest import free_port_block, launcher_cmd

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not installed("deepspeed"),
        reason="deepspeed is not installed (scripts/install_deepspeed.sh)",
    ),
]
MODULE = "determined_launch.deepspeed"
PROBE = "two words 'quoted' \"double\" $HOME `tick` back\\slash;"


@pytest.fixture(autouse=True, scope="module")
def _no_stale_jit_lock() -> None:
    """A killed JIT build leaves a lock that makes init_distributed wait forever."""
    lock = extensions_dir() / "deepspeed_shm_comm" / "lock"
    if lock.exists():
        pytest.fail(f"stale torch JIT lock {lock}: remove it or run scripts/install_deepspeed.sh")


def _shm_buffers() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")}


def test_single_node_two_workers(tmp_path: Path, launches: list[Launch]) -> None:
    before = _shm_buffers()
    launch = Launch(
        launcher_cmd(*worker("ds_worker.py"), module=MODULE),
        real_env(tmp_path / "tmp", DET_LAUNCH_SLOTS="2"),
    )
    launches.append(launch)
    assert launch.wait(300) == 0, launch.stdout + launch.stderr
    check_worker_lines(launch.stdout, range(2), 2, cross="0/1")
    assert "job succeeded" in launch.stderr
    assert launch.leftovers() == []
    assert list((tmp_path / "tmp").iterdir()) == []  # job directory removed
    assert not (tmp_path / ".deepspeed_env").exists()
    # DeepSpeed maps 69 MB of /dev/shm per rank and never unlinks it.
    assert _shm_buffers() <= before


def test_two_nodes_without_ssh(tmp_path: Path, launches: list[Launch]) -> None:
    nodes = node_launches(
        tmp_path, MODULE, worker("ds_worker.py"), ["127.0.0.1", "127.0.0.2"], [2, 2]
    )
    launches += nodes
    for node in reversed(nodes):
        assert node.wait(300) == 0, node.stdout + node.stderr
    check_worker_lines(nodes[0].stdout, range(0, 2), 4, cross="0/2")
    check_worker_lines(nodes[1].stdout, range(2, 4), 4, cross="1/2")
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
    lines = check_worker_lines(nodes[0].stdout, range(4), 4, probe=PROBE.encode().hex())
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
    assert_failure_stops_both_nodes(nodes)


def test_sigterm_stops_every_worker(tmp_path: Path, launches: list[Launch]) -> None:
    assert_sigterm_stops_every_worker(tmp_path, launches, MODULE, "ds_worker.py")
