"""Optimization: wrapped models, optimizers, LR schedulers, gradient
aggregation, ``backward``/``step_optimizer`` and AMP (``Optimization``)."""
