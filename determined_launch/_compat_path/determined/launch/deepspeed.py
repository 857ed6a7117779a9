"""``python -m determined.launch.deepspeed``: runs ``python -m determined_launch.deepspeed``."""

import sys

from determined_launch.deepspeed import main

if __name__ == "__main__":
    sys.exit(main())
