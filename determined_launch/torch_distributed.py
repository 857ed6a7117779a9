"""``python -m determined_launch.torch_distributed [TORCH_OVERRIDES... --] SCRIPT...``

The same arguments as Determined's ``determined.launch.torch_distributed``:
torchrun options before ``--`` override ours; everything after is the script.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.backends.torch_distributed import build_plan
from determined_launch.launch.launcher import LauncherOptions, main_for_backend


def main(argv: Optional[Sequence[str]] = None, options: Optional[LauncherOptions] = None) -> int:
    return main_for_backend("torch_distributed", build_plan, argv, options)


if __name__ == "__main__":
    sys.exit(main())
