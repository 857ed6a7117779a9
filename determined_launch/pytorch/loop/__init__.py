"""The training loop (``_PyTorchTrialController``) and the batch step it drives;
progress display and process-group teardown."""
