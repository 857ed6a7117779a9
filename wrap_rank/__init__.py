"""Prefix every line of a child's output with ``[rank=N] `` (standard library only).

``python -m wrap_rank [--no-redirect-stdio] RANK [--] CMD...``; see
docs/wrap_rank.md. This package never imports ``determined_launch`` (the
launcher imports it, not the reverse) nor anything outside the standard
library, so it starts fast in every worker.
"""

from wrap_rank._lines import LINE_CAP, LinePrefixer
from wrap_rank._run import STATUS_DIR_ENV, main

__all__ = ["LINE_CAP", "STATUS_DIR_ENV", "LinePrefixer", "main"]
