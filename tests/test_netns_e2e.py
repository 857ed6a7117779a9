"""Nodes that really are different network hosts.

Each "host" is a network namespace with its own loopback and one end of a
veth pair; its only other address is a private 10.x address that exists
inside the namespaces this test creates (nothing reaches the machine's real
network). Each launcher runs under ``ip netns exec`` and ``unshare --uts``
with its own host name, and learns the hosts from a cluster-info file. This
checks what loopback tests cannot: that the chief listens on the address the
other node dials, and that nothing assumes a shared loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import WORKERS, Launch, base_env, free_port_block, write_cluster_info

pytestmark = pytest.mark.slow
ADDRS = ("10.87.0.1", "10.87.0.2")  # exist only inside this test's namespaces


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@pytest.fixture
def two_hosts() -> Iterator[list[str]]:
    """Two namespaces joined by a veth pair; removed afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs ip (iproute2) and unshare (util-linux)")
    names = [f"detl-{uuid.uuid4().hex[:8]}-{i}" for i in (0, 1)]
    made: list[str] = []
    try:
        for ns in names:
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", "name", "eth0", "netns", names[0], "type", "veth",
            "peer", "name", "eth0", "netns", names[1])  # fmt: skip
        for ns, addr in zip(names, ADDRS):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        stderr = getattr(e, "stderr", b"") or b""
        pytest.skip(f"cannot create network namespaces here: {stderr.decode().strip() or e}")
    try:
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def test_two_hosts_form_one_world(
    two_hosts: list[str], tmp_path: Path, launches: list[Launch]
) -> None:
    port = free_port_block()
    slots = [2, 1]
    nodes = []
    for rank, ns in enumerate(two_hosts):
        info = write_cluster_info(
            tmp_path / f"host{rank}.json",
            container_addrs=list(ADDRS),
            container_rank=rank,
            container_slot_counts=slots,
        )
        env = base_env(
            DET_CLUSTER_INFO_FILE=str(info),
            C10D_PORT=str(port),
            DET_DIST_SECRET="netns-e2e-" + "n" * 22,
            GLOO_SOCKET_IFNAME="eth0",  # the veth: loopback is private to each host
        )
        argv = [
            "ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
            f'hostname host{rank} && echo "on $(hostname)" && exec "$@"', "sh",
            sys.executable, "-m", "determined_launch.torch_distributed",
            sys.executable, str(WORKERS / "allreduce.py"),
        ]  # fmt: skip
        nodes.append(Launch(argv, env))
    launches += nodes
    for rank, node in enumerate(nodes):
        assert node.wait(150) == 0, node.stdout + node.stderr
        assert f"on host{rank}" in node.stdout
    out = nodes[0].stdout + nodes[1].stdout
    found = re.findall(r"world=(\d+) rank=(\d+) sum=(\d+) chief=(\S+)", out)
    assert sorted(found) == [("3", str(r), "6", ADDRS[0]) for r in range(3)]
    assert re.findall(r"rank=(\d+) sum", nodes[1].stdout) == ["2"]  # host1 ran rank 2
    for node in nodes:
        assert node.leftovers() == []
