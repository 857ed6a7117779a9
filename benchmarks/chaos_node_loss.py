"""Chaos check of ``--min-nodes`` (issue 27 §2): random SIGKILLs of random nodes.

    python benchmarks/chaos_node_loss.py [--kills 20] [--runs 1] [--min-nodes 1] [--seed 0]

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
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

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


def start(run: str, rank: int, port: int, mark: str, k: int, pace: Pace) -> subprocess.Popen[str]:
    info = os.path.join(run, f"node{rank}.json")
    with open(info, "w") as f:
        f.write('{"container_addrs": ["127.0.0.1", "127.0.0.1", "127.0.0.1"], '
                f'"container_rank": {rank}, "container_slot_counts": [1, 1, 1]}}')
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", DET_CLUSTER_INFO_FILE=info,
               C10D_PORT=str(port), DET_DIST_SECRET="c" * 32, DET_KILL_AFTER="3",
               DET_RUN_DIR=os.path.join(run, "run"), DET_LAUNCH_CONNECT_TIMEOUT="15",
               NODE_ID=str(rank), STEPS=str(pace.steps), CKPT_EVERY=str(CKPT_EVERY),
               STEP_SLEEP=str(pace.step_sleep),
               **{MARK: mark})
    argv = [sys.executable, "-m", "determined_launch.cli", "--max-restarts", "50",
            "--min-nodes", str(k), "exec", "--", sys.executable,
            os.path.join(WORKERS, "elastic_worker.py")]
    out = open(os.path.join(run, f"node{rank}.{uuid.uuid4().hex[:6]}.log"), "w")
    return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def leftovers(mark: str) -> list[psutil.Process]:
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except (psutil.Error, OSError):
            continue
    return left


def one_run(kills: int, k: int, rng: random.Random, work: str, pace: Pace = Pace()) -> str:
    run = tempfile.mkdtemp(prefix="chaos-", dir=work)
    port, mark = free_base(), uuid.uuid4().hex
    procs = {r: start(run, r, port, mark, k, pace) for r in range(3)}
    time.sleep(3.0)
    done = 0
    while done < kills and any(p.poll() is None for p in procs.values()):
        time.sleep(rng.uniform(*pace.kill_gap))
        alive = [r for r, p in procs.items() if p.poll() is None]
        if not alive:
            break
        victim = rng.choice(alive)
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        done += 1
        time.sleep(rng.uniform(*pace.back_after))  # the others notice, then it comes back
        if any(p.poll() is None for r, p in procs.items() if r != victim):
            procs[victim] = start(run, victim, port, mark, k, pace)
    deadline = time.monotonic() + 180
    for p in procs.values():
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    time.sleep(2.0)
    left = leftovers(mark)
    for p in left:
        p.kill()
    logs = ""
    for name in sorted(os.listdir(run)):
        if name.endswith(".log"):
            with open(os.path.join(run, name)) as f:
                logs += f"--- {name}\n{f.read()}"
    finals = [float(x) for x in re.findall(r"final w=(\S+)", logs)]
    below = re.findall(r"fewer than --min-nodes \d+", logs)
    want = reference(pace.steps)
    exact = finals and all(abs(f - want) <= 1e-9 for f in finals)
    if exact or (not finals and below) or not os.environ.get("CHAOS_KEEP"):
        shutil.rmtree(run, ignore_errors=True)
    else:
        print(f"kept {run}", flush=True)
    if left:
        return f"LEFTOVER processes: {[p.pid for p in left]}"
    if exact:
        return f"exact ({done} kills, {len(finals)} final line)"
    if not finals and below:
        return f"clean failure below K ({done} kills): {below[0]}"
    return f"WRONG ({done} kills): finals {finals}, reference {want!r}\n{logs[-4000:]}"


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
    args = p.parse_args()
    pace = FAST if args.fast else SUITE if args.suite else Pace()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="chaos-node-loss-", dir=os.environ.get("CHAOS_KEEP"))
    bad = 0
    try:
        for i in range(args.runs):
            began, cpu = time.monotonic(), children_cpu()
            verdict = one_run(args.kills, args.min_nodes, rng, work, pace)
            bad += not verdict.startswith(("exact", "clean"))
            print(f"run {i}: {verdict} [{time.monotonic() - began:.1f} s wall, "
                  f"{children_cpu() - cpu:.1f} s CPU]", flush=True)
    finally:
        if not os.environ.get("CHAOS_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
