"""Train the MNIST-style trial with the Trainer API (Determined 0.38's way).

    python train.py --batches 300          # 1 process
    det-launch --slots 2 torch -- python train.py --batches 300   # 2 ranks, DDP over gloo
    python train.py --batches 600          # same command, longer: resumes from the last checkpoint

Only the import lines differ from a Determined script.
"""

from __future__ import annotations

import argparse
import logging

from model_def import MNistTrial

import determined_launch as det  # was: import determined as det
from determined_launch import pytorch  # was: from determined import pytorch

HPARAMS = {
    "learning_rate": 1.0,
    "global_batch_size": 64,
    "n_filters1": 8,
    "n_filters2": 16,
    "dropout1": 0.25,
    "dropout2": 0.5,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int)
    length.add_argument("--epochs", type=int)
    args = parser.parse_args()
    max_length = pytorch.Epoch(args.epochs) if args.epochs else pytorch.Batch(args.batches or 300)

    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    # The trial's hyperparameters (a cluster-info file's trial, or --hparams /
    # --config for the local trial); the defaults above when it has none.
    hparams = dict(info.trial.hparams) if info.trial is not None and info.trial.hparams else HPARAMS
    with pytorch.init(hparams=hparams, exp_conf={"data": {"train_size": 6000}}) as context:
        trial = MNistTrial(context)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=max_length,
            validation_period=pytorch.Batch(100),
            checkpoint_period=pytorch.Batch(100),
            reporting_period=pytorch.Batch(50),
            # "latest" (FIX-10): resume from this run directory's newest checkpoint,
            # or start fresh when there is none; a cluster-info file's wins.
            latest_checkpoint=info.latest_checkpoint or "latest",
        )


if __name__ == "__main__":
    main()
