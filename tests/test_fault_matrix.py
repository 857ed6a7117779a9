"""The cheap half of docs/reliability.md's fault matrix, with real parts.

Each row is a function running one trial and returning ``None`` (held) or
what went wrong. The slow test runs each row a few times within a bounded
time; ``python3 -m tests.test_fault_matrix N`` runs every row N times and
prints trials and failures, which is how the table's numbers were measured.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
Outcome = Optional[str]


# --- torn journal -------------------------------------------------------------------
JOURNAL_CONFIG = """
name: j
entrypoint: model_def:Trial
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
searcher: {name: random, metric: loss, max_trials: 1000, max_length: {batches: 4}}
"""


def torn_journal(tmp: Path, rng: random.Random) -> Outcome:
    """A worker killed mid-append leaves a random prefix of a real record; the
    next workers append; the study stays whole and stock Optuna reads it."""
    import importlib

    optuna: Any = importlib.import_module("optuna")

    from determined_launch.experiment import searchers as se
    from determined_launch.experiment.expconf import load

    cfg = tmp / "exp.yaml"
    cfg.write_text(JOURNAL_CONFIG)
    search, path = se.Search(load(cfg)), tmp / "study.journal"

    def finish(value: float) -> None:
        study = se.load_study(se.open_storage(str(path), ""), "j", search)
        study.tell(study.ask(search.distributions()), value)

    finish(1.0)
    last = path.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    with path.open("ab") as f:
        f.write(last[: rng.randrange(1, len(last))])
    finish(2.0)
    finish(3.0)
    study = se.load_study(se.open_storage(str(path), ""), "j", search)
    values = sorted(t.value for t in study.get_trials() if t.value is not None)
    if values != [1.0, 2.0, 3.0]:
        return f"trials after the torn record: {values}"
    stock = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    if len(optuna.load_study(study_name="j", storage=stock).get_trials()) != 3:
        return "stock Optuna does not read the journal"
    return None


# --- replayed control channel -------------------------------------------------------
def replay(tmp: Path, rng: random.Random) -> Outcome:
    """Job A's chief->node bytes, recorded by a proxy, played to job B's node
    (same secret, port and node count) before job B's chief answers."""
    from determined_launch.supervisor.control import ChiefLink, ControlError, NodeLink
    from tests.conftest import free_port_block
    from tests.test_control import SECRET, Proxy, wait_for

    port = free_port_block(1)
    chief_a = ChiefLink("127.0.0.1", port, num_nodes=2, secret=SECRET)
    proxy = Proxy("127.0.0.2", port, port)
    node_a = NodeLink("127.0.0.2", port, 1, SECRET, connect_timeout=5, num_nodes=2)
    wait_for(lambda: chief_a.connected_nodes == {1})
    chief_a.deliver({"type": "abort", "status": 7, "n": rng.random()})
    wait_for(lambda: any(m.get("type") == "abort" for m in node_a.inbox))
    for closing in (node_a, chief_a, proxy):
        closing.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            chief_b = ChiefLink("127.0.0.1", port, num_nodes=2, secret=SECRET)
            break
        except ControlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    fake = Proxy("127.0.0.3", port, port, replay=proxy.recorded)
    try:
        node_b = NodeLink("127.0.0.3", port, 1, SECRET, connect_timeout=5, num_nodes=2)
        wait_for(lambda: chief_b.connected_nodes == {1})
        node_b.close()
        if any(m.get("type") == "abort" for m in node_b.inbox):
            return "job B's node took job A's verdict"
    finally:
        chief_b.close()
        fake.close()
    return None


# --- idle unauthenticated connections -----------------------------------------------
def idle_connections(tmp: Path, rng: random.Random, count: int = 100,
                     deadline: Optional[float] = None) -> Outcome:
    """``count`` idle clients on a DistributedContext hub port and on a
    control port; all closed after the handshake deadline, members served."""
    from determined_launch.core.distributed.transport import direct, wire
    from determined_launch.core.distributed.transport.chan import IdleTimeout
    from determined_launch.supervisor import control
    from tests.conftest import free_port_block

    saved = direct.HANDSHAKE_S, control.HEARTBEAT_TIMEOUT
    if deadline is not None:
        direct.HANDSHAKE_S = control.HEARTBEAT_TIMEOUT = deadline
    hub = direct.DirectHubChannel(wire.DropLog(logging.getLogger("matrix")), "matrix")
    chief = control.ChiefLink("127.0.0.1", free_port_block(1), num_nodes=2, secret="s" * 32)
    try:
        port = int(hub.bind("tcp://127.0.0.1:*").rsplit(":", 1)[1])
        cport = int(chief.listener.getsockname()[1])
        clients = [socket.create_connection(("127.0.0.1", p)) for p in (port, cport)
                   for _ in range(count)]
        for c in clients[: count // 2]:
            c.sendall(direct.PREAMBLE + os.urandom(16))
        end = time.monotonic() + direct.HANDSHAKE_S + 2.5
        while time.monotonic() < end:
            try:
                hub.recv(True)
            except IdleTimeout:
                pass
        still = 0
        for c in clients:
            c.settimeout(0.5)
            try:
                while c.recv(65536):
                    pass
            except socket.timeout:
                still += 1
            except OSError:
                pass
            c.close()
        return f"{still} of {len(clients)} idle connections still open" if still else None
    finally:
        direct.HANDSHAKE_S, control.HEARTBEAT_TIMEOUT = saved
        hub.close(0)
        chief.close()


# --- wire fuzz ----------------------------------------------------------------------
def wire_fuzz(tmp: Path, rng: random.Random, frames: int = 300) -> Outcome:
    """Random bytes, bare and after a valid preamble, over a real socket into
    the hub's parser: nothing registers, nothing raises, nothing is unpickled;
    then the control port (``control_fuzz``)."""
    import pickle

    from determined_launch.core.distributed.transport import direct, wire
    from determined_launch.core.distributed.transport.chan import IdleTimeout
    from determined_launch.core.distributed.transport.hub import Hub

    unpickled: list[bytes] = []
    real_loads = pickle.loads
    pickle.loads = lambda *a, **k: unpickled.append(a[0]) or real_loads(*a, **k)  # type: ignore
    drops = wire.DropLog(logging.getLogger("matrix.fuzz"))
    chan = direct.DirectHubChannel(drops, "fuzz")
    chan.bind(f"ipc://{tmp / 'h.sock'}")
    hub = Hub(chan, rank=0, key=wire.job_key("k" * 32), drops=drops, where="fuzz", expected=1,
              check_hello=lambda p: None)
    try:
        for i in range(frames):
            data = rng.randbytes(rng.randrange(0, 700))
            prefix = direct.PREAMBLE + rng.randbytes(16) if i % 2 else b""
            if i % 3 == 0:  # a plausible length prefix in front of the garbage
                data = len(data).to_bytes(8, "big") + data
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(tmp / "h.sock"))
                client.sendall(prefix + data)
                client.shutdown(socket.SHUT_WR)
                for _ in range(50):
                    try:
                        hub._recv(False)
                    except IdleTimeout:
                        pass
                    if not chan._by_fd:
                        break
        if hub.peers or unpickled:
            return f"peers {hub.peers}, unpickled {len(unpickled)}"
    finally:
        pickle.loads = real_loads
        chan.close(0)
    return control_fuzz(rng, frames // 3)


def control_fuzz(rng: random.Random, frames: int) -> Outcome:
    """Random bytes, bare and after a well-formed nonce line, into a chief's
    control port: no node connects, nothing reaches the chief's inbox."""
    from determined_launch.supervisor.control import ChiefLink
    from tests.conftest import free_port_block

    chief = ChiefLink("127.0.0.1", free_port_block(1), num_nodes=2, secret="c" * 32)
    port = int(chief.listener.getsockname()[1])
    try:
        for i in range(frames):
            nonce = f"{rng.getrandbits(128):032x}\n".encode() if i % 2 else b""
            with socket.create_connection(("127.0.0.1", port)) as client:
                try:  # the chief may hang up before all is sent
                    client.sendall(nonce + rng.randbytes(rng.randrange(0, 700)) + b"\n")
                    client.shutdown(socket.SHUT_WR)
                    client.settimeout(15)
                    while client.recv(65536):  # until the chief hangs up
                        pass
                except OSError:
                    pass
        if chief.connected_nodes or chief.inbox:
            return f"nodes {chief.connected_nodes}, inbox {list(chief.inbox)[:3]}"
    finally:
        chief.close()
    return None


# --- malformed cluster-info files ---------------------------------------------------
MALFORMED: list[tuple[bytes, str]] = [
    (b"{", "invalid JSON at line 1"),
    (b'{"container_addrs": ["127.0.0.1"], "container_rank": ' + b"7" * 5000
     + b', "container_slot_counts": [1]}', "an integer with 5000 digits"),
    (json.dumps({"container_addrs": ["127.0.0.1", "no-such-node.invalid"],
                 "container_rank": 1, "container_slot_counts": [1, 1]}).encode(),
     "cannot resolve host 'no-such-node.invalid'"),
    (json.dumps({"container_addrs": ["127.0.0.1"], "container_rank": 3,
                 "container_slot_counts": [1]}).encode(), "out of range"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[" * 100000, "nested too deeply"),
]


def malformed_file(tmp: Path, rng: random.Random) -> Outcome:
    """One malformed file through ``det-launch --dry-run``: exit 2, one line.
    Time is bounded loosely here (a loaded 2-core machine takes 5 s just to
    start Python under this load); test_bad_input.py holds the < 5 s bound."""
    from tests.conftest import base_env

    content, want = rng.choice(MALFORMED)
    path = tmp / "info.json"
    path.write_bytes(content)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--dry-run", "torch",
                        "--", "python", "-c", "pass"], capture_output=True, text=True,
                       timeout=60, env=base_env(DET_CLUSTER_INFO_FILE=str(path)))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    took = time.monotonic() - start
    if r.returncode != 2 or len(lines) != 1 or want not in lines[0] or took >= 20:
        return f"{want}: exit {r.returncode}, {len(lines)} lines, {took:.1f}s: {r.stderr[-200:]}"
    return None


# --- checkpoint SIGKILL (directory) -------------------------------------------------
SAVER = textwrap.dedent("""
    import sys
    from determined_launch import core
    with core.init(run_dir=sys.argv[1], checkpoint_storage=sys.argv[2]) as ctx:
        print("ready", flush=True)
        step = 0
        while True:
            step += 1
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _id):
                for i in range(4):
                    (path / f"part{i}").write_bytes(bytes([step % 251]) * 200_000)
""")


def _kill_a_saver(tmp: Path, run: Path, storage: str, seconds: float) -> bool:
    """Start ``SAVER`` and SIGKILL it ``seconds`` after it is ready; False if it never was."""
    script = tmp / "saver.py"
    script.write_text(SAVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(run), storage],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    ready = proc.stdout.readline() == b"ready\n"
    if ready:
        time.sleep(seconds)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return ready


def _committed(ctx: Any, size_of: Callable[[str, int], int]) -> Outcome:
    """Every committed checkpoint whole; ``latest()`` one of them."""
    ids = ctx.checkpoint.committed_ids()
    latest = ctx.checkpoint.latest()
    if ids and latest not in ids:
        return f"latest() {latest} is not committed"
    for sid in ids:
        sizes = [size_of(sid, i) for i in range(4)]
        if sizes != [200_000] * 4:
            return f"committed checkpoint {sid} is partial: {sizes}"
    return None


def checkpoint_sigkill(tmp: Path, rng: random.Random) -> Outcome:
    """A saver SIGKILLed at a random moment: every committed checkpoint is
    whole, and ``latest()`` names a committed one."""
    from determined_launch import core

    storage, run = tmp / "ckpts", tmp / "run"
    if not _kill_a_saver(tmp, run, str(storage), rng.uniform(0.05, 1.0)):
        return "the saver did not start"

    def size_of(sid: str, i: int) -> int:
        part = storage / sid / f"part{i}"
        return part.stat().st_size if part.is_file() else -1

    with core.init(run_dir=str(run), checkpoint_storage=str(storage)) as ctx:
        return _committed(ctx, size_of)


def checkpoint_sigkill_s3(tmp: Path, rng: random.Random, block: Optional[dict] = None
                          ) -> Outcome:
    """The same on S3 (moto's server), and the launcher's resume point is
    ``latest()``'s (issue 24, item 4.5)."""
    import yaml

    from determined_launch import core
    from determined_launch.cluster.info import ClusterInfo
    from determined_launch.cluster.local_trial import complete
    from determined_launch.core.storage import open_storage, parse_storage
    from determined_launch.launch.launcher import commit_check

    assert block is not None
    spec_file, run = tmp / "storage.yaml", tmp / "run"
    spec_file.write_text(yaml.safe_dump(block))
    if not _kill_a_saver(tmp, run, str(spec_file), rng.uniform(0.3, 4.0)):
        return "the saver did not start"
    backend: Any = open_storage(parse_storage(block, where="matrix"))

    def size_of(sid: str, i: int) -> int:
        path = f"{backend._path(sid)}/part{i}"
        return int(backend.fs.size(path)) if backend.fs.exists(path) else -1

    with core.init(run_dir=str(run), checkpoint_storage=block) as ctx:
        problem = _committed(ctx, size_of)
        latest = ctx.checkpoint.latest()
    if problem is not None:
        return problem
    env_ = {"DET_RUN_DIR": str(run), "DET_CHECKPOINT_STORAGE": str(spec_file)}
    info = ClusterInfo.from_mapping({"container_addrs": ["127.0.0.1"], "container_rank": 0,
                                     "container_slot_counts": [1]}, source="m", where="m")
    resume = complete(info, env_, is_committed=commit_check(env_, info)).latest_checkpoint
    if resume != latest:
        return f"the launcher resumes from {resume}, latest() is {latest}"
    return None


# --- SIGINT / SIGTERM, one node -----------------------------------------------------
def interrupted(tmp: Path, rng: random.Random) -> Outcome:
    """``det-launch exec`` whose worker sleeps, sent SIGINT or SIGTERM: exit
    130 / 143, and the worker is gone when the launcher returns."""
    from tests.conftest import base_env

    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    pid_file = tmp / "pid"
    code = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-m", "determined_launch.cli", "exec", "--",
                             sys.executable, "-c", code], env=base_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            return "the worker never started"
        time.sleep(0.05)
    proc.send_signal(sig)
    try:
        status = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return f"still running 30 s after {sig.name}"
    worker_left = Path(f"/proc/{pid_file.read_text()}").exists()
    want = 128 + sig
    if status != want or worker_left:
        return f"{sig.name}: exit {status} (want {want}), worker left: {worker_left}"
    return None


# --- two simulated nodes: node SIGKILL, first failure ------------------------------
def _two_exec_nodes(tmp: Path, codes: tuple[str, str]) -> tuple[list[subprocess.Popen[str]],
                                                                  list[Path]]:
    """``det-launch exec`` as two nodes on loopback, node N running ``codes[N]``
    after writing its pid; returns the launchers once both workers run."""
    from tests.conftest import base_env, free_port_block, write_cluster_info

    port = free_port_block()
    procs, pid_files = [], []
    for rank in (0, 1):
        info = write_cluster_info(tmp / f"node{rank}.json", container_addrs=["127.0.0.1"] * 2,
                                  container_rank=rank, container_slot_counts=[1, 1])
        pid_file = tmp / f"pid{rank}"
        code = (f"import os, sys, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))"
                f"; {codes[rank]}")
        env = base_env(DET_CLUSTER_INFO_FILE=str(info), C10D_PORT=str(port),
                       DET_DIST_SECRET="e" * 32, DET_KILL_AFTER="3")
        procs.append(subprocess.Popen([sys.executable, "-m", "determined_launch.cli", "exec",
                                       "--", sys.executable, "-c", code], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
        pid_files.append(pid_file)
    deadline = time.monotonic() + 60
    while not all(f.is_file() and f.read_text() for f in pid_files):
        if time.monotonic() > deadline:
            raise AssertionError("the workers never started")
        time.sleep(0.05)
    return procs, pid_files


def _outcome(procs: list[subprocess.Popen[str]], pid_files: list[Path], want: str,
             status: Optional[int]) -> Outcome:
    """The chief's end: status (``None``: any non-zero), ``want`` in its last
    line, and no worker left (after up to 10 s)."""
    try:
        try:
            _, err = procs[0].communicate(timeout=30)
        except subprocess.TimeoutExpired:
            return "the chief still runs after 30 s"
        end = time.monotonic() + 10
        while True:
            left = [f.name for f in pid_files if Path(f"/proc/{f.read_text()}").exists()]
            if not left or time.monotonic() > end:
                break
            time.sleep(0.1)
        last = (err.strip().splitlines() or [""])[-1]
        ok = procs[0].returncode != 0 if status is None else procs[0].returncode == status
        if not ok or want not in last or left:
            return f"chief exit {procs[0].returncode}, workers left {left}: {last}"
        return None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def node_sigkill(tmp: Path, rng: random.Random) -> Outcome:
    """Node 1's launcher SIGKILLed: the chief stops with a non-zero status
    naming node 1, and no worker is left."""
    procs, pids = _two_exec_nodes(tmp, ("time.sleep(600)", "time.sleep(600)"))
    time.sleep(rng.uniform(0, 1))
    procs[1].send_signal(signal.SIGKILL)
    return _outcome(procs, pids, "node 1", None)


def first_failure(tmp: Path, rng: random.Random) -> Outcome:
    """Node 1's worker exits 3 while node 0's runs: both stop, the chief's
    summary names node 1's status as the first failure, and exits with it."""
    delay = rng.uniform(0, 1)
    procs, pids = _two_exec_nodes(tmp, ("time.sleep(600)", f"time.sleep({delay}); sys.exit(3)"))
    return _outcome(procs, pids, "the command on node 1 (127.0.0.1) exited with status 3 "
                    "first", 3)


ROWS: dict[str, Callable[[Path, random.Random], Outcome]] = {
    "first failure (2 simulated nodes)": first_failure,
    "node SIGKILL (2 simulated nodes)": node_sigkill,
    "SIGINT/SIGTERM, 1 node": interrupted,
    "torn journal": torn_journal,
    "replayed control stream": replay,
    "idle connections": idle_connections,
    "wire fuzz": wire_fuzz,
    "malformed cluster-info file": malformed_file,
    "checkpoint SIGKILL (directory)": checkpoint_sigkill,
}

#: trials per row in the suite: all rows within about a minute on a busy 2-core machine
SUITE_TRIALS = {"first failure (2 simulated nodes)": 1, "node SIGKILL (2 simulated nodes)": 1,
                "SIGINT/SIGTERM, 1 node": 2, "torn journal": 3, "replayed control stream": 1,
                "idle connections": 1, "wire fuzz": 1, "malformed cluster-info file": 2,
                "checkpoint SIGKILL (directory)": 2}


@pytest.mark.slow
@pytest.mark.parametrize("row", list(SUITE_TRIALS))
def test_fault_matrix_row_holds(row: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                ) -> None:
    if row == "torn journal":
        pytest.importorskip("optuna")
    rng = random.Random(row)
    for i in range(SUITE_TRIALS[row]):
        tmp = tmp_path / str(i)
        tmp.mkdir()
        if row == "idle connections":
            outcome = idle_connections(tmp, rng, count=30, deadline=0.5)
        elif row == "wire fuzz":
            outcome = wire_fuzz(tmp, rng, frames=60)
        else:
            outcome = ROWS[row](tmp, rng)
        assert outcome is None, f"{row}, trial {i}: {outcome}"


def main(argv: list[str]) -> int:
    """Every row ``N`` times; prints ``row: trials, failures`` (and what failed)."""
    import tempfile

    n = int(argv[0]) if argv else 5
    only = set(argv[1:])
    rng = random.Random()
    rows = {**ROWS, "checkpoint SIGKILL (S3)": checkpoint_sigkill_s3}
    for row, run in rows.items():
        if only and row not in only:
            continue
        trials = 1 if row == "idle connections" else n
        failures: list[str] = []
        start = time.monotonic()
        server = None
        if row == "checkpoint SIGKILL (S3)":
            from tests.storage_servers import S3Server

            server = S3Server()
        for _ in range(trials):
            with tempfile.TemporaryDirectory() as tmp:
                if row == "idle connections":
                    outcome = idle_connections(Path(tmp), rng, count=300)
                elif server is not None:
                    outcome = checkpoint_sigkill_s3(Path(tmp), rng,
                                                    server.block(server.new_bucket()))
                else:
                    outcome = run(Path(tmp), rng)
            if outcome is not None:
                failures.append(outcome)
        if server is not None:
            server.stop()
        print(f"{row}: {trials} trials, {len(failures)} failures, "
              f"{time.monotonic() - start:.0f}s {failures[:3]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
