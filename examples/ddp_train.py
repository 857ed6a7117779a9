"""A real (small) data-parallel training job on CPU with gloo.

Run it on 4 local workers through the launcher:

    det-launch --slots 4 torch -- python examples/ddp_train.py

Each rank trains the same MLP on its shard of a synthetic regression task
(y = x @ w_true + noise); DDP averages the gradients, so every rank ends with
identical weights, and the chief prints the loss and the weight error.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 -- before init_process_group: see end_process_group()
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=8192)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    train(args)
    end_process_group()


def end_process_group() -> None:
    """End the group while the interpreter is alive. A gloo worker thread lets go
    of a finished collective just after the caller sees it complete; if that is
    left to interpreter exit, it needs the GIL there and the rank aborts
    ("terminate called without an active exception", status 134). Only the
    group's destructor joins those threads, so nothing may keep the group alive:
    the DDP model (freed when train() returned; it sits in a reference cycle,
    hence gc.collect()) and torch.distributed.nn, which keeps the group it sees
    at import as a default argument (hence imported before init_process_group).
    """
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
    gc.collect()


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same data and initial weights everywhere
    w_true = torch.randn(16, 1)
    x = torch.randn(args.samples, 16)
    y = x @ w_true + 0.01 * torch.randn(args.samples, 1)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, sampler=sampler)

    model = DistributedDataParallel(nn.Linear(16, 1, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total / len(loader):.5f}", flush=True)

    err = (model.module.weight.detach().t() - w_true).abs().max().item()
    errs = [0.0] * world
    dist.all_gather_object(errs, err)
    if rank == 0:
        same = max(errs) - min(errs) < 1e-6
        print(f"done: world={world} local_rank={os.environ['LOCAL_RANK']} "
              f"max weight error {err:.4f}; ranks agree: {same}", flush=True)


if __name__ == "__main__":
    main()
