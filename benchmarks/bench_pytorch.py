"""Cost of ``determined_launch.pytorch``: Trainer overhead, checkpoints, preemption checks.

    python benchmarks/bench_pytorch.py [--batches 2000] [--rounds 3] [--ckpt-mb 200]
                                       [--ckpt-reps 3] [--no-peer] [--json out.json]

Measures, in one run on the same machine, every side in its own process,
interleaved round by round (medians reported):

* **Trainer overhead per batch**: a small MLP whose batch takes about 2 ms on
  one thread, ``--batches`` batches, a report every 100, no validation or
  checkpoint until the end (timed from ``on_training_start`` to the last
  ``on_training_workload_end``, so the final validation/checkpoint is out):
  a plain hand-written PyTorch loop (``loss.item()`` per batch, a mean every
  100), ours, and Determined 0.38.1's Trainer in local mode
  (``benchmarks/peer_pytorch_env.sh``). TensorBoard is off on both sides.
* **Checkpoint save/restore of a ``--ckpt-mb`` MB state** (one
  ``nn.Linear``, SGD without momentum): the Trainer's checkpoint (state
  dict, trial state, load_data.json, code copy, atomic commit; timed from
  ``on_validation_end`` to ``on_checkpoint_upload_end``) and its restore
  (``fit(latest_checkpoint=dir)`` with nothing left to train; timed from
  ``on_trial_startup`` to ``on_training_start``) against plain
  ``torch.save`` / ``torch.load`` + ``load_state_dict`` to the same disk.
* **Preemption check per batch under 2 ranks**: the same Trainer run under
  ``det-launch --slots 2 torch``; every ``should_preempt`` call the loop
  makes is timed on each rank (the per-batch ``block=False`` poll, and the
  blocking agreement at reporting boundaries).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 64
FEATURES = 128
HIDDEN = 256
RECORDS = 6400  # 100 batches per epoch


# --- workers (each runs in its own process) ---------------------------------------


def _setup_torch() -> Any:
    import torch

    torch.set_num_threads(1)
    return torch


def _dataset(torch: Any) -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(RECORDS, FEATURES, generator=g)
    y = torch.randint(0, 10, (RECORDS,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _mlp(torch: Any) -> Any:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 10),
    )


def worker_plain(batches: int) -> dict[str, Any]:
    torch = _setup_torch()
    import numpy as np

    model = _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(_dataset(torch), batch_size=BATCH)
    done = 0
    losses: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    while done < batches:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            done += 1
            if done % 100 == 0:
                _ = float(np.mean(losses))
                losses.clear()
            if done == batches:
                break
    return {
        "per_batch_s": (time.perf_counter() - t0) / batches,
        "cpu_per_batch_s": (time.process_time() - c0) / batches,
    }


def _trial_class(pytorch: Any, torch: Any, marks: dict[str, float]) -> type:
    """One trial class for ours and Determined's (``pytorch`` is either module)."""

    class Timer(pytorch.PyTorchCallback):  # type: ignore[misc,name-defined]
        def on_training_start(self) -> None:
            marks["start"], marks["cpu_start"] = time.perf_counter(), time.process_time()

        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            marks["end"], marks["cpu_end"] = time.perf_counter(), time.process_time()

    class MLPTrial(pytorch.PyTorchTrial):  # type: ignore[misc,name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(_mlp(torch))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))

        def build_callbacks(self) -> dict[str, Any]:
            return {"timer": Timer()}

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(_dataset(torch), batch_size=BATCH)

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(
                torch.utils.data.Subset(_dataset(torch), range(BATCH)), batch_size=BATCH
            )

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> Any:
            x, y = batch
            return {"val_loss": torch.nn.functional.cross_entropy(self.model(x), y)}

    return MLPTrial


def worker_trainer(side: str, batches: int, preempt_timing: bool = False) -> dict[str, Any]:
    torch = _setup_torch()
    if side == "ours":
        sys.path.insert(0, REPO)
        from determined_launch import pytorch
    else:
        from determined import pytorch  # type: ignore[no-redef]
    import logging

    logging.disable(logging.INFO)  # both sides log a line per report; not what we time
    marks: dict[str, float] = {}
    calls: dict[str, list[int]] = {"poll": [], "blocking": []}
    with pytorch.init(
        hparams={"global_batch_size": BATCH * _world()}, enable_tensorboard_logging=False
    ) as ctx:
        trial = _trial_class(pytorch, torch, marks)(ctx)
        if preempt_timing:
            _time_should_preempt(ctx._core.preempt, calls)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(batches),
            reporting_period=pytorch.Batch(100),
            checkpoint_policy="none",
        )
        rank = ctx.distributed.rank
    out: dict[str, Any] = {
        "rank": rank,
        "per_batch_s": (marks["end"] - marks["start"]) / batches,
        "cpu_per_batch_s": (marks["cpu_end"] - marks["cpu_start"]) / batches,
    }
    if preempt_timing:
        out["poll"] = _stats(calls["poll"])
        out["blocking"] = _stats(calls["blocking"])
    return out


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _time_should_preempt(preempt: Any, calls: dict[str, list[int]]) -> None:
    """Shadow the instance's method with a timed one (the loop looks it up per call)."""
    original = preempt.should_preempt
    clock = time.perf_counter_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        result = original(*args, **kwargs)
        blocking = kwargs.get("block", args[0] if args else True)
        calls["blocking" if blocking else "poll"].append(clock() - t0)
        return result

    preempt.should_preempt = timed


def _stats(samples_ns: list[int]) -> dict[str, float]:
    if not samples_ns:
        return {"n": 0}
    s = sorted(samples_ns)
    return {
        "n": len(s),
        "median_us": statistics.median(s) / 1e3,
        "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


def worker_checkpoint(megabytes: int, reps: int, where: str) -> dict[str, Any]:
    """Plain torch.save/torch.load vs the Trainer's checkpoint and restore, interleaved."""
    torch = _setup_torch()
    sys.path.insert(0, REPO)
    import logging

    from determined_launch import pytorch

    logging.disable(logging.WARNING)
    out_features = megabytes * 2**20 // 4 // 5000
    marks: dict[str, float] = {}

    class Timer(pytorch.PyTorchCallback):
        def on_validation_end(self, metrics: Any) -> None:
            marks["save0"] = time.perf_counter()

        def on_checkpoint_save_start(self, checkpoint: Any) -> None:
            marks.setdefault("write0", time.perf_counter())

        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            marks.setdefault("write1", time.perf_counter())

        def on_checkpoint_upload_end(self, uuid: str) -> None:
            marks.setdefault("save1", time.perf_counter())

        def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: Any) -> None:
            marks["load0"] = time.perf_counter()

        def on_checkpoint_load_start(self, checkpoint: Any) -> None:
            marks["loaded"] = time.perf_counter()  # torch.load done, state not applied yet

        def on_training_start(self) -> None:
            marks["load1"] = time.perf_counter()

    class Big(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(torch.nn.Linear(5000, out_features, bias=False))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))

        def build_callbacks(self) -> dict[str, Any]:
            return {"timer": Timer()}

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(
                torch.utils.data.TensorDataset(torch.ones(4, 5000)), batch_size=1
            )

        def build_validation_data_loader(self) -> Any:
            return self.build_training_data_loader()

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            loss = self.model(batch[0]).mean()
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> Any:
            return {"v": 0.0}

    results: dict[str, list[float]] = {
        "torch_save": [],
        "torch_load": [],
        "ours_save": [],
        "ours_restore": [],
    }
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        model = torch.nn.Linear(5000, out_features, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        size = sum(p.numel() * p.element_size() for p in model.parameters())

        def plain_save(path: str) -> None:
            os.sync()  # start from clean page cache: no writeback debt from the other side
            t0 = time.perf_counter()
            torch.save(
                {
                    "models_state_dict": [model.state_dict()],
                    "optimizers_state_dict": [opt.state_dict()],
                },
                path,
            )
            results["torch_save"].append(time.perf_counter() - t0)

        def ours_save(run: str) -> str:
            os.sync()
            with pytorch.init(
                hparams={"global_batch_size": 1},
                run_dir=run,
                checkpoint_storage=os.path.join(tmp, "ckpt"),
                enable_tensorboard_logging=False,
            ) as ctx:
                marks.clear()
                pytorch.Trainer(Big(ctx), ctx).fit(
                    max_length=pytorch.Batch(1),
                    validation_period=pytorch.Batch(1),
                    checkpoint_policy="all",
                )
            results["ours_save"].append(marks["save1"] - marks["save0"])
            for phase in ("prepare", "write", "commit"):
                results.setdefault(f"ours_save_{phase}", [])
            results["ours_save_prepare"].append(marks["write0"] - marks["save0"])
            results["ours_save_write"].append(marks["write1"] - marks["write0"])
            results["ours_save_commit"].append(marks["save1"] - marks["write1"])
            with open(os.path.join(run, "latest_checkpoint.json")) as f:
                return os.path.join(tmp, "ckpt", json.load(f)["storage_id"])

        def plain_load(path: str) -> None:
            t0 = time.perf_counter()
            state = torch.load(path)
            model.load_state_dict(state["models_state_dict"][0])
            opt.load_state_dict(state["optimizers_state_dict"][0])
            results["torch_load"].append(time.perf_counter() - t0)

        def ours_restore(run: str, ckpt_dir: str) -> None:
            with pytorch.init(
                hparams={"global_batch_size": 1},
                run_dir=run,
                checkpoint_storage=os.path.join(tmp, "ckpt"),
                enable_tensorboard_logging=False,
            ) as ctx:
                trial = Big(ctx)
                marks.clear()
                pytorch.Trainer(trial, ctx).fit(
                    max_length=pytorch.Batch(1), latest_checkpoint=ckpt_dir
                )
            results["ours_restore"].append(marks["load1"] - marks["load0"])
            results.setdefault("ours_restore_read", []).append(marks["loaded"] - marks["load0"])
            results.setdefault("ours_restore_apply", []).append(marks["load1"] - marks["loaded"])

        for rep in range(reps):  # alternate which side goes first
            path = os.path.join(tmp, f"plain-{rep}.pt")
            run = os.path.join(tmp, f"run-{rep}")
            if rep % 2 == 0:
                plain_save(path)
                ckpt_dir = ours_save(run)
                plain_load(path)
                ours_restore(run, ckpt_dir)
            else:
                ckpt_dir = ours_save(run)
                plain_save(path)
                ours_restore(run, ckpt_dir)
                plain_load(path)
            os.unlink(path)
            shutil.rmtree(ckpt_dir)
    return {
        "state_mb": size / 2**20,
        **{k: statistics.median(v) for k, v in results.items()},
        "all": results,
    }


# --- driver -----------------------------------------------------------------------------


def _run_worker(python: str, args: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
    r = subprocess.run(
        [python, os.path.abspath(__file__), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if r.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _peer_python() -> Optional[str]:
    script = os.path.join(REPO, "benchmarks", "peer_pytorch_env.sh")
    r = subprocess.run(["bash", script], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"peer unavailable: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return r.stdout.strip().splitlines()[-1]


def _envs(tmp: str) -> tuple[dict[str, str], dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "PYTHONPATH"))}
    base["OMP_NUM_THREADS"] = "1"
    ours = {
        **base,
        "PYTHONPATH": REPO,
        "DET_RUN_DIR": os.path.join(tmp, "run"),
        "DET_CHECKPOINT_STORAGE": os.path.join(tmp, "ckpt"),
        "DET_CHECKPOINT_CODE": "0",
    }
    # Determined stores local checkpoints under appdirs.user_data_dir("determined").
    theirs = {**base, "XDG_DATA_HOME": os.path.join(tmp, "xdg")}
    os.makedirs(os.path.join(tmp, "xdg", "determined"), exist_ok=True)
    return ours, theirs


def bench_overhead(batches: int, rounds: int, peer: Optional[str]) -> dict[str, Any]:
    """Per-batch CPU time (process time: what the process itself spent, so other
    load on a shared machine mostly drops out) and wall time, per side."""
    cpu: dict[str, list[float]] = {"plain": [], "ours": [], "determined": []}
    wall: dict[str, list[float]] = {"plain": [], "ours": [], "determined": []}
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            work = os.path.join(tmp, "work")  # cwd: what Determined copies into checkpoints
            os.makedirs(work)
            ours_env, theirs_env = _envs(tmp)
            sides: list[tuple[str, str, list[str], dict[str, str]]] = [
                ("plain", sys.executable, ["--worker", "plain", str(batches)], ours_env),
                ("ours", sys.executable, ["--worker", "ours", str(batches)], ours_env),
            ]
            if peer:
                sides.append(("determined", peer, ["--worker", "theirs", str(batches)], theirs_env))
            for name, python, wargs, env in sides if r % 2 == 0 else sides[::-1]:
                res = _run_worker(python, wargs, env, work)
                cpu[name].append(res["cpu_per_batch_s"])
                wall[name].append(res["per_batch_s"])
                print(
                    f"  round {r + 1}: {name:10} cpu {cpu[name][-1] * 1e3:.3f} ms/batch, "
                    f"wall {wall[name][-1] * 1e3:.3f}",
                    flush=True,
                )
    med = {k: statistics.median(v) for k, v in cpu.items() if v}
    # Co-tenants shift the machine's speed from round to round by more than the
    # overhead we look for, so ratios are taken within a round (adjacent runs)
    # and their median reported.
    ours_ratio = [o / p - 1 for o, p in zip(cpu["ours"], cpu["plain"])]
    out: dict[str, Any] = {
        "median_cpu_per_batch_ms": {k: v * 1e3 for k, v in med.items()},
        "median_wall_per_batch_ms": {k: statistics.median(v) * 1e3 for k, v in wall.items() if v},
        "cpu_samples_ms": {k: [x * 1e3 for x in v] for k, v in cpu.items()},
        "wall_samples_ms": {k: [x * 1e3 for x in v] for k, v in wall.items()},
        "ours_over_plain_per_round": ours_ratio,
        "ours_over_plain": statistics.median(ours_ratio),
    }
    if cpu["determined"]:
        det_ratio = [d / p - 1 for d, p in zip(cpu["determined"], cpu["plain"])]
        out["determined_over_plain_per_round"] = det_ratio
        out["determined_over_plain"] = statistics.median(det_ratio)
        det_over = out["determined_over_plain"]
        out["ours_overhead_vs_determined_overhead"] = (
            out["ours_over_plain"] / det_over if det_over > 0 else None
        )
    return out


def bench_checkpoint(megabytes: int, reps: int, where: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        ours_env, _ = _envs(tmp)
        ours_env.pop("DET_CHECKPOINT_CODE")  # the real code/ copy (of an empty cwd)
        res = _run_worker(
            sys.executable, ["--worker", "ckpt", str(megabytes), str(reps), where], ours_env, tmp
        )
    res["where"] = where
    # Per-rep ratios (adjacent runs), then their median: the disk's speed drifts.
    pairs = zip(res["all"]["ours_save"], res["all"]["torch_save"])
    res["save_ratio"] = statistics.median(o / t for o, t in pairs)
    pairs = zip(res["all"]["ours_restore"], res["all"]["torch_load"])
    res["restore_ratio"] = statistics.median(o / t for o, t in pairs)
    return res


def bench_preempt(batches: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        env, _ = _envs(tmp)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "determined_launch.cli",
                "--slots",
                "2",
                "torch",
                "--",
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "preempt",
                str(batches),
            ],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if r.returncode != 0:
        raise RuntimeError(f"2-rank run failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    ranks = [json.loads(m) for m in re.findall(r"^\[rank=\d+\] (\{.*\})$", r.stdout, re.M)]
    return {"ranks": sorted(ranks, key=lambda d: d["rank"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ckpt-mb", type=int, default=200)
    p.add_argument("--ckpt-reps", type=int, default=5)
    p.add_argument(
        "--ckpt-dirs",
        default=f"{tempfile.gettempdir()},/dev/shm",
        help="comma-separated directories to write checkpoints in (a disk, and tmpfs: the "
        "file format's own cost without the disk's noise)",
    )
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--only", choices=["overhead", "checkpoint", "preempt"])
    p.add_argument("--json")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "plain":
            res = worker_plain(int(rest[0]))
        elif kind in ("ours", "theirs"):
            res = worker_trainer(kind, int(rest[0]))
        elif kind == "preempt":
            res = worker_trainer("ours", int(rest[0]), preempt_timing=True)
        else:
            res = worker_checkpoint(int(rest[0]), int(rest[1]), rest[2])
        print(json.dumps(res), flush=True)
        return

    results: dict[str, Any] = {}
    if args.only in (None, "overhead"):
        peer = None if args.no_peer else _peer_python()
        print(f"Trainer overhead: {args.batches} batches x {args.rounds} rounds", flush=True)
        o = results["overhead"] = bench_overhead(args.batches, args.rounds, peer)
        med = o["median_cpu_per_batch_ms"]
        print("  median CPU ms/batch: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
        rounds_txt = ", ".join(f"{x * 100:+.1f}%" for x in o["ours_over_plain_per_round"])
        print(
            f"  ours over plain loop (median of rounds): {o['ours_over_plain'] * 100:+.1f}%"
            f"  [{rounds_txt}]  (target <= +5%)"
        )
        if "determined_over_plain" in o:
            rounds_txt = ", ".join(f"{x * 100:+.1f}%" for x in o["determined_over_plain_per_round"])
            print(
                f"  Determined over plain loop: {o['determined_over_plain'] * 100:+.1f}%"
                f"  [{rounds_txt}]"
            )
            ratio = o["ours_overhead_vs_determined_overhead"]
            print(
                f"  our overhead / Determined's: "
                f"{'n/a' if ratio is None else f'{ratio:.2f}x'}  (target <= 0.5x)"
            )
    if args.only in (None, "checkpoint"):
        results["checkpoint"] = {}
        for where in [d for d in args.ckpt_dirs.split(",") if d and os.path.isdir(d)]:
            print(
                f"Checkpoint: {args.ckpt_mb} MB state x {args.ckpt_reps} reps in {where}",
                flush=True,
            )
            c = results["checkpoint"][where] = bench_checkpoint(args.ckpt_mb, args.ckpt_reps, where)
            print(
                f"  save:    torch.save {c['torch_save']:.3f}s, ours {c['ours_save']:.3f}s "
                f"(write {c['ours_save_write']:.3f}s) -> {c['save_ratio']:.2f}x (median of "
                "per-rep ratios; target <= 1.2x)"
            )
            print(
                f"  restore: torch.load+load_state_dict {c['torch_load']:.3f}s, ours "
                f"{c['ours_restore']:.3f}s (read {c['ours_restore_read']:.3f}s) -> "
                f"{c['restore_ratio']:.2f}x  (target <= 1.2x)"
            )
    if args.only in (None, "preempt"):
        print(f"Preemption check, 2 ranks under det-launch, {args.batches} batches", flush=True)
        pr = results["preempt"] = bench_preempt(args.batches)
        for rk in pr["ranks"]:
            poll, blk = rk["poll"], rk["blocking"]
            print(
                f"  rank {rk['rank']}: per-batch poll n={poll.get('n')} median "
                f"{poll.get('median_us', 0):.2f}us p99 {poll.get('p99_us', 0):.2f}us mean "
                f"{poll.get('mean_us', 0):.2f}us; blocking n={blk.get('n')} median "
                f"{blk.get('median_us', 0):.1f}us  (target <= 20us per batch)"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
