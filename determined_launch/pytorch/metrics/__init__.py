"""Metrics: reducers, training-metric aggregation, validation, TensorBoard."""
