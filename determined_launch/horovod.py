"""``python -m determined_launch.horovod [HVD_ARGS... --] SCRIPT...``

The same arguments as Determined's ``determined.launch.horovod``: horovodrun
arguments before ``--``, plus ``--autohorovod`` (one slot on one node runs
the script alone) and ``--ssh``/``--no-ssh`` (how several nodes connect;
see docs/backends.md).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.backends.horovod import build_plan
from determined_launch.launch.launcher import LauncherOptions, main_for_backend


def main(argv: Optional[Sequence[str]] = None, options: Optional[LauncherOptions] = None) -> int:
    return main_for_backend("horovod", build_plan, argv, options)


if __name__ == "__main__":
    sys.exit(main())
