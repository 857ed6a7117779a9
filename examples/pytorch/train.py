"""Train the MNIST-style trial with the Trainer API, in the pattern of
Determined 0.38's ``examples/tutorials/mnist_pytorch/train.py``: local mode
(``det.get_cluster_info() is None``) reads ``./const.yaml``; under a launcher
the trial's own hyperparameters and checkpoint come from the cluster info.

    python train.py --batches 300                                        # local mode
    det-launch experiment const.yaml                                     # its entrypoint
    det-launch --slots 2 --config const.yaml torch -- python train.py   # 2 ranks, DDP over gloo
    python train.py --batches 600      # same command, longer: resumes from the last checkpoint

Only the import lines differ from a Determined script.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
from typing import Any

import yaml  # Determined's example reads const.yaml with ruamel.yaml
from model_def import MNistTrial

import determined_launch as det  # was: import determined as det
from determined_launch import pytorch  # was: from determined import pytorch

# The dataset's size (a Determined config's `data` block)
EXP_CONF = {"data": {"train_size": 6000, "val_size": 1000}}


def run(max_length: Any, local: bool = False) -> None:
    info = det.get_cluster_info()
    if local:
        # For convenience, use hparams from const.yaml for local mode.
        conf = yaml.safe_load(pathlib.Path("./const.yaml").read_text())
        hparams = conf["hyperparameters"]
        # "latest" (FIX-10): resume this run directory's newest checkpoint, if any
        latest_checkpoint = "latest"
    else:
        assert info is not None
        hparams = info.trial.hparams  # the trial's (det-launch --config, or the experiment's)
        latest_checkpoint = info.latest_checkpoint  # resume where a preempted run stopped

    with pytorch.init(hparams=dict(hparams), exp_conf=EXP_CONF) as train_context:
        trial = MNistTrial(train_context, hparams=hparams)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(
            max_length=max_length,
            latest_checkpoint=latest_checkpoint,
            validation_period=pytorch.Batch(100),
            checkpoint_period=pytorch.Batch(100),
            reporting_period=pytorch.Batch(50),
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)

    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--batches", type=int)
    group.add_argument("--epochs", type=int)
    args = parser.parse_args()
    if args.batches:
        max_length = pytorch.Batch(args.batches)
    elif args.epochs:
        max_length = pytorch.Epoch(args.epochs)
    else:
        max_length = pytorch.Batch(300)  # default training length

    local_training = det.get_cluster_info() is None
    run(max_length, local=local_training)
