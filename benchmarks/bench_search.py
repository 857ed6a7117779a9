"""Searcher overhead per trial of ``det-launch experiment``.

    python benchmarks/bench_search.py [--trials 12]

The figure the issue asks for: the time between one trial's end (the
script's last line) and the next trial's first batch, beyond what the
launcher itself costs. Measured in one run on the same machine, each over
the same trivial Core API trial script:

* **launcher alone**: the same launcher command run back to back by a plain
  Python loop (no searcher): the launcher's own exit + start-up + the
  script's imports;
* **Optuna with hand-written glue**: ``study.ask()``, write the hparams to a
  cluster info file, run the launcher, ``study.tell()`` (a journal file
  study, as ours), which is what users write today;
* **ours**: ``det-launch experiment`` with a random searcher and a journal
  study, one trial at a time.

Overhead = median gap minus the launcher-alone median gap. The three run in
alternating rounds (``--rounds``), so a machine whose load drifts (a shared
2-core VM) weighs on all three alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRIAL = """
import json, os, sys, time
import determined_launch as det
from determined_launch import core
info = det.get_cluster_info()
with core.init() as ctx:
    with open(os.environ["BENCH_FILE"], "a") as f:
        f.write(json.dumps({"first": time.time()}) + "\\n")
    ctx.train.report_validation_metrics(1, {"loss": info.trial.hparams.get("x", 0.5)})
    with open(os.environ["BENCH_FILE"], "a") as f:
        f.write(json.dumps({"end": time.time()}) + "\\n")
"""


def gaps(bench_file: Path) -> list[float]:
    """Seconds from each trial's end to the next trial's first batch."""
    firsts, ends = [], []
    for line in bench_file.read_text().splitlines():
        rec = json.loads(line)
        (firsts if "first" in rec else ends).append(rec.get("first", rec.get("end")))
    return [firsts[i + 1] - ends[i] for i in range(len(ends) - 1)]


def env(tmp: Path, name: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "SLURM_"))}
    e["PYTHONPATH"] = str(REPO)
    e["BENCH_FILE"] = str(tmp / f"{name}.jsonl")
    return e


def launcher_cmd(script: Path, info: Path) -> list[str]:
    return [sys.executable, "-m", "determined_launch.cli", "--detector", "file", "exec", "--",
            sys.executable, str(script)]


def write_info(path: Path, trial_id: int, hparams: dict[str, float]) -> None:
    path.write_text(json.dumps({"container_addrs": ["127.0.0.1"], "container_rank": 0,
                                "container_slot_counts": [1],
                                "trial": {"trial_id": trial_id, "hparams": hparams}}))


def launcher_alone(tmp: Path, script: Path, n: int) -> list[float]:
    tmp = Path(tempfile.mkdtemp(dir=tmp))
    e = env(tmp, "alone")
    for i in range(n):
        info = tmp / f"alone-{i}.json"
        write_info(info, i + 1, {"x": 0.5})
        e["DET_CLUSTER_INFO_FILE"] = str(info)
        e["DET_RUN_DIR"] = str(tmp / "alone" / str(i))
        subprocess.run(launcher_cmd(script, info), env=e, check=True, capture_output=True)
    return gaps(tmp / "alone.jsonl")


def optuna_glue(tmp: Path, script: Path, n: int) -> list[float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tmp = Path(tempfile.mkdtemp(dir=tmp))
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp / "glue.journal")))
    study = optuna.create_study(storage=storage, study_name="glue")
    e = env(tmp, "glue")
    for _ in range(n):
        trial = study.ask()
        x = trial.suggest_float("x", 0, 1)
        info = tmp / f"glue-{trial.number}.json"
        write_info(info, trial.number + 1, {"x": x})
        e["DET_CLUSTER_INFO_FILE"] = str(info)
        e["DET_RUN_DIR"] = str(tmp / "glue" / str(trial.number))
        subprocess.run(launcher_cmd(script, info), env=e, check=True, capture_output=True)
        metrics = (tmp / "glue" / str(trial.number) / "validation.jsonl").read_text()
        study.tell(trial, json.loads(metrics.splitlines()[-1])["metrics"]["loss"])
    return gaps(tmp / "glue.jsonl")


def ours(tmp: Path, script: Path, n: int) -> list[float]:
    tmp = Path(tempfile.mkdtemp(dir=tmp))
    cfg = tmp / "exp.yaml"
    cfg.write_text(json.dumps({
        "name": "bench", "max_restarts": 0,
        "hyperparameters": {"x": {"type": "double", "minval": 0, "maxval": 1}},
        "searcher": {"name": "random", "metric": "loss", "max_trials": n, "max_length": 1}}))
    subprocess.run([sys.executable, "-m", "determined_launch.cli", "experiment", str(cfg),
                    "--experiment-dir", str(tmp / "ours"), "exec", "--", sys.executable,
                    str(script)], env=env(tmp, "ours"), check=True, capture_output=True)
    return gaps(tmp / "ours.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8, help="trials per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-search-") as d:
        tmp = Path(d)
        script = tmp / "trial.py"
        script.write_text(TRIAL)
        methods = (("launcher alone", launcher_alone), ("optuna glue", optuna_glue),
                   ("ours", ours))
        pooled: dict[str, list[float]] = {name: [] for name, _ in methods}
        for _ in range(a.rounds):
            for name, fn in methods:
                pooled[name] += fn(tmp, script, a.trials)
        results = {name: {"median_gap_s": statistics.median(g), "max_gap_s": max(g),
                          "gaps": len(g)} for name, g in pooled.items()}
    base = results["launcher alone"]["median_gap_s"]
    print(f"{'':16} {'median gap':>11} {'max gap':>8} {'overhead':>9}   ({a.rounds} rounds x "
          f"{a.trials} trials, {os.cpu_count()} CPUs)")
    for name, r in results.items():
        r["overhead_s"] = r["median_gap_s"] - base
        print(f"{name:16} {r['median_gap_s']:10.3f}s {r['max_gap_s']:7.3f}s "
              f"{r['overhead_s']:+8.3f}s")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
