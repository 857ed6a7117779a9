"""``python -m determined_launch.wrap_rank``: the same command as ``python -m wrap_rank``.

Mirrors Determined's ``determined.launch.wrap_rank`` module name. The code
lives in the standard-library-only ``wrap_rank`` package, which workers can
run without importing this package.
"""

import sys

from wrap_rank import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
