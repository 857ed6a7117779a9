import sys

from determined_launch.cli import main

sys.exit(main())
