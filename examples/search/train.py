"""A Core API trial for `det-launch experiment` (no torch needed to try it).

The "model" is a quadratic bowl whose loss depends on the hyperparameters, so
the search has something to find. The pattern is Determined's tutorial's:
hparams from the cluster info, resume from ``latest_checkpoint``, report
validation metrics with ``batches``, stop when preempted.
"""

import json
import math
import pathlib
import time

import determined_launch as det
from determined_launch import core


def loss(hp, batches):
    # best near lr=0.01, momentum=0.9, width=64; improves with training
    shape = (math.log10(hp["lr"]) + 2) ** 2 + (hp["momentum"] - 0.9) ** 2 + (hp["width"] != 64)
    return shape + 10.0 / (batches + 10)


def main():
    info = det.get_cluster_info()
    hp = info.trial.hparams
    with core.init() as ctx:
        batches = 0
        if info.latest_checkpoint:
            with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
                batches = json.loads((pathlib.Path(path) / "state.json").read_text())["batches"]
        while batches < hp["total_batches"]:
            time.sleep(0.005)  # one training step
            batches += 1
            if batches % 25 == 0:
                ctx.train.report_validation_metrics(
                    batches, {"loss": loss(hp, batches), "batches": batches})
            if ctx.preempt.should_preempt():
                with ctx.checkpoint.store_path({"batches": batches}) as (path, _):
                    (pathlib.Path(path) / "state.json").write_text(json.dumps({"batches": batches}))
                return


if __name__ == "__main__":
    main()
