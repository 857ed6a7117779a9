"""Host list expansion, compression and SLURM task counts."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from determined_launch.cluster.hostlist import (
    compress_hostlist,
    expand_hostlist,
    group_hosts,
    parse_task_counts,
    resolve_hosts,
    this_host_index,
)
from determined_launch.errors import ClusterInfoError


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[001-003,010],cpu7", ["gpu001", "gpu002", "gpu003", "gpu010", "cpu7"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("a,b,c", ["a", "b", "c"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        (
            "rack[1-2]-node[01-02].ib",
            [
                "rack1-node01.ib",
                "rack1-node02.ib",
                "rack2-node01.ib",
                "rack2-node02.ib",
            ],
        ),
        ("n[9-11],x[3]", ["n9", "n10", "n11", "x3"]),
        (" n[1-2] ", ["n1", "n2"]),
        ("host-1.example.com", ["host-1.example.com"]),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text, problem",
    [
        ("n[1-2", "unmatched '['"),
        ("n1-2]", "unmatched ']'"),
        ("n[[1-2]]", "nested"),
        ("n[2-1]", "descending"),
        ("n[a-b]", "bad range"),
        ("n[]", "bad range"),
        ("a,,b", "empty element"),
        ("", "empty host list"),
    ],
)
def test_expand_errors_name_the_variable(text: str, problem: str) -> None:
    with pytest.raises(ClusterInfoError, match=re.escape(problem)) as e:
        expand_hostlist(text, "SLURM_JOB_NODELIST")
    assert str(e.value).startswith("SLURM_JOB_NODELIST: ")


@pytest.mark.parametrize(
    "text, counts",
    [("2(x3),1", [2, 2, 2, 1]), ("2(x2)", [2, 2]), ("4", [4]), ("1,3(x2),2", [1, 3, 3, 2])],
)
def test_task_counts(text: str, counts: list[int]) -> None:
    assert parse_task_counts(text, "SLURM_TASKS_PER_NODE") == counts


@pytest.mark.parametrize("text", ["2(x)", "x", "2(3)", "", "2,,1"])
def test_task_counts_errors(text: str) -> None:
    with pytest.raises(ClusterInfoError, match="SLURM_TASKS_PER_NODE"):
        parse_task_counts(text, "SLURM_TASKS_PER_NODE")


def test_compress_examples() -> None:
    hosts = ["gpu001", "gpu002", "gpu003", "gpu010", "cpu7"]
    assert compress_hostlist(hosts) == "gpu[001-003,010],cpu7"
    assert compress_hostlist(["n1", "n2"]) == "n[1-2]"
    assert compress_hostlist(["login"]) == "login"


# --- properties -------------------------------------------------------------

# Host names start with a letter (and "-x" would be an option to scontrol).
prefixes = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abxyz"),
    st.text(alphabet="abcxyz-.", max_size=3),
).filter(lambda p: not p[-1].isdigit())


@st.composite
def numbered_hosts(draw: st.DrawFn) -> list[str]:
    """Host names as clusters name them: prefix + number, maybe zero padded."""
    names = []
    for _ in range(draw(st.integers(1, 12))):
        prefix = draw(prefixes)
        number = draw(st.integers(0, 120))
        width = draw(st.sampled_from([0, 2, 3]))
        names.append(prefix + str(number).zfill(width))
    return names


@settings(max_examples=150, deadline=None)
@given(numbered_hosts())
def test_compress_then_expand_round_trips(hosts: list[str]) -> None:
    assert expand_hostlist(compress_hostlist(hosts)) == hosts


@st.composite
def bracket_expressions(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A random hostlist expression and, built independently, its expansion."""
    parts, expected = [], []
    for _ in range(draw(st.integers(1, 3))):
        segments: list[tuple[str, list[str]]] = []
        for _ in range(draw(st.integers(1, 2))):
            prefix = draw(prefixes)
            width = draw(st.sampled_from([1, 2, 3]))
            items, values = [], []
            for _ in range(draw(st.integers(1, 3))):
                lo = draw(st.integers(0, 30))
                hi = lo + draw(st.integers(0, 3))
                fmt = [str(n).zfill(width) for n in range(lo, hi + 1)]
                items.append(fmt[0] if lo == hi else f"{fmt[0]}-{fmt[-1]}")
                values += fmt
            segments.append((prefix, [prefix + v for v in values]))
            segments[-1] = (f"{prefix}[{','.join(items)}]", segments[-1][1])
        parts.append("".join(text for text, _ in segments))
        expected += ["".join(c) for c in itertools.product(*(vals for _, vals in segments))]
    return ",".join(parts), expected


@settings(max_examples=150, deadline=None)
@given(bracket_expressions())
def test_expand_generated_expressions(case: tuple[str, list[str]]) -> None:
    text, expected = case
    assert expand_hostlist(text) == expected


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``scontrol show hostnames`` needs some slurm.conf, not a controller."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol (slurm-client) is not installed")
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def test_expand_agrees_with_scontrol(scontrol_env: dict[str, str]) -> None:
    """SLURM's own expansion is the reference, on generated expressions."""

    @settings(max_examples=20, deadline=None)
    @given(bracket_expressions())
    def check(case: tuple[str, list[str]]) -> None:
        text, _ = case
        r = subprocess.run(
            ["scontrol", "show", "hostnames", text],
            env=scontrol_env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert expand_hostlist(text) == r.stdout.split()

    check()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=10))
def test_task_counts_round_trip(counts: list[int]) -> None:
    runs = [(k, len(list(g))) for k, g in itertools.groupby(counts)]
    text = ",".join(f"{k}(x{n})" if n > 1 else str(k) for k, n in runs)
    assert parse_task_counts(text, "X") == counts


# --- hosts of a job ---------------------------------------------------------


def test_group_hosts_keeps_first_appearance_order() -> None:
    assert group_hosts(["b", "b", "a", "b", "a"]) == (["b", "a"], [3, 2])


def test_this_host_index_matches_short_and_full_names() -> None:
    hosts = ["node1.cluster", "node2.cluster"]
    assert this_host_index(hosts, "node2.cluster", "X") == 1
    assert this_host_index(hosts, "node2", "X") == 1
    assert this_host_index(["node1", "node2"], "node2.cluster", "X") == 1
    with pytest.raises(ClusterInfoError, match="'node3' is not in the job's host list"):
        this_host_index(hosts, "node3", "X")


def test_resolve_hosts_names_the_unresolvable_host() -> None:
    assert resolve_hosts(["localhost", "127.0.0.2"], "X") == ["127.0.0.1", "127.0.0.2"]
    with pytest.raises(ClusterInfoError, match=r"X: cannot resolve host 'no-such-host\.invalid'"):
        resolve_hosts(["localhost", "no-such-host.invalid"], "X")


def test_resolve_hosts_retries_until_the_deadline() -> None:
    """Kubernetes pods appear in DNS late; unknown names are retried."""
    start = time.monotonic()
    with pytest.raises(ClusterInfoError, match="'no-such-host.invalid'"):
        resolve_hosts(["no-such-host.invalid"], "X", wait_s=1.5)
    assert time.monotonic() - start >= 1.5


def test_resolve_hosts_refuses_loopback_mixed_with_network_addresses() -> None:
    with pytest.raises(ClusterInfoError, match="'localhost' resolves to the loopback address"):
        resolve_hosts(["localhost", "192.0.2.7"], "SLURM_STEP_NODELIST")
