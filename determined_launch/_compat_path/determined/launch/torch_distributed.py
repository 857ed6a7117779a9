"""``python -m determined.launch.torch_distributed``: runs ours (same arguments)."""

import sys

from determined_launch.torch_distributed import main

if __name__ == "__main__":
    sys.exit(main())
