"""``det experiment create CONFIG CONTEXT``: a new experiment in the root,
run detached by ``det-launch experiment`` (the search is not done again here).

The config (with ``--config KEY=VALUE`` applied, as Determined applies them) is
checked first; then the experiment gets its id and directory, CONTEXT is copied
into ``<exp>/context`` (snapshot.py) and the config into ``<exp>/config.yaml``,
and ``det-launch experiment <exp>/config.yaml --experiment-dir <exp>`` starts in
its own session with its working directory in the copy (the trials run there),
its output in ``<exp>/experiment.log``. ``det`` returns at once unless ``-f``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from determined_launch import expconf, exproot, values
from determined_launch.det import follow, state
from determined_launch.det.snapshot import snapshot
from determined_launch.errors import LaunchError

INSTALL = "pip install 'determined_launch[search]'"


def load_config(path: str, overrides: Sequence[str]) -> dict[str, Any]:
    where = str(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"{where}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = values.yaml_document(text, where, INSTALL)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if not isinstance(raw, dict):
        raise LaunchError(f"invalid experiment config file {where}")
    return apply_overrides(raw, overrides)


def _yaml(text: str) -> Any:
    try:
        return values.yaml_document(text, "--config", INSTALL)
    except ValueError:
        return text


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Determined's ``--config KEY=VALUE``: dotted keys; a value read as YAML, a
    comma-separated one as a list of them, ``[...]``/``{...}`` as YAML whole."""
    out = copy.deepcopy(config)
    for arg in overrides:
        key, eq, text = arg.partition("=")
        if not eq or not key:
            raise LaunchError(f"--config {arg!r}: expected KEY=VALUE (nested keys with dots, "
                              "e.g. resources.slots_per_trial=2)")
        if text.startswith(("[", "{")):
            value: Any = _yaml(text)
            if key == "bind_mounts" and isinstance(value, dict):
                value = [value]
        elif "," in text:
            value = [_yaml(v) for v in text.split(",")]
        else:
            value = _yaml(text)
            if key == "bind_mounts":
                value = [value]
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        old = node.get(parts[-1])
        if isinstance(old, dict) and isinstance(value, dict):
            value = {**old, **value}
        node[parts[-1]] = value
    return out


def small_config(config: dict[str, Any]) -> dict[str, Any]:
    """Determined's test mode: one trial, the smallest length, no restarts."""
    given = config.get("searcher")
    searcher: dict[str, Any] = given if isinstance(given, dict) else {}
    small: dict[str, Any] = {"name": "single", "metric": searcher.get("metric",
                                                                     "validation_loss")}
    if "smaller_is_better" in searcher:
        small["smaller_is_better"] = searcher["smaller_is_better"]
    if searcher.get("time_metric"):
        small.update(time_metric=searcher["time_metric"], max_time=1)
    else:
        small["max_length"] = {"batches": 1}
    return {**config, "searcher": small, "max_restarts": 0}


def _check(config: dict[str, Any], where: str) -> str:
    """The config as det-launch experiment will read it (one line per mistake); its name."""
    return expconf.parse(config, pathlib.Path(where)).name


def prepare(ns: argparse.Namespace, root: exproot.Root) -> tuple[int, pathlib.Path]:
    """Check, number and fill a new experiment directory; (id, directory)."""
    config = load_config(ns.config_file, ns.config)
    if ns.test_mode:
        config = small_config(config)
    name = _check(config, ns.config_file)
    if importlib.util.find_spec("optuna") is None:  # one line now, not a failure in the background
        raise LaunchError(f"det e create runs det-launch experiment, which needs Optuna: {INSTALL}")
    context = pathlib.Path(ns.model_def or ".").absolute()
    if not context.is_dir():
        raise LaunchError(f"context path '{context}' must be a directory")
    exp_id, exp_dir = root.new_experiment_dir(name)
    try:
        snapshot(context, exp_dir / "context", skip=(root.path, context / "det_runs"))
    except BaseException:
        shutil.rmtree(exp_dir, ignore_errors=True)  # its id stays unused, as a failed create's
        raise
    config = {**config, "name": exp_dir.name}  # the directory's name: one study per experiment
    (exp_dir / "config.yaml").write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
    return exp_id, exp_dir


def launch_argv(exp_dir: pathlib.Path) -> list[str]:
    return ["experiment", str(exp_dir / "config.yaml"), "--experiment-dir", str(exp_dir)]


def start_detached(exp_dir: pathlib.Path, argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """``det-launch ARGV`` in its own session, in the experiment's copy of the
    context, output to ``experiment.log``; recorded in ``det_driver.json``."""
    started = time.time()
    env = {**os.environ, exproot.ENV: str(exp_dir.parent)}
    with open(exp_dir / state.LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "determined_launch.det.detached", str(exp_dir),
             repr(started), "--", *argv],
            cwd=exp_dir / "context", env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    state.write_json(exp_dir / state.DRIVER, {"pid": proc.pid, "host": socket.gethostname(),
                                              "started": started, "argv": list(argv)})
    return proc


def create(ns: argparse.Namespace, root: exproot.Root) -> int:
    if ns.test_mode:
        print("Validating experiment configuration...", flush=True)
    exp_id, exp_dir = prepare(ns, root)
    if getattr(ns, "print_k8s", False) or getattr(ns, "slurm", None) is not None:
        from determined_launch.det import cluster

        return cluster.submit(ns, exp_id, exp_dir)
    if ns.test_mode:
        print("Experiment configuration validation succeeded! 🎉")
    proc = start_detached(exp_dir, launch_argv(exp_dir))
    print(f"Created {'test ' if ns.test_mode else ''}experiment {exp_id}", flush=True)
    if ns.test_mode:
        return follow.test_mode(root, exp_id, proc)
    if ns.follow_first_trial:
        return follow.first_trial(root, exp_id, proc)
    return 0
