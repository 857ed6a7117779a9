"""``python -m determined.launch.wrap_rank``: runs ``python -m wrap_rank`` (same arguments)."""

import sys

from wrap_rank import main

if __name__ == "__main__":
    sys.exit(main())
