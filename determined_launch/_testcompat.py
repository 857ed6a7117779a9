"""Test-compat: the private ``det.*`` names Determined's unit tests and test
helpers use, so those files run against this package with only their imports
changed (docs/pytorch.md, "Determined's own tests").

They are small equivalents, not Determined's harness: ``EnvContext`` holds the
same fields (nothing here reads it but the tests), ``_make_local_execution_env``
builds a test Core API context (``core._dummy_init``) and such an
``EnvContext``, and ``_local_execution_manager`` is Determined's
"run as if in the trial's container" block. ``LegacyTrial`` and
``TrialController`` are ``pytorch.PyTorchTrial`` and its controller, the
only Trial API here (resolved on first use: they import torch).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from determined_launch import errors, gpu
from determined_launch import hparams as hp

#: Determined's names for the one Trial API and its controller here (PyTorch's);
#: resolved on first use, since they import torch
_ALIASES = {"LegacyTrial": "PyTorchTrial", "TrialController": "_PyTorchTrialController"}


def __getattr__(name: str) -> Any:
    if name in _ALIASES:
        from determined_launch import pytorch

        return getattr(pytorch, _ALIASES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class EnvContext:
    """What Determined's harness knew about a trial's container (same fields)."""

    def __init__(self, experiment_config: Mapping[str, Any], hparams: Mapping[str, Any],
                 latest_checkpoint: Optional[str] = None, steps_completed: int = 0,
                 use_gpu: bool = False, container_gpus: Optional[list[str]] = None,
                 slot_ids: Optional[list[int]] = None, debug: bool = False,
                 det_trial_id: str = "", det_experiment_id: str = "", det_agent_id: str = "",
                 det_cluster_id: str = "", trial_seed: int = 0, trial_run_id: int = 1,
                 allocation_id: str = "", managed_training: bool = True,
                 test_mode: bool = False, on_cluster: bool = False,
                 master_url: str = "", master_cert_file: Optional[str] = None,
                 master_cert_name: Optional[str] = None) -> None:
        self.experiment_config = dict(experiment_config)
        self.hparams = dict(hparams)
        self.latest_checkpoint = latest_checkpoint
        self.steps_completed = steps_completed
        self.use_gpu = use_gpu
        self.container_gpus = list(container_gpus or [])
        self.slot_ids = list(slot_ids or [])
        self.debug = debug
        self.det_trial_id = det_trial_id
        self.det_experiment_id = det_experiment_id
        self.det_agent_id = det_agent_id
        self.det_cluster_id = det_cluster_id
        self.trial_seed = trial_seed
        self.trial_run_id = trial_run_id
        self.allocation_id = allocation_id
        self.managed_training = managed_training
        self.test_mode = test_mode
        self.on_cluster = on_cluster
        self.master_url = master_url
        self.master_cert_file = master_cert_file
        self.master_cert_name = master_cert_name


def _sample(spec: hp.Spec, rng: random.Random) -> Any:
    """One value of a hyperparameter spec, drawn as Determined's local test mode draws it."""
    if isinstance(spec, hp.Const):
        return spec.val
    if isinstance(spec, hp.Int):
        return rng.randint(int(spec.minval), int(spec.maxval))
    if isinstance(spec, hp.Double):
        return rng.uniform(spec.minval, spec.maxval)
    if isinstance(spec, hp.Log):
        return spec.base ** rng.uniform(spec.minval, spec.maxval)
    return rng.choice(list(spec.vals))


def random_hparams(raw: Any, rng: Optional[random.Random] = None) -> dict[str, Any]:
    """An experiment config's ``hyperparameters`` block with every range drawn
    at random (constants as they are), nested groups as nested dicts."""
    space = hp.parse_hyperparameters(raw or {})
    rng = rng or random.Random()
    return hp.build(space, {path: _sample(spec, rng) for path, spec in hp.leaves(space)})


def _make_local_execution_env(
    managed_training: bool,
    test_mode: bool,
    config: Optional[Mapping[str, Any]],
    checkpoint_dir: str,
    tensorboard_path: Optional[pathlib.Path] = None,
    hparams: Optional[Mapping[str, Any]] = None,
    limit_gpus: Optional[int] = None,
) -> tuple[Any, EnvContext]:
    """A test Core API context and the ``EnvContext`` of a local trial of
    ``config``: hparams drawn from its ranges unless given, the trial seed
    its ``reproducibility.experiment_seed`` (0), the GPUs ``nvidia-smi``
    lists (at most ``limit_gpus``)."""
    from determined_launch import core

    config = dict(config or {})
    uuids = gpu.get_gpu_uuids()[:limit_gpus] if limit_gpus is not None else gpu.get_gpu_uuids()
    seed = (config.get("reproducibility") or {}).get("experiment_seed", 0)
    env = EnvContext(
        experiment_config=config,
        hparams=dict(hparams) if hparams else random_hparams(config.get("hyperparameters")),
        use_gpu=bool(uuids), container_gpus=uuids, slot_ids=list(range(len(uuids))),
        debug=bool(config.get("debug", False)), trial_seed=int(seed),
        managed_training=managed_training, test_mode=test_mode,
    )
    context = core._dummy_init(checkpoint_storage=checkpoint_dir,
                               tensorboard_path=tensorboard_path)
    return context, env


@contextlib.contextmanager
def _catch_sys_exit() -> Iterator[None]:
    try:
        yield
    except SystemExit as e:
        raise errors.InvalidExperimentException(
            "caught a SystemExit: remove calls to sys.exit() from the model code") from e


@contextlib.contextmanager
def _local_execution_manager(context_dir: os.PathLike[str] | str) -> Iterator[None]:
    """Run the block as in a trial's container: the working directory is
    ``context_dir``, which is searched first for imports; a ``SystemExit``
    from model code becomes ``InvalidExperimentException``."""
    cwd = os.getcwd()
    first = sys.path[0] if sys.path else None
    os.chdir(context_dir)
    if sys.path:
        sys.path[0] = ""
    else:
        sys.path.append("")
    try:
        with _catch_sys_exit():
            yield
    finally:
        os.chdir(cwd)
        if first is not None:
            sys.path[0] = first
