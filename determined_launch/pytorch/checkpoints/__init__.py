"""Checkpoints: saving and restoring the loop's state (``Checkpointer``), the
checkpoint policy, the file format, the ``code/`` copy, and loading a trial
from a checkpoint directory."""
