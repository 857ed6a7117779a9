"""``python -m determined_launch.deepspeed [DS_ARGS... --] SCRIPT...``

``deepspeed`` arguments before ``--``, plus ``--ssh``/``--no-ssh`` (how
several nodes connect; see docs/backends.md). The script runs as a command
(``--no_python``), so write ``python train.py``, not ``train.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.backends.deepspeed import build_plan
from determined_launch.launch.launcher import LauncherOptions, main_for_backend


def main(argv: Optional[Sequence[str]] = None, options: Optional[LauncherOptions] = None) -> int:
    return main_for_backend("deepspeed", build_plan, argv, options)


if __name__ == "__main__":
    sys.exit(main())
