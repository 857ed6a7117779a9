"""Cost of ``determined_launch.pytorch``: Trainer overhead, checkpoints, preemption checks.

    python benchmarks/bench_pytorch.py [--batches 2000] [--rounds 8] [--model mlp,tiny]
                                       [--profile 25] [--ckpt-mb 200] [--ckpt-reps 3]
                                       [--no-peer] [--only overhead] [--json out.json]

Measures, in one run on the same machine, every side in its own process,
interleaved round by round (medians reported):

* **Trainer overhead per batch**: a small MLP whose batch takes about 1.5 ms
  on one thread (``--model mlp``; ``tiny``: about 0.2 ms, where the loop's
  own cost dominates), ``--batches`` batches, a report every 100 (the default
  ``reporting_period``), the per-batch preemption poll on, no validation or
  checkpoint until the end (timed from ``on_training_start`` to the last
  ``on_training_workload_end``, so the final validation/checkpoint is out):
  a plain hand-written PyTorch loop (``loss.item()`` per batch, a mean every
  100), ours, and Determined 0.38.1's Trainer in local mode
  (``benchmarks/peer_pytorch_env.sh``). TensorBoard is off on both sides.
  The figure is process CPU time (``time.process_time``), and the overhead is
  the median over ``--rounds`` rounds of each round's difference to the
  plain loop's run in the same round (sides in rotating order); wall time is
  reported beside it. Then one cProfiled run of ours lists where its time
  goes (inflated by the profiler; read it as proportions).
* **Checkpoint save/restore of a ``--ckpt-mb`` MB state** (one
  ``nn.Linear``, SGD without momentum): the Trainer's checkpoint (state
  dict, trial state, load_data.json, code copy, atomic commit; timed from
  ``on_validation_end`` to ``on_checkpoint_upload_end``) and its restore
  (``fit(latest_checkpoint=dir)`` with nothing left to train; timed from
  ``on_trial_startup`` to ``on_training_start``) against plain
  ``torch.save`` / ``torch.load`` + ``load_state_dict`` to the same disk.
* **Preemption check per batch under 2 ranks**: the same Trainer run under
  ``det-launch --slots 2 torch``; every ``should_preempt`` call the loop
  makes is timed on each rank (the ``block=False`` poll, and the blocking
  agreement at reporting boundaries). Since the loop counts down the polls
  core says return False (``PreemptContext.quiet_polls``), the ``block=False``
  calls timed are only those at sync points, where the ranks agree; the
  batches between them make no call.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- driver -----------------------------------------------------------------------------


def _run_worker(python: str, args: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
    """Runs this file's ``--worker`` (or another checkout's, given as ``args[0]``)."""
    if not args[0].endswith(".py"):
        args = [os.path.abspath(__file__), *args]
    r = subprocess.run(
        [python, *args],
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


def _paired(cpu: dict[str, list[float]], side: str) -> list[float]:
    """Per-round differences side - plain, in µs per batch (adjacent runs)."""
    return [(o - p) * 1e6 for o, p in zip(cpu[side], cpu["plain"])]


def bench_overhead(
    batches: int, rounds: int, peer: Optional[str], model: str, profile: int,
    before: Optional[str] = None, plain_process: bool = True,
) -> dict[str, Any]:
    """Per-batch CPU time (``time.process_time``: all of the process's threads,
    so other load on a shared machine mostly drops out) and wall time, per side.

    Co-tenants shift the machine's speed from round to round by more than the
    overhead we look for, so the overhead is the median over rounds of the
    per-round difference to the plain loop of the same round; the order of the
    sides rotates from round to round."""
    names = ("plain", "ours", "before", "determined")
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    # In-process pairs: the Trainer's 100-batch chunk minus the plain loop's
    # 100 batches run right after it in the same process (µs per batch).
    paired: dict[str, list[list[float]]] = {n: [] for n in names[1:]}
    inproc_plain: dict[str, list[float]] = {n: [] for n in names[1:]}
    # Per batch, the CPU time between two steps of the model (the loop's own work
    # and fetching the next batch), median over batches, Trainer minus the plain
    # loop in the same process: the least noisy figure on a loaded machine.
    between: dict[str, list[float]] = {n: [] for n in names[1:]}
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "work")  # cwd: what Determined copies into checkpoints
        os.makedirs(work)
        ours_env, theirs_env = _envs(tmp)
        for env in (ours_env, theirs_env):
            env["BENCH_PYTORCH_MODEL"] = model
        sides: list[tuple[str, str, list[str], dict[str, str]]] = [
            ("ours", sys.executable, ["--worker", "ours", str(batches)], ours_env),
        ]
        if plain_process:
            sides.insert(0, ("plain", sys.executable, ["--worker", "plain", str(batches)],
                             ours_env))
        if before:  # an older checkout (with this benchmark's worker files): before/after
            before_env = {**ours_env, "PYTHONPATH": before}
            script = os.path.join(before, "benchmarks", "bench_pytorch.py")
            sides.append(("before", sys.executable, [script, "--worker", "ours", str(batches)],
                          before_env))
        if peer:
            sides.append(("determined", peer, ["--worker", "theirs", str(batches)], theirs_env))
        for r in range(rounds):
            k = r % len(sides)
            order = sides[k:] + sides[:k]
            for name, python, wargs, env in order if (r // len(sides)) % 2 == 0 else order[::-1]:
                res = _run_worker(python, wargs, env, work)
                cpu[name].append(res["cpu_per_batch_s"])
                wall[name].append(res["per_batch_s"])
                if name in paired:
                    paired[name].append(res["paired_chunk_diffs_us"])
                    inproc_plain[name].append(res["plain_cpu_per_batch_s"])
                    between[name].append(res["between_us"] - res["plain_between_us"])
            print(
                f"  round {r + 1}: "
                + ", ".join(
                    f"{n} cpu {cpu[n][-1] * 1e3:.4f} wall {wall[n][-1] * 1e3:.4f} ms/batch"
                    + (f" (paired {statistics.median(paired[n][-1]):+.1f} µs, between steps "
                       f"{between[n][-1]:+.1f} µs)" if n in paired else "")
                    for n, *_ in sides
                ),
                flush=True,
            )
        profile_rows = None
        if profile:
            res = _run_worker(
                sys.executable, ["--worker", "profile", str(batches), str(profile)], ours_env, work
            )
            profile_rows = res["profile"]
    out: dict[str, Any] = {
        "model": model,
        "batches": batches,
        "rounds": rounds,
        "median_cpu_per_batch_ms": {k: statistics.median(v) * 1e3 for k, v in cpu.items() if v},
        # the plain loop's chunks inside the Trainers' processes (same machine moments)
        "median_inproc_plain_cpu_per_batch_ms": {
            k: statistics.median(v) * 1e3 for k, v in inproc_plain.items() if v
        },
        "median_wall_per_batch_ms": {k: statistics.median(v) * 1e3 for k, v in wall.items() if v},
        "cpu_samples_ms": {k: [x * 1e3 for x in v] for k, v in cpu.items() if v},
        "wall_samples_ms": {k: [x * 1e3 for x in v] for k, v in wall.items() if v},
    }
    for side in names[1:]:
        if not cpu[side] or not cpu["plain"]:
            continue
        diffs = _paired(cpu, side)
        wall_diffs = [(o - p) * 1e6 for o, p in zip(wall[side], wall["plain"])]
        out[f"{side}_cpu_over_plain_us_per_round"] = diffs
        out[f"{side}_cpu_over_plain_us"] = statistics.median(diffs)
        out[f"{side}_wall_over_plain_us"] = statistics.median(wall_diffs)
        out[f"{side}_cpu_over_plain_pct"] = (
            100 * statistics.median(diffs) / (statistics.median(cpu["plain"]) * 1e6)
        )
    for side, diffs in between.items():
        if diffs:
            out[f"{side}_between_steps_us_per_process"] = diffs
            out[f"{side}_between_steps_us"] = statistics.median(diffs)
    if between["ours"] and between["determined"]:
        out["between_steps_ours_vs_determined"] = (
            out["ours_between_steps_us"] / out["determined_between_steps_us"]
        )
    for side, runs in paired.items():
        if not runs:
            continue
        out[f"{side}_paired_us_per_process"] = [statistics.median(r) for r in runs]
        out[f"{side}_paired_us"] = statistics.median([d for r in runs for d in r])
    det = out.get("determined_cpu_over_plain_us")
    if det:
        out["ours_overhead_vs_determined_overhead"] = out["ours_cpu_over_plain_us"] / det
    if out.get("determined_paired_us"):
        out["paired_ours_vs_determined"] = out["ours_paired_us"] / out["determined_paired_us"]
    if profile_rows is not None:
        out["profile_ours"] = profile_rows
    return out


def _print_overhead(o: dict[str, Any]) -> None:
    med = o["median_cpu_per_batch_ms"]
    print("  median CPU ms/batch: " + ", ".join(f"{k} {v:.4f}" for k, v in med.items()))
    medw = o["median_wall_per_batch_ms"]
    print("  median wall ms/batch: " + ", ".join(f"{k} {v:.4f}" for k, v in medw.items()))
    medp = o["median_inproc_plain_cpu_per_batch_ms"]
    print("  median CPU ms/batch of the plain loop inside each side's process: "
          + ", ".join(f"{k} {v:.4f}" for k, v in medp.items()))
    for side in ("ours", "before", "determined"):
        if f"{side}_cpu_over_plain_us" not in o:
            continue
        rounds_txt = ", ".join(f"{x:+.1f}" for x in o[f"{side}_cpu_over_plain_us_per_round"])
        print(
            f"  {side} over plain loop, CPU: {o[f'{side}_cpu_over_plain_us']:+.1f} µs/batch "
            f"({o[f'{side}_cpu_over_plain_pct']:+.1f}%; median of per-round differences "
            f"[{rounds_txt}]); wall {o[f'{side}_wall_over_plain_us']:+.1f} µs/batch"
        )
    ratio = o.get("ours_overhead_vs_determined_overhead")
    if ratio is not None:
        print(f"  our overhead / Determined's (separate processes): {ratio:.2f}x")
    for side in ("ours", "before", "determined"):
        if f"{side}_paired_us" in o:
            per = ", ".join(f"{x:+.1f}" for x in o[f"{side}_paired_us_per_process"])
            print(
                f"  {side} over plain loop, in-process pairs of 100-batch chunks: "
                f"{o[f'{side}_paired_us']:+.1f} µs/batch (per process [{per}])"
                + ("  (target <= 30 µs)" if side == "ours" else "")
            )
    ratio = o.get("paired_ours_vs_determined")
    if ratio is not None:
        print(f"  our overhead / Determined's, in-process pairs: {ratio:.2f}x")
    for side in ("ours", "before", "determined"):
        if f"{side}_between_steps_us" in o:
            per = ", ".join(f"{x:+.1f}" for x in o[f"{side}_between_steps_us_per_process"])
            print(
                f"  {side}: CPU time between model steps over the plain loop's: "
                f"{o[f'{side}_between_steps_us']:+.1f} µs/batch (per process [{per}])"
                + ("  (target <= 30 µs)" if side == "ours" else "")
            )
    ratio = o.get("between_steps_ours_vs_determined")
    if ratio is not None:
        print(f"  our overhead / Determined's, between steps: {ratio:.2f}x  (target <= 0.25x)")
    for row in o.get("profile_ours") or []:
        print(
            f"    {row['own_us_per_batch']:7.2f} µs own"
            + (
                f" {row['cum_us_per_batch']:8.2f} cum {row['calls_per_batch']:5.1f} calls"
                if "cum_us_per_batch" in row
                else ""
            )
            + f"  {row['function']}"
        )


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
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument(
        "--model",
        default="mlp,tiny",
        help="comma-separated: mlp (a ~1.5 ms batch), tiny (a ~0.2 ms batch)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=25,
        help="after the rounds, one cProfiled run of ours: print this many functions (0: none)",
    )
    p.add_argument("--ckpt-mb", type=int, default=200)
    p.add_argument("--ckpt-reps", type=int, default=5)
    p.add_argument(
        "--ckpt-dirs",
        default=f"{tempfile.gettempdir()},/dev/shm",
        help="comma-separated directories to write checkpoints in (a disk, and tmpfs: the "
        "file format's own cost without the disk's noise)",
    )
    p.add_argument("--no-peer", action="store_true")
    p.add_argument(
        "--no-plain-process",
        action="store_true",
        help="skip the plain loop's own process (the in-process pairs still run it)",
    )
    p.add_argument(
        "--before",
        help="a checkout of an older tree (with these benchmark files): its Trainer runs as "
        "the side 'before', interleaved with the others",
    )
    p.add_argument("--only", choices=["overhead", "checkpoint", "preempt"])
    p.add_argument("--json")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        import _bench_pytorch_workers as w  # beside this file: sys.path[0]

        kind, *rest = args.worker
        if kind == "plain":
            res = w.worker_plain(int(rest[0]))
        elif kind in ("ours", "theirs"):
            res = w.worker_trainer(kind, int(rest[0]))
        elif kind == "profile":
            res = w.worker_trainer("ours", int(rest[0]), profile=int(rest[1]))
        elif kind == "preempt":
            res = w.worker_trainer("ours", int(rest[0]), preempt_timing=True)
        else:
            res = w.worker_checkpoint(int(rest[0]), int(rest[1]), rest[2])
        print(json.dumps(res), flush=True)
        return

    results: dict[str, Any] = {}
    if args.only in (None, "overhead"):
        peer = None if args.no_peer else _peer_python()
        results["overhead"] = {}
        for model in args.model.split(","):
            print(
                f"Trainer overhead, {model}: {args.batches} batches x {args.rounds} rounds",
                flush=True,
            )
            o = results["overhead"][model] = bench_overhead(
                args.batches, args.rounds, peer, model, args.profile, args.before,
                not args.no_plain_process,
            )
            _print_overhead(o)
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
