"""Putting an experiment together: config, cluster, study, driver, and the end report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

from determined_launch import exproot
from determined_launch.cluster.detect import detect
from determined_launch.cluster.info import ClusterInfo
from determined_launch.common.redact import redact
from determined_launch.core.storage import check_storage, open_storage, parse_storage
from determined_launch.errors import LaunchError
from determined_launch.experiment import expconf, report
from determined_launch.experiment import searchers as se
from determined_launch.experiment.command import (
    entrypoint_command,
    refuse_trial_identity,
    trial_flags,
    trial_identity_env,
    unused_fields,
)
from determined_launch.experiment.concurrency import (
    default_concurrency,
    gpu_groups,
    visible_gpus,
)
from determined_launch.experiment.driver import (
    Driver,
    DriverSetup,
    trial_env,
    write_experiment_file,
)
from determined_launch.experiment.gang import (
    Gang,
    GangChief,
    GangError,
    NodeSetup,
    channel_port,
    serve_node,
    trial_gang,
)
from determined_launch.experiment.sync import ExperimentSync
from determined_launch.experiment.trial import launcher_argv, private_dir, write_private
from determined_launch.launch import config
from determined_launch.launch.launcher import LauncherOptions, _ports, detection_env, job_secret
from determined_launch.values import plain


def _checkpoint_storage(conf: expconf.ExperimentConfig, exp_dir: pathlib.Path) -> str:
    """The config's ``checkpoint_storage`` for ``DET_CHECKPOINT_STORAGE``: a
    string as is, a block as a YAML file beside the experiment (the storage
    layer reads it; this layer never interprets storage), else a directory."""
    raw = conf.checkpoint_storage
    if raw is None:
        return str(exp_dir / "checkpoints")
    if isinstance(raw, str):
        return raw
    path = exp_dir / "checkpoint_storage.yaml"
    write_private(path, json.dumps(raw, indent=1) + "\n")  # JSON is YAML
    return str(path)


def _experiment_sync(conf: expconf.ExperimentConfig, exp_dir: pathlib.Path,
                     study_url: Optional[str]) -> Optional[ExperimentSync]:
    """With object-storage checkpoints, the experiment's page goes there too
    (experiment/sync.py), so ``det-launch ui s3://...`` shows it."""
    if conf.checkpoint_storage is None:
        return None
    spec = parse_storage(conf.checkpoint_storage, where=str(conf.path))
    if spec.is_directory:
        return None
    journal = None if study_url and "://" in study_url else pathlib.Path(
        study_url or exp_dir / "study.journal")
    return ExperimentSync(exp_dir, journal, open_storage(spec).put_extra)


class _Live:
    """One line per event; on a terminal also the trial table below them,
    redrawn at most once a second."""

    def __init__(self, driver: Optional[Driver], metric: str, smaller: bool,
                 exp_dir: Optional[pathlib.Path] = None) -> None:
        self.driver = driver
        self.exp_dir = exp_dir
        self.metric = metric
        self.smaller = smaller
        self.tty = sys.stdout.isatty()
        self._last = 0.0
        self._lines = 0

    def event(self, text: str) -> None:
        if self.tty and self._lines:  # the line goes above the table, which is redrawn
            sys.stdout.write(f"\x1b[{self._lines}F\x1b[J")
            self._lines = 0
        print(f"det-launch experiment: {text}", flush=True)
        if self.tty:
            self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        if not self.tty or self.driver is None:
            return
        if not force and time.monotonic() - self._last < 1.0:
            return
        self._last = time.monotonic()
        table = report.render_table(self.driver._trials(), self.metric, self.smaller,
                                    self.exp_dir)
        sys.stdout.write(f"\x1b[{self._lines}F\x1b[J" if self._lines else "")
        sys.stdout.write(table + "\n")
        sys.stdout.flush()
        self._lines = table.count("\n") + 1


def run_experiment(ns: argparse.Namespace, opts: dict[str, Any], command: Sequence[str]) -> int:
    refuse_trial_identity(ns)
    conf = expconf.load(ns.config_path)
    if command:
        sub, args = command[0], list(command[1:])
    elif conf.entrypoint is not None:
        sub, args = entrypoint_command(conf.entrypoint, str(conf.path))
    else:
        raise LaunchError(f"{conf.path}: no command after the config and no entrypoint in it")
    resolved = config.resolve(os.environ, config.flag_values(ns))
    options = LauncherOptions.from_values(resolved)
    gang, node_slots = _cluster(options, conf)
    if gang is None:
        print("det-launch experiment: this node is left over (the allocation's nodes are not a "
              "multiple of a trial's); nothing to run here", flush=True)
        return 0
    trial_slots = gang.info.slots_per_node
    if opts["max_concurrent"] is not None:
        concurrency = opts["max_concurrent"]
    elif ns.worker or gang.nodes > 1:  # a worker runs one; a multi-node trial takes the group
        concurrency = 1
    elif conf.searcher.max_concurrent_trials:
        concurrency = conf.searcher.max_concurrent_trials  # the user's number, as asked
    else:
        concurrency = default_concurrency(0, node_slots, trial_slots)
    node = gang.rank > 0  # a multi-node trial's other node: it never reads the study
    if conf.checkpoint_storage is not None:  # one line now, not a failing trial per restart
        check_storage(parse_storage(conf.checkpoint_storage, where=str(conf.path)),
                      probe=not node)
    exp_dir = pathlib.Path(opts["experiment_dir"] or exproot.root_dir() / conf.name)
    exp_dir = private_dir(exp_dir.absolute())
    os.environ[exproot.ENV] = str(exp_dir.parent)  # the trials' root: trial ids resolve there
    ignored = unused_fields(conf.ignored, args)
    for line in expconf.ignored_lines(ignored) if not node else ():
        print(f"det-launch experiment: {line}", file=sys.stderr)
    for var in trial_identity_env():
        os.environ.pop(var, None)  # each trial's identity comes from its cluster info file
    secret, port = "", 0  # the group's channel, for trials across nodes
    if gang.nodes > 1:
        secret = job_secret(gang.info, os.environ)
        port = channel_port(_ports(gang.info, os.environ))
    if node:
        return serve_node(NodeSetup(
            gang=gang, secret=secret, port=port,
            connect_timeout=options.supervisor.connect_timeout, exp_dir=exp_dir,
            argv=launcher_argv(trial_flags(ns), sub, args), env=trial_env(conf.searcher),
            checkpoint_storage=_checkpoint_storage(conf, exp_dir),
            metric=conf.searcher.metric, say=_say))
    write_experiment_file(exp_dir, conf, opts["study_storage"])
    exproot.Root.of(exp_dir).ensure_experiment(exp_dir, _checkpoint_storage(conf, exp_dir))
    live = _Live(None, conf.searcher.metric, conf.searcher.smaller_is_better, exp_dir)
    chief = (GangChief(gang, secret, port, options.supervisor.connect_timeout, live.event)
             if gang.nodes > 1 else None)
    sync = _experiment_sync(conf, exp_dir, opts["study_storage"])

    def event(text: str) -> None:
        live.event(text)
        if sync is not None:  # every state change is an event line
            sync.running(_trial_dirs(driver))
            sync.changed()

    setup = DriverSetup(conf=conf, exp_dir=exp_dir, storage_url=opts["study_storage"],
                        info=gang.info, flags=trial_flags(ns), command=sub, args=args,
                        concurrency=concurrency,
                        gpu_groups=gpu_groups(visible_gpus(os.environ), trial_slots,
                                              concurrency) if gang.nodes == 1 else [],
                        checkpoint_storage=_checkpoint_storage(conf, exp_dir),
                        on_event=event, signals=tuple(resolved["preempt_signals"]),
                        before_start=chief.before_start if chief is not None else None)
    driver = Driver(setup)
    live.driver = driver
    watch = resolved["preempt_file"]

    def tick() -> None:
        _watch_preempt(driver, watch)
        live.tick()
        if sync is not None:
            sync.running(_trial_dirs(driver))
        lost = chief.check() if chief is not None else None
        if lost is not None and driver.error is None:  # the running trial stops, resumable
            driver.error = GangError(lost)

    if sync is not None:
        sync.start()
    status = 1
    try:
        status = driver.run(tick=tick)
    finally:
        if sync is not None:
            sync.close()
        if chief is not None:
            chief.finish(status)
    live.tick(force=True)  # the final states
    _final(driver._trials(), exp_dir, conf, ns.worker)
    return status


def _cluster(options: LauncherOptions, conf: expconf.ExperimentConfig
             ) -> tuple[Optional[Gang], int]:
    """This node's place in the allocation (``None``: left over) and its slots
    (detected, or ``--slots``: the node's, as for the launcher). On a single node
    a trial's info has the trial's own slots, ``slots_per_trial`` (default 1, as
    in Determined), and the node's slots say how many such trials fit at once;
    on several nodes ``slots_per_trial`` counts the nodes of each trial
    (experiment/gang.py)."""
    def found(o: LauncherOptions) -> ClusterInfo:
        return detect(detection_env(o, os.environ), force=o.detector,
                      disable=o.disabled_detectors).info

    info = found(options)
    if not info.single_node:
        return trial_gang(conf.slots_per_trial, info, str(conf.path)), info.slots_per_node
    node_slots = info.slots_per_node
    per = conf.slots_per_trial or 1
    if per != node_slots:
        info = found(dataclasses.replace(options, slots=per))
    return Gang(nodes=1, group=0, rank=0, info=info), node_slots


def _say(text: str) -> None:
    print(f"det-launch experiment: {text}", flush=True)


def _trial_dirs(driver: Driver) -> list[tuple[int, pathlib.Path]]:
    return [(proc.spec.trial_id, proc.dir) for _, proc in driver.running.values()]


def _watch_preempt(driver: Driver, path: Optional[str]) -> None:
    # --preempt-file is the experiment's: it preempts every trial, and the search stops.
    if path and not driver.stopping and os.path.exists(path):
        driver.stopping = 1


def _final(trials: Sequence[Any], exp_dir: pathlib.Path, conf: expconf.ExperimentConfig,
           worker: bool) -> None:
    s = conf.searcher
    if sys.stdout.isatty() is False:
        print(report.render_table(trials, s.metric, s.smaller_is_better, exp_dir), flush=True)
    plot = report.plot(trials, exp_dir, s.metric, s.smaller_is_better)
    if plot is not None:
        print(f"det-launch experiment: plot {plot}")
    best = report.best_record(trials, exp_dir, s.metric, s.smaller_is_better)
    if best is None:
        if not any(report.state_of(t) == "completed" for t in trials):
            print("det-launch experiment: no completed trial yet")
        elif plot is not None:  # else the plot's line said that no trial reported it
            print(f"det-launch experiment: no best trial: no completed trial reported "
                  f"{s.metric!r}")
        return
    path = report.write_best(best, exp_dir)
    checkpoint = best["checkpoint"] or "none (it saved none)"
    print(f"det-launch experiment: best trial {best['trial_id']}: {s.metric}="
          f"{plain(best['value'])} "
          f"hparams {json.dumps(redact(best['hparams']), sort_keys=True)} checkpoint "
          f"{checkpoint} ({path})", flush=True)


def status(exp_dir: pathlib.Path, storage_url: Optional[str]) -> int:
    """``--status DIR``: the table and the best trial, running or finished."""
    try:
        record = json.loads((exp_dir / "experiment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise LaunchError(f"--status {exp_dir}: not an experiment directory (no readable "
                          "experiment.json)") from None
    url = storage_url or record.get("storage")
    if url and record.get("storage_has_password") and not storage_url:
        raise LaunchError(f"--status {exp_dir}: the study is in {url}; give its URL with "
                          "--study-storage (the password is never written to the directory)")
    storage = se.open_storage(url, str(exp_dir / "study.journal"))
    optuna = se.require_optuna()
    try:
        study = optuna.load_study(study_name=record["name"], storage=storage)
    except KeyError:
        raise LaunchError(f"--status {exp_dir}: no study {record['name']!r} in "
                          f"{se.storage_label(url)}") from None
    trials = study.get_trials(deepcopy=False)
    s = expconf.SearcherConfig(**{**record["searcher"],
                                  "bracket_rungs": tuple(record["searcher"]["bracket_rungs"])})
    print(report.render_table(trials, s.metric, s.smaller_is_better, exp_dir))
    counts: dict[str, int] = {}
    for t in report.visible(trials):
        counts[report.state_of(t)] = counts.get(report.state_of(t), 0) + 1
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no trials yet")
    best = report.best_record(trials, exp_dir, s.metric, s.smaller_is_better)
    if best is not None:
        print(f"best trial {best['trial_id']}: {s.metric}={plain(best['value'])} hparams "
              f"{json.dumps(redact(best['hparams']), sort_keys=True)} "
              f"checkpoint {best['checkpoint']}")
    return 0
