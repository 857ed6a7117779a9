"""``det-launch experiment``: Determined's hyperparameter search without a master.

The top layer: it may import ``cluster``, ``launcher`` and ``config``; nothing
below imports it. Each trial is an ordinary launcher job (see docs/search.md).
Importing this package stays light: Optuna and matplotlib load only when a
search or a plot needs them.
"""
