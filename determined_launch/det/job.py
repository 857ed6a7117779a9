"""``det job run CONFIG CONTEXT``: one non-training job (the Trainer proposal's
batch inference), run in the foreground like Determined's commands.

CONTEXT is copied into ``<root>/.jobs/<N>/context`` and the config (with
``--config`` applied) into ``<root>/.jobs/<N>/config.yaml``; the config's
``entrypoint`` (or ``entrypoint_script``) runs there under ``det-launch`` as a
local trial of that config (``DET_LAUNCH_CONFIG``: its constant hyperparameters,
``resources.slots_per_trial``). The workers get ``DET_LAUNCH_CONFIG`` too: the
PyTorch API reads the config's ``data:`` from it (``context.config_data``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from determined_launch import envvars, expconf
from determined_launch.det.create import load_config
from determined_launch.det.snapshot import snapshot
from determined_launch.errors import LaunchError
from determined_launch.experiment.command import entrypoint_command
from determined_launch.exproot import Root

CONFIG_ENV = "DET_LAUNCH_CONFIG"  # the launcher's --config (config.py): one name for both


def run(ns: argparse.Namespace, root: Root) -> int:
    raw = load_config(ns.config_file, ns.config)
    conf = expconf.parse(raw, pathlib.Path(ns.config_file), trial=True)
    if conf.entrypoint is None:
        raise LaunchError(f"{ns.config_file}: no entrypoint (or entrypoint_script) to run")
    context = pathlib.Path(ns.model_def or ".").absolute()
    if not context.is_dir():
        raise LaunchError(f"context path '{context}' must be a directory")
    job_id, job_dir = root.new_job_dir()
    snapshot(context, job_dir / "context", skip=(root.path, context / "det_runs"))
    config_path = job_dir / "config.yaml"
    config_path.write_text(json.dumps(raw, indent=1) + "\n")  # JSON is YAML
    sub, args = entrypoint_command(conf.entrypoint, str(config_path))
    env = {**os.environ, CONFIG_ENV: str(config_path),
           envvars.RUN_DIR: str(job_dir / "run")}
    print(f"Launched job {job_id} ({job_dir})", flush=True)
    argv = [sys.executable, "-m", "determined_launch.cli", sub, *args]
    try:
        return subprocess.run(argv, cwd=job_dir / "context", env=env, check=False).returncode
    except KeyboardInterrupt:
        return 130
