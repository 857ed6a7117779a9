"""Speeds up the Core API tutorials' ``time.sleep`` "training steps" in tests.

On PYTHONPATH only for tests that run examples/core_api; scales every
``time.sleep`` by ``EXAMPLE_TIME_SCALE``, in the launchers' worker processes
too, so the tutorials run unchanged but faster.
"""

import os
import time

_scale = float(os.environ.get("EXAMPLE_TIME_SCALE", "1"))
if _scale != 1:
    _sleep = time.sleep

    def _scaled_sleep(seconds: float) -> None:
        _sleep(seconds * _scale)

    time.sleep = _scaled_sleep
