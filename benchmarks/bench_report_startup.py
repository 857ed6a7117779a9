"""CPU time of a whole Core API process that reports one metric (TensorBoard
AUTO mode on), this tree against an older one, interleaved.

    python benchmarks/bench_report_startup.py --before DIR [--reps 7]

``--before``: a checkout of an older tree (``git worktree add DIR REV``); both
are byte-compiled first, as installed packages are. Prints each side's
process CPU time (user + system, from the children's rusage) and the ratio.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = """
import tempfile
from determined_launch import core
from determined_launch.cluster import ClusterInfo
info = ClusterInfo(container_addrs=("127.0.0.1",), container_rank=0,
                   container_slot_counts=(1,), slot_ids=(0,), source="bench")
d = tempfile.mkdtemp()
with core.init(info=info, run_dir=d + "/run", checkpoint_storage=d + "/ck") as ctx:
    ctx.train.report_training_metrics(1, {"loss": 0.5})
"""


def cpu_of(repo: str) -> float:
    env = dict(os.environ, PYTHONPATH=repo)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, cwd=tmp,
                       capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    sides = {"before": os.path.abspath(args.before), "ours": REPO}
    for repo in sides.values():
        compileall.compile_dir(os.path.join(repo, "determined_launch"), quiet=2)
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.reps):
        for name, repo in sides.items():
            cpu[name].append(cpu_of(repo))
    for name, values in cpu.items():
        print(f"{name:7s} median {statistics.median(values):.3f} s CPU "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    ratio = statistics.median(cpu["ours"]) / statistics.median(cpu["before"])
    print(f"ours / before: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
