"""DistributedContext end to end: real sockets, threads and processes."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from determined_launch.core import DistributedContext, DistributedError
from determined_launch.core.distributed import DistributedConfigError, InsecureWarning
from determined_launch.core.distributed.env import Layout
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.wiring import Wiring
from tests._distributed_helpers import (
    SECRET,
    Job,
    child_env,
    exercise,
    expected,
    free_port,
    layouts,
    run_threads,
)

TRANSPORTS = ["direct", "zmq"]


@pytest.fixture
def ipc_dir(tmp_path: Path) -> str:
    path = tmp_path / "ipc"
    path.mkdir(mode=0o700)
    return str(path)


# ------------------------------------------------------------ semantics
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "cross,local",
    [(1, 2), (1, 3), (2, 1), (2, 2), (3, 2), (2, 3)],
    ids=lambda v: str(v),
)
def test_seed_semantics_in_threads(cross: int, local: int, transport: str, ipc_dir: str) -> None:
    results = run_threads(cross, local, transport=transport, ipc_dir=ipc_dir)
    for lay, got in zip(layouts(cross, local), results):
        assert got == expected(lay), lay


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("cross,local", [(2, 2), (3, 2), (2, 1)], ids=lambda v: str(v))
def test_hierarchical_mode_has_the_same_semantics(cross: int, local: int, transport: str) -> None:
    results = run_threads(cross, local, transport=transport, hierarchical=True)
    for lay, got in zip(layouts(cross, local), results):
        assert got == expected(lay), lay


@pytest.mark.parametrize(
    "cross,local,transport,tcp",
    [(1, 3, "direct", False), (2, 2, "direct", False), (2, 2, "zmq", True), (1, 2, "zmq", False)],
)
def test_seed_semantics_in_processes(
    cross: int, local: int, transport: str, tcp: bool, ipc_dir: str
) -> None:
    job = Job(
        "semantics",
        cross,
        local,
        {"transport": transport, "ipc_dir": ipc_dir, "force_tcp": tcp},
    )
    job.wait(90)
    for lay in job.lays:
        assert job.out[lay["rank"]][0] == 0, job.out[lay["rank"]][2]
        assert job.result(lay["rank"]) == json.loads(json.dumps(expected(lay)))


def test_two_jobs_at_once_in_one_process() -> None:
    """Several contexts on different threads of one process."""
    results: dict[str, list[Any]] = {}

    def job(name: str, transport: str) -> None:
        results[name] = run_threads(1, 2, transport=transport)

    threads = [threading.Thread(target=job, args=(t, t)) for t in TRANSPORTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name in TRANSPORTS:
        assert results[name] == [expected(lay) for lay in layouts(1, 2)]


def test_size_one_needs_no_sockets_or_secret(recwarn: pytest.WarningsRecorder) -> None:
    ctx = DistributedContext(
        rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, env={}
    )
    assert ctx._wiring is None
    assert ctx.allgather(5) == [5] and ctx.gather(5) == [5] and ctx.broadcast(5) == 5
    assert ctx.allgather_local(5) == [5] and ctx.gather_local(5) == [5]
    assert ctx.broadcast_local(5) == 5
    ctx.close()
    ctx.close()
    assert not [w for w in recwarn if issubclass(w.category, InsecureWarning)]


def test_close_is_idempotent_and_closed_context_refuses(ipc_dir: str) -> None:
    def body(ctx: DistributedContext) -> Any:
        first = ctx.allgather(ctx.rank)
        ctx.close()
        ctx.close()
        with pytest.raises(DistributedError, match="closed"):
            ctx.allgather(1)
        return first

    assert run_threads(1, 2, body, ipc_dir=ipc_dir) == [[0, 1], [0, 1]]
    left = os.listdir(ipc_dir)
    assert left and all(name.endswith(".lock") for name in left), left  # sockets removed


def test_an_unpicklable_object_leaves_the_context_usable(ipc_dir: str) -> None:
    """Pickling fails before this rank's op count moves, on the chief and
    on a member alike: the user's error is raised, the job goes on."""

    def body(ctx: DistributedContext) -> Any:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            ctx.allgather(lambda: None)
        return ctx.allgather(ctx.rank)

    assert run_threads(1, 3, body, ipc_dir=ipc_dir) == [[0, 1, 2]] * 3


def test_what_a_collectives_exception_means_for_the_job() -> None:
    w = Wiring(
        Layout(0, 2, 0, 2, 0, 1, "test"),
        hierarchical=False,
        chief_ip=None,
        port=1,
        timeout=None,
        key=wire.job_key("x" * 16),
        drops=wire.DropLog(logging.getLogger("test")),
        ipc_dir=None,
        transport="direct",
    )
    lost = DistributedError("lost rank 1", [1])
    assert w.failed(lost) is lost
    interrupted = w.failed(KeyboardInterrupt())
    assert interrupted is not None and "interrupted by KeyboardInterrupt" in str(interrupted)
    assert w.failed(TypeError("cannot pickle")) is None


def test_forked_child_leaves_the_parents_sockets_alone(ipc_dir: str) -> None:
    """A fork (a data-loader worker) that closes its copy of the context
    must not close or unlink what the parent still uses."""

    def body(ctx: DistributedContext) -> Any:
        ctx.allgather(None)
        if ctx.rank == 0:
            pid = os.fork()
            if pid == 0:
                ctx.close()
                os._exit(0)
            os.waitpid(pid, 0)
        ctx.allgather(None)  # nobody goes on before the child is gone
        files = sorted(os.listdir(ipc_dir))
        return ctx.allgather(ctx.rank), files

    for got, files in run_threads(1, 2, body, ipc_dir=ipc_dir):
        assert got == [0, 1]
        assert any(name.endswith(".sock") for name in files), files


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_gather_does_not_wait_and_early_parts_are_kept_apart(transport: str) -> None:
    """Non-chiefs return from gather at once, so they can run several
    gathers ahead of a slow chief; each part must land in its own gather."""

    def body(ctx: DistributedContext) -> Any:
        if ctx.rank == 0:
            time.sleep(0.3)
        out = [ctx.gather((ctx.rank, i)) for i in range(4)]
        out.append(ctx.allgather(ctx.rank))
        return out

    results = run_threads(1, 3, body, transport=transport)
    assert results[0][:4] == [[(r, i) for r in range(3)] for i in range(4)]
    assert results[1][:4] == results[2][:4] == [None] * 4
    assert all(r[4] == [0, 1, 2] for r in results)


def test_mismatched_collectives_raise_instead_of_hanging() -> None:
    def body(ctx: DistributedContext) -> str:
        try:
            if ctx.rank == 0:
                ctx.allgather(1)
            else:
                ctx.broadcast(None)
        except DistributedError as e:
            return str(e)
        return "no error"

    for message in run_threads(1, 2, body, timeout=30):
        assert "mismatch" in message


def test_bad_layouts_are_config_errors() -> None:
    with pytest.raises(DistributedConfigError, match="inconsistent layout"):
        DistributedContext(rank=2, size=2, local_rank=0, local_size=2, cross_rank=0, cross_size=1)
    with pytest.raises(DistributedConfigError, match="chief"):
        DistributedContext(
            rank=1, size=2, local_rank=0, local_size=1, cross_rank=1, cross_size=2, env={}
        )


# ------------------------------------------------------------- security
def test_missing_secret_warns_once_and_still_works_on_one_node(ipc_dir: str) -> None:
    job = Job("plain", 1, 2, {"ipc_dir": ipc_dir}, env=child_env())
    job.wait(60)
    for rank in (0, 1):
        code, _, stderr = job.out[rank]
        assert code == 0, stderr
        assert job.result(rank)["out"] == [[0, 1], ["x", "x"]]
        assert stderr.count("InsecureWarning") == 1, stderr
        assert "DET_DIST_SECRET" in stderr


def test_no_secret_refuses_to_listen_across_nodes() -> None:
    with pytest.raises(DistributedConfigError, match="DET_DIST_SECRET"):
        DistributedContext(
            rank=0,
            size=2,
            local_rank=0,
            local_size=1,
            cross_rank=0,
            cross_size=2,
            chief_ip="127.0.0.1",
            port=free_port(),
            env={},
        )


def test_short_secret_is_rejected() -> None:
    with pytest.raises(DistributedConfigError, match="too short"):
        run_threads(1, 2, secret="short")


ROGUE = r"""
import json, os, pickle, socket, sys, time
import zmq

class Evil:
    def __init__(self, path):
        self.path = path
    def __reduce__(self):
        return (open, (self.path, "w"))

marker, endpoints = sys.argv[1], json.loads(sys.argv[2])
evil = pickle.dumps(Evil(marker))
forged = b"DL\x01\x05" + b"\0" * 20 + evil + b"\0" * 32   # a frame with a made-up MAC
ctx = zmq.Context()
socks = []
for ep in endpoints:
    for kind in (zmq.PUSH, zmq.DEALER, zmq.PUB, zmq.REQ):
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 500)
        s.connect(ep)
        socks.append((kind, s))
time.sleep(0.3)
for _ in range(3):
    for kind, s in socks:
        for payload in (evil, forged):
            try:
                s.send(payload, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
    time.sleep(0.1)
# Raw stream clients: pickles, and pickles framed for the direct transport.
for ep in endpoints:
    if ep.startswith("ipc://"):
        fam, addr = socket.AF_UNIX, ep[6:]
    else:
        host, port = ep[6:].rsplit(":", 1)
        fam, addr = socket.AF_INET, (host, int(port))
    for body in (evil, b"DLC1" + os.urandom(16) + len(forged).to_bytes(8, "big") + forged):
        try:
            with socket.socket(fam) as c:
                c.settimeout(2)
                c.connect(addr)
                c.sendall(body)
                time.sleep(0.05)
        except OSError:
            pass
for _, s in socks:
    s.close()
ctx.term()
print("rogue done", len(endpoints))
"""


def _listening(pids: list[int], ipc_dir: str) -> list[str]:
    endpoints = []
    for pid in pids:
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                endpoints.append(f"tcp://127.0.0.1:{conn.laddr.port}")
    endpoints += [f"ipc://{ipc_dir}/{n}" for n in os.listdir(ipc_dir) if n.endswith(".sock")]
    return endpoints


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rogue_peers_never_get_unpickled(transport: str, tmp_path: Path, ipc_dir: str) -> None:
    """A rogue process connects to every listening port with PUSH, DEALER,
    PUB and REQ sockets (and raw streams) and sends pickles whose
    unpickling would create a file."""
    marker = tmp_path / "pwned"
    ready = tmp_path / "ready"
    ready.mkdir()
    stop = tmp_path / "stop"
    args = {
        "transport": transport,
        "ipc_dir": ipc_dir,
        "ready": str(ready),
        "stop": str(stop),
    }
    job = Job("soak", 2, 2, args)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(ready)) < 4:
            assert time.monotonic() < deadline, "job did not start"
            time.sleep(0.05)
        endpoints = _listening(job.pids, ipc_dir)
        # the chief's TCP port and both nodes' local links
        assert len(endpoints) >= 3, endpoints
        rogue = subprocess.run(
            [sys.executable, "-c", ROGUE, str(marker), json.dumps(endpoints)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rogue.returncode == 0, rogue.stderr
        stop.touch()
        job.wait(60)
    finally:
        job.kill()
    assert not marker.exists()
    results = [job.result(r) for r in range(4)]
    assert all(r["bad"] == 0 and r["rounds"] > 0 for r in results), results
    assert sum(r["dropped"] for r in results) > 0, results


# ---------------------------------------------------------------- failure
def _detected(job: Job, victim: int) -> list[dict[str, Any]]:
    job.wait(60)
    died = job.result(victim)["died_at"]
    seen = []
    for rank in job.procs:
        if rank == victim:
            continue
        got = job.result(rank)
        assert got["error"], f"rank {rank} did not notice rank {victim} died"
        assert victim in got["missing"], got
        assert f"rank {victim}" in got["error"] or f"ranks {victim}" in got["error"], got
        assert got["again"], "a failed context must keep failing"
        assert got["at"] - died < 10, got
        seen.append(got)
    return seen


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_peer_death_fails_every_pending_collective(transport: str, ipc_dir: str) -> None:
    job = Job("die", 1, 3, {"victim": 2, "transport": transport, "ipc_dir": ipc_dir})
    for got in _detected(job, victim=2):
        assert got["at"] - got["start"] < 8


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chief_death_fails_every_pending_collective(transport: str) -> None:
    job = Job("die", 1, 3, {"victim": 0, "transport": transport, "force_tcp": True})
    _detected(job, victim=0)


def test_death_on_another_node_fails_the_next_collective(ipc_dir: str) -> None:
    job = Job("die", 2, 2, {"victim": 3, "pending": False, "ipc_dir": ipc_dir})
    _detected(job, victim=3)


def test_local_chief_death_in_hierarchical_mode(ipc_dir: str) -> None:
    job = Job("die", 2, 2, {"victim": 2, "hierarchical": True, "ipc_dir": ipc_dir})
    _detected(job, victim=2)


def test_timeout_names_the_ranks_that_did_not_come() -> None:
    def body(ctx: DistributedContext) -> Any:
        if ctx.rank == 2:
            time.sleep(2.5)
            return None
        try:
            ctx.allgather(ctx.rank)
        except DistributedError as e:
            return e
        return None

    start = time.monotonic()
    results = run_threads(1, 3, body, timeout=30, env={"DET_DIST_TIMEOUT": "1"})
    assert time.monotonic() - start < 10
    assert isinstance(results[0], DistributedError)
    assert results[0].missing_ranks == (2,)
    assert "timed out" in str(results[0])
    assert isinstance(results[1], DistributedError)  # told by the chief's abort


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exit_never_hangs_on_a_stalled_peer(transport: str, tmp_path: Path) -> None:
    """A 20 MB broadcast to a stopped worker, then exit without close():
    ZeroMQ lingers at most 1 s; the direct transport's send gives up at the
    timeout."""
    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    args = {"transport": transport, "timeout": 2, "ready": str(ready), "stopped": str(stopped)}
    job = Job("stall_exit", 1, 2, args)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(job.procs[1].pid, signal.SIGSTOP)
        stopped.touch()
        chief = job.procs[0]
        stdout, stderr = chief.communicate(timeout=20)
        assert chief.returncode == 0, stderr
        line = json.loads(stdout.splitlines()[0])
        exited = time.time()
        assert exited - line["leaving_at"] < 5
        if transport == "direct":
            assert "timed out" in line["broadcast_error"]
    finally:
        os.kill(job.procs[1].pid, signal.SIGKILL)
        job.kill()


# ------------------------------------------------------------- ports
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("cross", [1, 2])
def test_busy_port_is_a_clear_error(transport: str, cross: int) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(DistributedConfigError) as info:
            DistributedContext(
                rank=0,
                size=2,
                local_rank=0,
                local_size=2 // cross,
                cross_rank=0,
                cross_size=cross,
                chief_ip="127.0.0.1",
                port=port,
                secret=SECRET,
                transport=transport,
                force_tcp=True,
            )
    assert str(port) in str(info.value) and "DET_DIST_PORT" in str(info.value)


def test_second_context_on_the_same_ipc_name_is_a_clear_error(ipc_dir: str) -> None:
    port = free_port()

    def body(ctx: DistributedContext) -> Any:
        ctx.allgather(None)
        if ctx.rank == 0:
            with pytest.raises(DistributedConfigError, match="in use"):
                DistributedContext(
                    rank=0,
                    size=2,
                    local_rank=0,
                    local_size=2,
                    cross_rank=0,
                    cross_size=1,
                    port=port,
                    secret=SECRET,
                    ipc_dir=ipc_dir,
                )
        return ctx.allgather(ctx.rank)

    assert run_threads(1, 2, body, port=port, ipc_dir=ipc_dir) == [[0, 1], [0, 1]]


def test_single_node_listens_only_on_loopback_or_ipc(ipc_dir: str) -> None:
    def body(ctx: DistributedContext) -> Any:
        me = psutil.Process()
        return [
            c.laddr.ip for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
        ]

    for force_tcp in (False, True):
        for listening in run_threads(1, 2, body, ipc_dir=ipc_dir, force_tcp=force_tcp):
            assert all(ip == "127.0.0.1" for ip in listening), listening


def test_env_configures_port_secret_and_ipc(ipc_dir: str) -> None:
    port = free_port()
    env = {"DET_DIST_PORT": str(port), "DET_DIST_SECRET": SECRET, "DET_DIST_IPC_DIR": ipc_dir}

    def body(ctx: DistributedContext) -> Any:
        got = ctx.port, ctx.allgather(ctx.rank), sorted(os.listdir(ipc_dir))
        ctx.allgather(None)  # nobody closes (and removes its socket) before all listed
        return got

    for got in run_threads(1, 2, body, port=None, secret=None, env=env):
        assert got[0] == port and got[1] == [0, 1]
        assert f"dist-{port}.sock" in got[2]


# ------------------------------------------------------- constructors
def test_from_horovod_reads_the_module(ipc_dir: str) -> None:
    class Hvd:
        def __init__(self, rank: int) -> None:
            self._rank = rank

        def rank(self) -> int:
            return self._rank

        def local_rank(self) -> int:
            return self._rank

        def size(self) -> int:
            return 2

        def local_size(self) -> int:
            return 2

        def cross_rank(self) -> int:
            return 0

        def cross_size(self) -> int:
            return 1

    port = free_port()
    out: list[Any] = [None, None]

    def work(rank: int) -> None:
        ctx = DistributedContext.from_horovod(Hvd(rank), port=port, secret=SECRET)
        out[rank] = ctx.allgather(rank)
        ctx.close()

    threads = [threading.Thread(target=work, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == [[0, 1], [0, 1]]


def test_from_env_without_launcher_is_size_one() -> None:
    ctx = DistributedContext.from_env(env={})
    assert (ctx.rank, ctx.size, ctx.cross_size) == (0, 1, 1)


TORCHRUN_TIMEOUT = 180


@pytest.mark.slow
def test_from_torch_distributed_under_two_torchrun_nodes(tmp_path: Path) -> None:
    """Two torchrun agents on 127.0.0.1 (--nnodes 2, 2 workers each)."""
    master = free_port()
    dist_port = free_port()
    env = child_env(DET_DIST_SECRET=SECRET, DET_DIST_PORT=str(dist_port), OMP_NUM_THREADS="1")
    helper = str(Path(__file__).parent / "_distributed_helpers.py")
    args = json.dumps({"out_dir": str(tmp_path)})
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(master),
                helper,
                "torchrun",
                args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for node in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=TORCHRUN_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    for lay in layouts(2, 2):
        got = json.loads((tmp_path / f"rank-{lay['rank']}.json").read_text())
        assert got.pop("layout") == lay
        assert got.pop("transport") == "direct"
        assert got.pop("ipc") is False  # bare torchrun: no private directory, loopback TCP
        assert got == json.loads(json.dumps(expected(lay)))


@pytest.mark.slow
def test_from_torch_distributed_under_det_launch_two_nodes(tmp_path: Path) -> None:
    """The real launcher, 2 simulated nodes x 2 slots: the environment it
    gives workers (ports, secret, ipc directory) is all they need."""
    from tests.conftest import Launch, base_env, free_port_block, launcher_cmd, write_cluster_info

    port = free_port_block()
    helper = str(Path(__file__).parent / "_distributed_helpers.py")
    launches = []
    try:
        for node in (0, 1):
            info = write_cluster_info(
                tmp_path / f"node{node}.json",
                container_addrs=["127.0.0.1", "127.0.0.1"],
                container_rank=node,
                container_slot_counts=[2, 2],
            )
            env = base_env(
                DET_CLUSTER_INFO_FILE=str(info), C10D_PORT=str(port), DET_DIST_SECRET=SECRET
            )
            cmd = launcher_cmd(
                sys.executable, helper, "torchrun", json.dumps({"out_dir": str(tmp_path)})
            )
            launches.append(Launch(cmd, env))
        for launch in launches:
            assert launch.wait(TORCHRUN_TIMEOUT) == 0, launch.stderr[-3000:]
    finally:
        for launch in launches:
            if launch.proc.poll() is None:
                launch.proc.kill()
                launch.proc.communicate()
            launch.kill_leftovers()
    for lay in layouts(2, 2):
        got = json.loads((tmp_path / f"rank-{lay['rank']}.json").read_text())
        assert got.pop("layout") == lay
        got.pop("transport")
        assert got.pop("ipc") is True  # node-local links over the launcher's private dir
        assert got == json.loads(json.dumps(expected(lay)))


def test_interpreter_exit_closes_contexts_without_close(ipc_dir: str) -> None:
    code = textwrap.dedent(
        f"""
        import threading
        from determined_launch.core import DistributedContext
        out = {{}}
        def work(r):
            ctx = DistributedContext(rank=r, size=2, local_rank=r, local_size=2, cross_rank=0,
                cross_size=1, port={free_port()}, secret={SECRET!r}, ipc_dir={ipc_dir!r},
                transport="zmq")
            out[r] = ctx.allgather(r)
        ts = [threading.Thread(target=work, args=(r,)) for r in (0, 1)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print(out)
        """
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert "{0: [0, 1], 1: [0, 1]}" in proc.stdout or "{1: [0, 1], 0: [0, 1]}" in proc.stdout
    assert time.monotonic() - start < 15


def test_exercise_matches_expected_for_size_one() -> None:
    """The helpers themselves: ``expected`` must describe a real run."""
    ctx = DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)
    assert exercise(ctx) == expected(layouts(1, 1)[0])
