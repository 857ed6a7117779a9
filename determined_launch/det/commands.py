"""The verbs of ``det experiment``, ``det trial`` and ``det checkpoint`` over the
root: Determined's tables, columns and one-line answers (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from determined_launch.det import follow, state
from determined_launch.det.table import format_percent, format_time, render, sizeof_fmt
from determined_launch.errors import LaunchError
from determined_launch.exproot import LookupFailed, Root, trial_checkpoints
from determined_launch.rundir import OUTPUT_FILE


def _view(root: Root, ref: str) -> state.View:
    return state.view(root.experiment(ref))


def list_experiments(ns: argparse.Namespace, root: Root) -> int:
    headers = ["ID", "Owner", "Name", "Parent ID", "State", "Progress", "Started", "Ended",
               "Resource Pool"]
    rows = []
    for e in root.experiments():
        v = state.view(e)
        rows.append([e.id, v.owner, e.name, None, v.state, format_percent(v.progress),
                     format_time(v.started), format_time(v.ended), v.pool])
    print(render(headers, rows, ns.csv))
    return 0


def _trial_json(t: state.Trial, exp_id: int) -> dict[str, Any]:
    return {"id": t.id, "experimentId": exp_id, "state": t.state, "hparams": t.hparams,
            "startTime": format_time(t.start), "endTime": format_time(t.end),
            "totalBatchesProcessed": t.batches, "searcherMetricValue": t.best,
            "directory": str(t.dir)}


def describe(ns: argparse.Namespace, root: Root) -> int:
    views = [_view(root, ref) for ref in ns.experiment_ids.split(",")]
    if ns.json:
        print(json.dumps([{"experiment": {
            "id": v.exp.id, "name": v.exp.name, "state": v.state, "progress": v.progress,
            "startTime": format_time(v.started), "endTime": format_time(v.ended),
            "resourcePool": v.pool, "directory": str(v.exp.dir), "searcher": v.searcher},
            "trials": [_trial_json(t, v.exp.id) for t in v.trials]} for v in views], indent=4))
        return 0
    headers = ["Experiment ID", "State", "Progress", "Started", "Ended", "Name", "Description",
               "Archived", "Resource Pool", "Labels"]
    rows = [[v.exp.id, v.state, format_percent(v.progress), format_time(v.started),
             format_time(v.ended), v.exp.name, v.record.get("description"), False, v.pool, ""]
            for v in views]
    if not ns.csv:
        print("Experiment:")
    print(render(headers, rows, ns.csv))
    headers = ["Trial ID", "Experiment ID", "State", "Started", "Ended", "H-Params"]
    rows = [[t.id, v.exp.id, t.state, format_time(t.start), format_time(t.end),
             json.dumps(t.hparams, indent=4)] for v in views for t in v.trials]
    if not ns.csv:
        print("\nTrials:")
    print(render(headers, rows, ns.csv))
    for v in views:
        if v.error:
            print(f"experiment {v.exp.id}: {v.error}", file=sys.stderr)
    return 0


def list_trials(ns: argparse.Namespace, root: Root) -> int:
    v = _view(root, ns.experiment_id)
    headers = ["Trial ID", "State", "H-Params", "Started", "Ended", "# of Batches"]
    rows = [[t.id, t.state, json.dumps(t.hparams, indent=4), format_time(t.start),
             format_time(t.end), t.batches] for t in v.trials]
    print(render(headers, rows, ns.csv))
    return 0


def _validation_at(run_dir: pathlib.Path, steps: Any, metric: str) -> str:
    try:
        with open(run_dir / "validation.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - (1 << 20)))  # the last MiB is plenty
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        metrics = record.get("metrics") if isinstance(record, dict) else None
        if record.get("steps_completed") == steps and isinstance(metrics, dict):
            return "" if metrics.get(metric) is None else str(metrics.get(metric))
    return ""


def _resources(storage: str, uuid: str) -> dict[str, int]:
    base = pathlib.Path(storage) / uuid
    if "://" in storage or not base.is_dir():
        return {}
    return {str(p.relative_to(base)): p.stat().st_size for p in sorted(base.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def list_checkpoints(ns: argparse.Namespace, root: Root) -> int:
    v = _view(root, ns.experiment_id)
    metric = str(v.searcher.get("metric") or "")
    rows = []
    for t in v.trials:
        for c in trial_checkpoints(t.id, root.path) if t.dir.is_dir() else []:
            files = _resources(c["storage"], c["uuid"])
            rows.append([t.id, c["steps_completed"], "COMPLETED",
                         _validation_at(t.dir, c["steps_completed"], metric), c["uuid"],
                         "\n".join(sorted(files)), sizeof_fmt(sum(files.values()))])
    if getattr(ns, "best", None):
        smaller = bool(v.searcher.get("smaller_is_better", True))
        rows = sorted((r for r in rows if r[3] != ""), key=lambda r: float(r[3]),
                      reverse=not smaller)[: ns.best]
    headers = ["Trial ID", "# of Batches", "State", "Validation Metric", "UUID", "Resources",
               "Size"]
    print(render(headers, rows, ns.csv))
    return 0


def _find_checkpoint(root: Root, uuid: str) -> dict[str, Any]:
    for e in root.experiments():
        for t in state.view(e).trials:
            for c in trial_checkpoints(t.id, root.path) if t.dir.is_dir() else []:
                if c["uuid"] == uuid:
                    return c
    raise LookupFailed(f"no checkpoint {uuid!r} in {root.path}")


def download_checkpoint(ns: argparse.Namespace, root: Root) -> int:
    from determined_launch.core.storage import open_storage, parse_storage

    c = _find_checkpoint(root, ns.uuid)
    dest = pathlib.Path(ns.output_dir or pathlib.Path("checkpoints", ns.uuid))
    if dest.exists() and any(dest.iterdir()):
        raise LaunchError(f"-o {dest}: not an empty directory")
    backend = open_storage(parse_storage(c["storage"], where="the experiment's storage"))
    backend.download(c["uuid"], dest, None)
    if ns.quiet:
        print(dest)
        return 0
    print("Local checkpoint path:")
    print(dest, "\n")
    table = [["Experiment ID", c["experiment_id"]], ["Trial ID", c["trial_id"]],
             ["Steps Completed", c["steps_completed"]], ["Report Time", format_time(c["time"])],
             ["Checkpoint UUID", c["uuid"]],
             ["Metadata", json.dumps(c["metadata"], indent=4)]]
    print(render([r[0] for r in table], [[r[1] for r in table]]))
    return 0


def trial_describe(ns: argparse.Namespace, root: Root) -> int:
    ref = root.trial(ns.trial_id)
    v = state.view(ref.experiment)
    t = next((t for t in v.trials if t.id == ref.id), None)
    if t is None:
        raise LookupFailed(f"no trial {ns.trial_id!r} in the study of experiment {v.exp.id}")
    if ns.json:
        print(json.dumps(_trial_json(t, v.exp.id), indent=4))
        return 0
    headers = ["Trial ID", "Experiment ID", "State", "H-Params", "Started", "Ended",
               "# of Batches", "Searcher Metric"]
    print(render(headers, [[t.id, v.exp.id, t.state, json.dumps(t.hparams, indent=4),
                            format_time(t.start), format_time(t.end), t.batches, t.best]],
                 ns.csv))
    return 0


def trial_logs(ns: argparse.Namespace, root: Root) -> int:
    ref = root.trial(ns.trial_id)
    offset = follow.print_log(ref.dir / OUTPUT_FILE, ns.head, ns.tail)
    if ns.follow:
        follow.follow_trial(root, ref, offset)
    return 0


def _signal_driver(v: state.View, signum: int) -> bool:
    driver = state.read_json(v.exp.dir / state.DRIVER)
    if not state.pid_alive(driver):
        return False
    try:
        os.kill(int(driver["pid"]), signum)
    except ProcessLookupError:
        return False
    return True


def _preempt_running(v: state.View) -> None:
    """An experiment run by det-launch experiment itself: preempt its running trials
    (each checkpoints and stops; its driver then stops the search)."""
    for t in v.trials:
        if t.state == "RUNNING" and t.dir.is_dir():
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                os.close(os.open(t.dir / "preempt", flags, 0o600))
            except OSError:
                pass


def _scancel(v: state.View, *args: str) -> None:
    job = state.read_json(v.exp.dir / state.DRIVER).get("slurm_job")
    if job and shutil.which("scancel"):
        subprocess.run(["scancel", *args, str(job)], check=False, capture_output=True, timeout=30)


def pause(ns: argparse.Namespace, root: Root) -> int:
    v = _view(root, ns.experiment_id)
    if v.state in state.FINAL:
        raise LaunchError(f"experiment {v.exp.id} is {v.state}; only an active one pauses")
    (v.exp.dir / state.PAUSED).touch()
    if not _signal_driver(v, signal.SIGTERM):  # the driver preempts every trial, exits 75
        _preempt_running(v)  # each worker's driver then stops too (no requeue: det_paused)
        _scancel(v, "--state=PENDING")
    print(f"Paused experiment {v.exp.id}")
    return 0


def activate(ns: argparse.Namespace, root: Root) -> int:
    from determined_launch.det.create import start_detached

    v = _view(root, ns.experiment_id)
    if v.state in ("ACTIVE", "RUNNING", "QUEUED"):
        print(f"Activated experiment {v.exp.id}")
        return 0
    if v.state in state.FINAL:
        raise LaunchError(f"experiment {v.exp.id} is {v.state}: it cannot be activated")
    driver = state.read_json(v.exp.dir / state.DRIVER)
    argv = driver.get("argv")
    (v.exp.dir / state.PAUSED).unlink(missing_ok=True)
    if driver.get("slurm_job"):
        from determined_launch.det.cluster import sbatch

        sbatch(v.exp.dir, [str(a) for a in driver.get("sbatch_args") or ()])
        print(f"Activated experiment {v.exp.id}")
        return 0
    if not isinstance(argv, list) or not (v.exp.dir / "context").is_dir():
        raise LaunchError(f"experiment {v.exp.id} was not created by det e create; rerun its "
                          "det-launch experiment command to resume it")
    start_detached(v.exp.dir, [str(a) for a in argv])
    print(f"Activated experiment {v.exp.id}")
    return 0


def kill(ns: argparse.Namespace, root: Root) -> int:
    v = _view(root, ns.experiment_id)
    (v.exp.dir / state.KILLED).touch()
    if _signal_driver(v, signal.SIGTERM):  # a second signal: the trials are terminated
        time.sleep(0.2)
        _signal_driver(v, signal.SIGTERM)
    else:
        _preempt_running(v)
    _scancel(v)
    print(f"Killed experiment {v.exp.id}")
    return 0


def wait(ns: argparse.Namespace, root: Root) -> int:
    exp = root.experiment(ns.experiment_id)
    while True:
        v = state.view(exp)
        if v.state in state.FINAL:
            return 0 if v.state == "COMPLETED" else 1
        time.sleep(max(0.1, ns.polling_interval))


def version(_ns: argparse.Namespace, root: Root) -> int:
    import determined_launch

    print(f"client:\n  version: {determined_launch.__version__}\nmaster:\n  version: none "
          f"(this det runs without a master)\nexperiments_root: {root.path}")
    return 0


def create(ns: argparse.Namespace, root: Root) -> int:
    from determined_launch.det.create import create as create_experiment

    return create_experiment(ns, root)


def job_run(ns: argparse.Namespace, root: Root) -> int:
    from determined_launch.det.job import run

    return run(ns, root)


def config(ns: argparse.Namespace, root: Root) -> int:
    e = root.experiment(ns.experiment_id)
    path = e.dir / "config.yaml"
    if not path.is_file():  # made by det-launch experiment: the config it was given
        path = pathlib.Path(str(state.read_json(e.dir / "experiment.json").get("config", "")))
    try:
        print(path.read_text(encoding="utf-8").rstrip("\n"))
    except (OSError, UnicodeDecodeError) as err:
        raise LookupFailed(f"experiment {e.id}: its config {path} cannot be read: {err}"
                           ) from None
    return 0


def experiment_logs(ns: argparse.Namespace, root: Root) -> int:
    v = _view(root, ns.experiment_id)
    if not v.trials:
        raise LookupFailed(f"experiment {v.exp.id} has no trial yet")
    ns.trial_id = str(min(t.id for t in v.trials))
    return trial_logs(ns, root)


def cancel(ns: argparse.Namespace, root: Root) -> int:
    """Determined's cancel: the trials checkpoint and stop, for good (CANCELED)."""
    v = _view(root, ns.experiment_id)
    (v.exp.dir / state.KILLED).touch()
    if not _signal_driver(v, signal.SIGTERM):
        _preempt_running(v)
        _scancel(v, "--state=PENDING")
    print(f"Canceled experiment {v.exp.id}")
    return 0
