"""The "model" of restart_worker.py, without torch, so tests can compute the
uninterrupted run's weight: every sample's position moves the final weight."""

import math


def sample(step: int, rank: int) -> float:
    """The sample rank ``rank`` sees at global step ``step``."""
    return math.sin(1.3 * step + 0.7 * rank) + 0.1 * rank


def update(w: float, step: int, total: float) -> float:
    return 0.9 * w + 0.01 * (step + 1) * total
