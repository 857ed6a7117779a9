"""``python -m determined_launch.det.detached EXP_DIR STARTED -- ARGV``: the
detached driver of ``det e create``. Runs ``det-launch ARGV`` in this process
(so ``det_driver.json``'s pid is the driver's: ``det e pause`` signals it) and
records how it ended in ``det_end.json``."""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Sequence

from determined_launch.det import state


def main(argv: Sequence[str]) -> int:
    exp_dir, started = pathlib.Path(argv[0]), float(argv[1])
    status = 1
    try:
        from determined_launch.cli import main as launch

        status = launch(list(argv[3:]))
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    finally:
        state.write_json(exp_dir / state.END, {"status": status, "started": started,
                                               "ended": time.time()})
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
