"""The "model" of elastic_worker.py, without torch: a global sample stream
whose every sample's position moves the final weight, so tests can compute
the uninterrupted run's weight for any number of ranks."""

import math

#: samples per step, over all ranks: divides by 1, 2 and 3 ranks
GLOBAL_BATCH = 6


def sample(index: int) -> float:
    """The sample at ``index`` of the global stream."""
    return math.sin(1.3 * index) + 0.01 * index


def update(w: float, step: int, total: float) -> float:
    return 0.9 * w + 0.01 * (step + 1) * total
