"""A worker for stop tests: marks itself ready, then sleeps.

``IGNORE_TERM=1`` makes it ignore SIGTERM and SIGINT, so only KILL stops it.
Imports nothing heavy, so a test's time goes to the launcher, not to torch.
"""

import os
import signal
import time

if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
ready = os.environ["READY_DIR"]
open(os.path.join(ready, f"rank-{os.environ.get('RANK', '0')}"), "w").close()
time.sleep(600)
