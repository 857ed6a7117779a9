"""From the SIGKILL of a node's launcher to training again on the survivors.

    python benchmarks/bench_node_loss.py [--reps 3] [--nodes 3] [--kinds "Core API,Trainer DDP"]

Simulated nodes on loopback (one ``det-launch --max-restarts 9 --min-nodes
1 exec`` per node, one Core API worker each, combining a number per step over
a real ``DistributedContext``, a checkpoint every 10 steps). Once a checkpoint
is committed, one node's launcher is SIGKILLed (a worker node, then the
chief, alternately); the survivors' lines are time-stamped as they arrive:

* *decided*: a survivor prints ``det-launch: restart ...`` (the loss seen,
  every worker stopped, the decision made and handed over);
* *resumed*: the new generation's worker has started, connected its
  ``DistributedContext`` and restored the checkpoint (``resumed`` line);
* *training*: it finished its first step on the new membership.

Two worker kinds in one run (``--kinds``): the tiny Core API worker above, and
a PyTorch Trainer worker (DDP over gloo under ``det-launch torch``, a checkpoint
every 10 batches), whose new generation also imports torch, builds its process
group and DDP model and restores before its first batch (issue 35 §0).

Target (issue 27): SIGKILL to training again <= 15 s plus the checkpoint load.
The checkpoints here are a few bytes, so *resumed* is the launcher's part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = r"""
import json, os, sys, time
import determined_launch as det

info = det.get_cluster_info()
rank, size = info.container_rank, len(info.container_addrs)
dist = det.core.DistributedContext(rank=rank, size=size, local_rank=0, local_size=1,
                                   cross_rank=rank, cross_size=size)
with det.core.init(distributed=dist) as ctx:
    step = 0
    if info.latest_checkpoint is not None:
        with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
            step = json.loads((path / "state.json").read_text())["step"]
    print(f"resumed {time.time()!r} step={step} size={size}", flush=True)
    first = True
    while step < 100000:
        dist.allgather(step)
        step += 1
        if first:
            print(f"trained {time.time()!r}", flush=True)
            first = False
        if step % 10 == 0 and rank == 0:
            with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                (path / "state.json").write_text(json.dumps({"step": step}))
            print(f"checkpoint {step}", flush=True)
        time.sleep(0.02)
"""

#: the same measurement with a PyTorch Trainer worker: DDP over gloo (one rank per node, under
#: ``det-launch torch``), a checkpoint every 10 batches; the new generation's time to its first
#: batch includes importing torch, the process group and DDP's setup, and the restore
TRAINER = r"""
import sys, time
import torch
from torch import nn
import determined_launch as det
from determined_launch import pytorch

class Data(torch.utils.data.Dataset):
    def __len__(self): return 1 << 20
    def __getitem__(self, i): return torch.full((8,), float(i % 7)), torch.tensor([float(i % 5)])

class Trial(pytorch.PyTorchTrial):
    first = True
    def __init__(self, context):
        self.context = context
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.model = context.wrap_model(net)
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=1e-3))
    def build_training_data_loader(self):
        return pytorch.DataLoader(Data(), batch_size=self.context.get_per_slot_batch_size())
    def build_validation_data_loader(self):
        return pytorch.DataLoader(Data(), batch_size=self.context.get_per_slot_batch_size())
    def train_batch(self, batch, epoch_idx, batch_idx):
        if batch_idx == 25 and self.context.distributed.rank == 0:
            print("checkpoint 20", flush=True)  # the Trainer committed batch 20's
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        if Trial.first:
            print(f"trained {time.time()!r}", flush=True)
            Trial.first = False
        time.sleep(0.02)
        return {"loss": loss}
    def evaluate_batch(self, batch):
        return {"loss": 0.0}

info = det.get_cluster_info()
with pytorch.init(hparams={"global_batch_size": 8 * len(info.container_addrs)}) as ctx:
    print(f"resumed {time.time()!r}", flush=True)
    trainer = pytorch.Trainer(Trial(ctx), ctx)
    trainer.fit(max_length=pytorch.Batch(100000), latest_checkpoint=info.latest_checkpoint,
                checkpoint_period=pytorch.Batch(10), validation_period=pytorch.Batch(1000000),
                reporting_period=pytorch.Batch(10))
"""
#: per worker kind: its script, the backend it runs under, the line its chief prints once a
#: checkpoint is committed
KINDS = {"Core API": (WORKER, "exec"), "Trainer DDP": (TRAINER, "torch")}


def free_base() -> int:
    """A base port whose generations' ports are all free (each generation's
    chief binds its own three: ``generation_ports``)."""
    sys.path.insert(0, REPO)
    from determined_launch.launch.generations import PORT_CYCLE, generation_ports

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        ports = sorted({p for g in range(PORT_CYCLE) for p in generation_ports(base, g)})
        if base + 3 <= 65535 and all(_free(p) for p in ports):
            return base


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Node:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, prefix: str, after: float) -> Optional[tuple[float, str]]:
        for t, line in list(self.lines):
            if t >= after and prefix in line:
                return t, line
        return None


def one(nodes_n: int, victim: int, work: str, kind: str,
        node_env: Optional[Callable[[int, str], dict[str, str]]] = None) -> dict[str, float]:
    """One kill; ``node_env(rank, run)``: more environment for a node (bench_node_loss_bucket)."""
    run = tempfile.mkdtemp(prefix="bench-node-loss-", dir=work)
    script = os.path.join(run, "worker.py")
    source, backend = KINDS[kind]
    with open(script, "w") as f:
        f.write(source)
    port = free_base()
    nodes: list[Node] = []
    try:
        for rank in range(nodes_n):
            info = os.path.join(run, f"node{rank}.json")
            with open(info, "w") as f:
                json.dump({"container_addrs": ["127.0.0.1"] * nodes_n, "container_rank": rank,
                           "container_slot_counts": [1] * nodes_n}, f)
            env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1",
                       DET_CLUSTER_INFO_FILE=info, C10D_PORT=str(port),
                       DET_DIST_SECRET="b" * 32, DET_RUN_DIR=os.path.join(run, "run"),
                       DET_KILL_AFTER="3", DET_LAUNCH_CONNECT_TIMEOUT="30")
            env.update(node_env(rank, run) if node_env else {})
            nodes.append(Node([sys.executable, "-m", "determined_launch.cli", "--max-restarts",
                               "9", "--min-nodes", "1", backend, "--", sys.executable, script],
                              env))
        chief = nodes[0]
        deadline = time.monotonic() + 120
        while chief.first("checkpoint 20", 0) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no checkpoint: " + "\n".join(x for _, x in chief.lines))
            time.sleep(0.05)
        killed = time.time()
        nodes[victim].proc.send_signal(signal.SIGKILL)
        survivors = [n for i, n in enumerate(nodes) if i != victim]
        lead = survivors[0]
        deadline = time.monotonic() + 120
        while lead.first("trained", killed) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no training after the kill: "
                                   + "\n".join(x for _, x in lead.lines))
            time.sleep(0.05)
        said = (n.first("det-launch: restart", killed) for n in survivors)
        decided = min(f[0] for f in said if f is not None)
        resumed = lead.first("resumed", killed)
        trained = lead.first("trained", killed)
        assert resumed is not None and trained is not None
        return {"decided": decided - killed, "resumed": resumed[0] - killed,
                "training": trained[0] - killed}
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.send_signal(signal.SIGINT)
        for n in nodes:
            try:
                n.proc.wait(30)
            except subprocess.TimeoutExpired:
                n.proc.kill()
        shutil.rmtree(run, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"worker kinds, comma-separated ({', '.join(KINDS)}): both by default, "
                        f"in one run")
    args = p.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",")]
    work = tempfile.mkdtemp(prefix="bench-node-loss-")
    results: dict[tuple[str, str], list[dict[str, float]]] = {
        (k, w): [] for k in kinds for w in ("worker node", "chief")}
    cpu0 = os.times()
    try:
        for _ in range(args.reps):
            for kind in kinds:
                results[kind, "worker node"].append(one(args.nodes, args.nodes - 1, work, kind))
                results[kind, "chief"].append(one(args.nodes, 0, work, kind))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu1 = os.times()
    cpu = (cpu1.children_user + cpu1.children_system
           - cpu0.children_user - cpu0.children_system)
    print(f"{args.nodes} simulated nodes, load average {os.getloadavg()[0]:.1f}, "
          f"children's CPU {cpu:.1f} s")
    for (kind, what), rows in results.items():
        for key in ("decided", "resumed", "training"):
            xs = [r[key] for r in rows]
            print(f"{kind:11s} {what:12s} SIGKILL -> {key:9s} median "
                  f"{statistics.median(xs):6.2f} s  min {min(xs):6.2f}  max {max(xs):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
