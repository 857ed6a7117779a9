"""``python -m wrap_rank`` and the ``wrap-rank`` console script."""

import sys

from wrap_rank._run import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
