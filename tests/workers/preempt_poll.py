"""Waits for the launcher's preemption file, records when it saw it, acks, exits 0.

Uses only the environment contract (no library), to test the launcher's side
of preemption on its own.
"""

import os
import sys
import time

rank = os.environ["RANK"]
signal_file = os.environ["DET_PREEMPT_SIGNAL_FILE"]
out_dir = os.environ["READY_DIR"]
# Tell the launcher this worker watches for preemption (core.init does this).
open(os.environ["DET_PREEMPT_LISTEN_FILE"], "w").close()
open(os.path.join(out_dir, f"rank-{rank}"), "w").close()
deadline = time.time() + 120
while not os.path.exists(signal_file):
    if time.time() > deadline:
        sys.exit(9)
    time.sleep(0.01)
with open(os.path.join(out_dir, f"seen-{rank}"), "w") as f:
    f.write(repr(time.time()))
if os.environ.get("NO_ACK") is None:
    open(os.environ["DET_PREEMPT_ACK_FILE"], "w").close()
