"""Legacy entrypoint runner: ``python -m determined_launch.pytorch [--config const.yaml]
[--test] model_def:MyTrial``.

Runs a pre-Trainer ``PyTorchTrial`` (a ``model_def.py`` plus the experiment
config Determined would have been given) exactly as Determined's harness
does, with the config mapped to ``init``/``fit`` arguments by ``_runner``.
Works under ``det-launch --slots N torch -- python -m determined_launch.pytorch ...``
(``init`` joins the process group). Rerunning the same command resumes from
the newest checkpoint of the run directory.

Mistakes in the command line, config or entrypoint print one line and exit
with status 2; exceptions from the trial's own code keep their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, Optional

from determined_launch.errors import EXIT_USAGE, InvalidCheckpointException, LaunchError
from determined_launch.pytorch.api.runner import (
    RunnerError,
    RunPlan,
    parse_overrides,
    plan_run,
    read_config,
)

PROG = "python -m determined_launch.pytorch"
logger = logging.getLogger("determined_launch.pytorch")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise RunnerError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Train a Determined PyTorchTrial from its model_def:Class entrypoint "
        "and experiment config, as Determined's harness does.",
    )
    p.add_argument(
        "entrypoint",
        nargs="?",
        help="MODULE:CLASS of the PyTorchTrial (default: the config's 'entrypoint')",
    )
    p.add_argument("--config", help="experiment config (YAML or JSON), e.g. const.yaml")
    p.add_argument(
        "--test",
        action="store_true",
        help="train one batch, validate and checkpoint (Determined's --test)",
    )
    p.add_argument(
        "--hparam",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a hyperparameter (dotted for nested groups); needed for range hyperparameters",
    )
    p.add_argument(
        "--latest-checkpoint",
        metavar="ID_OR_PATH",
        help="resume from this checkpoint (default: the newest one of this run directory)",
    )
    return p


def load_trial_class(entrypoint: str) -> type:
    """Import ``MODULE:CLASS`` (the working directory first on ``sys.path``, as
    Determined runs the harness in the model directory)."""
    from determined_launch.pytorch.api.trial import PyTorchTrial

    module_name, _, qualname = entrypoint.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Only a missing entrypoint module is a usage error; a missing import
        # inside the user's module is their exception, traceback and all.
        if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
            raise
        raise RunnerError(
            f"cannot import module {module_name!r} of entrypoint {entrypoint!r} (not found in "
            f"{cwd} or on sys.path); run from the model directory"
        ) from None
    obj: Any = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise RunnerError(
                f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
                f"{qualname!r}; check the class name in {entrypoint!r}"
            )
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, PyTorchTrial)):
        raise RunnerError(
            f"{entrypoint} is not a PyTorchTrial subclass (this runner runs PyTorchTrials only)"
        )
    return obj


def run(plan: RunPlan, trial_class: type) -> int:
    """``pytorch.init`` + ``Trainer.fit`` as Determined's ``_run_pytorch_trial`` does."""
    from determined_launch import errors
    from determined_launch.pytorch import Trainer, init

    try:
        with init(
            hparams=plan.hparams,
            exp_conf=plan.exp_conf,
            aggregation_frequency=plan.aggregation_frequency,
        ) as context:
            context._set_default_gradient_compression(plan.gradient_compression)
            context._set_default_average_aggregated_gradients(plan.average_aggregated_gradients)
            context._set_is_pre_trainer()
            trial = trial_class(context)
            if context.distributed.size > 1 and context.distributed.rank != 0:
                logging.getLogger().setLevel(logging.WARNING)
            logger.info("training %s with %s", trial_class.__name__, _describe(plan))
            Trainer(trial, context).fit(**plan.fit_kwargs)
    except errors.InvalidExperimentException as e:
        # Framework checks of the trial/config (batch size vs ranks, missing
        # wrap_model, ...): a mistake to fix, not a crash.
        raise RunnerError(f"invalid experiment: {e}") from None
    return 0


def _describe(plan: RunPlan) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in plan.fit_kwargs.items())


def main(argv: Optional[Sequence[str]] = None) -> int:
    from determined_launch._user import show_info_logs
    from determined_launch.core._context import resolve_info

    show_info_logs()
    try:
        ns = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
        config = read_config(ns.config) if ns.config else None
        info = resolve_info()
        plan = plan_run(
            config,
            ns.entrypoint,
            test_mode=ns.test,
            hparam_overrides=parse_overrides(ns.hparam),
            trial_hparams=info.trial.hparams if info.trial is not None else None,
            latest_checkpoint=ns.latest_checkpoint,
            info_latest_checkpoint=info.latest_checkpoint,
        )
        if ns.test and info.trial is not None and not info.trial.local:
            raise RunnerError(
                "--test trains one batch locally, but a trial cluster-info file is set "
                "(Determined: test_mode is only supported in local training mode); unset "
                "DET_CLUSTER_INFO_FILE or drop --test"
            )
        if ns.latest_checkpoint and os.path.isdir(ns.latest_checkpoint):
            from determined_launch.pytorch.checkpoints.files import find_state_file

            find_state_file(ns.latest_checkpoint)  # not a checkpoint: say so now
        trial_max = info.trial.max_length if info.trial is not None else None
        if "max_length" not in plan.fit_kwargs and trial_max is None:
            raise RunnerError(
                "the config sets no training length: add searcher.max_length "
                "(e.g. searcher: {name: single, metric: validation_loss, max_length: "
                "{batches: 1000}}), or pass --test"
            )
        trial_class = load_trial_class(plan.entrypoint)
        return run(plan, trial_class)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.exit_status or EXIT_USAGE
    except InvalidCheckpointException as e:
        print(f"{PROG}: error: --latest-checkpoint: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
