"""The training loop (``_PyTorchTrialController``), the batch step it drives and
the data loaders it builds; progress display and process-group teardown."""
