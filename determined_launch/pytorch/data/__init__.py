"""Data: ``det.pytorch.DataLoader`` and batch helpers (the samplers stay at
``determined_launch.pytorch.samplers``, Determined's public module path)."""
