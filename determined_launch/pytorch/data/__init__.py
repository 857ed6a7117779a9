"""Data: ``det.pytorch.DataLoader``, batch sizes and batch helpers (the samplers stay at
``determined_launch.pytorch.samplers``, Determined's public module path)."""
