"""``det.experimental.test_one_batch``: Determined's smoke test of a Trial class.

It trains one batch, validates and checkpoints in test mode, as Determined's
``test_one_batch`` does for a ``PyTorchTrial`` (``pytorch.init`` and
``Trainer.fit(max_length=Batch(1), test_mode=True)``); the legacy runner's
``--test`` is the same from the command line. It runs in a temporary
directory, so it leaves no run and no checkpoint behind. torch is imported
only when it is called.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Optional

logger = logging.getLogger("determined_launch.pytorch")


def test_one_batch(trial_class: Any, config: Optional[Mapping[str, Any]] = None) -> None:
    """Build ``trial_class`` with ``config``'s hyperparameters (ranges drawn at
    random, as Determined does) and train, validate and checkpoint one batch."""
    from determined_launch import _testcompat, pytorch

    if not (isinstance(trial_class, type) and issubclass(trial_class, pytorch.PyTorchTrial)):
        raise TypeError(f"test_one_batch: {trial_class!r} is not a PyTorchTrial subclass "
                        "(the only Trial API here)")
    config = {**(config or {}), "scheduling_unit": 1}
    hparams = _testcompat.random_hparams(config.get("hyperparameters"))
    logger.info("test_one_batch: one batch of %s with hyperparameters %s",
                trial_class.__name__, hparams)
    # As Determined's: local training, so the searcher's metric is not looked for (one
    # batch validates once, and that checkpoint is kept whatever it reports).
    exp_conf = {k: v for k, v in config.items() if k != "searcher"}
    # Its own temporary run directory and storage: a smoke test leaves nothing behind.
    with tempfile.TemporaryDirectory(prefix="det-test-one-batch-") as tmp:
        with pytorch.init(hparams=hparams, exp_conf=exp_conf, enable_tensorboard_logging=False,
                          run_dir=os.path.join(tmp, "run"),
                          checkpoint_storage=os.path.join(tmp, "checkpoints")) as context:
            trial = trial_class(context)
            pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(1), test_mode=True,
                                                checkpoint_policy="all")
    logger.info("test_one_batch: passed")
