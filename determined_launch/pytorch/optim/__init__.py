"""Optimization: wrapped models, optimizers, LR schedulers (``LRScheduler``),
gradient aggregation, ``backward``/``step_optimizer`` and AMP (``Optimization``)."""
