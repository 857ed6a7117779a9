"""``python -m determined.launch.horovod``: runs ``python -m determined_launch.horovod``."""

import sys

from determined_launch.horovod import main

if __name__ == "__main__":
    sys.exit(main())
