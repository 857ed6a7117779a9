"""det-launch ui's memory against the issue 34 §1 sequence (python benchmarks/bench_ui_memory.py).

A run with a 200 MB ``training.jsonl`` (about 2.4 million rows of three
numbers) is served by a real ``det-launch ui`` on loopback, then asked, as a
visitor without a token may on loopback: the chart (``max_points=1000``),
every row from ``since=2..6``, and ``max_points`` of every size from 2 to
100,000 in steps of 997. Printed: the server's RSS after the first read, its
peak (``VmHWM``) over the sequence, and the time of the slowest request.
Target (issue 34): peak under 300 MB.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests._ui_helpers import Served  # noqa: E402
from tests.test_ui_hardening import _rss_kib, write_stream  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_420_000, help="rows (2.42M: about 200 MB)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = pathlib.Path(tmp) / "runs" / "big"
        run.mkdir(parents=True)
        write_stream(run / "training.jsonl", args.rows)
        size = (run / "training.jsonl").stat().st_size
        served = Served(str(run.parent))
        try:
            url = served.url + "api/v1/runs/big/metrics"
            slowest = 0.0

            def get(query: str) -> None:
                nonlocal slowest
                started = time.monotonic()
                with urllib.request.urlopen(f"{url}?{query}", timeout=600) as r:  # noqa: S310
                    r.read()
                slowest = max(slowest, time.monotonic() - started)

            started = time.monotonic()
            get("since=0")  # waits for the whole read
            first = time.monotonic() - started
            slowest = 0.0
            after_read = _rss_kib(served.proc.pid, "VmRSS") / 1024
            get("max_points=1000")
            for since in range(2, 7):
                get(f"since={since}")
            for points in range(2, 100_000, 997):
                get(f"max_points={points}")
            peak = _rss_kib(served.proc.pid, "VmHWM") / 1024
            now = _rss_kib(served.proc.pid, "VmRSS") / 1024
        finally:
            served.stop()
    print(f"training.jsonl {size / 1e6:.0f} MB, {args.rows} rows: RSS after the read "
          f"{after_read:.0f} MB, peak over the sequence {peak:.0f} MB, at the end {now:.0f} MB; "
          f"first request (the whole parse) {first:.1f} s, slowest after it {slowest:.2f} s")


if __name__ == "__main__":
    main()
