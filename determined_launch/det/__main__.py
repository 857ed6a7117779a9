"""``python -m determined_launch.det``: the ``det`` command."""

import sys

from determined_launch.det.main import main

sys.exit(main())
