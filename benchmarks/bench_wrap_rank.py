"""wrap_rank throughput and start-up, against cat, sed and Determined's wrap_rank.

Run by hand (never part of the test suite)::

    python benchmarks/bench_wrap_rank.py [--mb 200] [--repeat 3] [--startup-runs 30]

Throughput: a child ``cat``s a file of 100-byte lines into a pipe, a filter
prefixes each line, and the output goes to /dev/null or through one more
pipe to ``cat``. Every filter sees the same shape, so the MB/s (input bytes
per wall second, best of ``--repeat``, start-up included) compare directly:

* ``cat``: ``cat FILE | cat``, the pipe cost with no work at all;
* ``sed``: ``cat FILE | sed 's/^/[rank=0] /'``;
* ``ours``: ``python -m wrap_rank 0 -- cat FILE``;
* ``determined``: ``python -m determined.launch.wrap_rank 0 -- cat FILE``
  from the peer environment (``benchmarks/peer_env.sh``).

Start-up: median wall and CPU time of ``wrap_rank 0 -- true`` against a
bare ``python -c pass`` from the same interpreter, runs interleaved, with
bytecode cached as it is after ``pip install``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINE = b"x" * 99 + b"\n"
#: The launcher's relay (supervisor/relay.py) from stdin to stdout, as one
#: of its threads runs it.
_RELAY = (
    "import os; from determined_launch.supervisor.relay import ToolOutput; "
    "ToolOutput(os.devnull).pump(0, 1)"
)


def peer_python() -> str | None:
    try:
        out = subprocess.run(
            ["bash", str(REPO / "benchmarks" / "peer_env.sh")],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"peer environment unavailable: {e}", file=sys.stderr)
        return None
    return out.stdout.strip().splitlines()[-1]


def make_input(directory: str, mb: int) -> Path:
    path = Path(directory) / "lines.txt"
    block = LINE * 10_000  # 1 MB
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(block)
    return path


def timed(cmd: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True, env=env)
    return time.perf_counter() - start


def throughput(path: Path, peer: str | None, repeat: int, env: dict[str, str]) -> dict[str, float]:
    f = shlex.quote(str(path))
    py = shlex.quote(sys.executable)
    filters = {
        "cat": f"cat {f} | cat",
        "sed": f"cat {f} | sed 's/^/[rank=0] /'",
        "ours": f"{py} -m wrap_rank 0 -- cat {f}",
        # What a framework launcher's workers pay since issue 11 (defect 3):
        # one more pipe, and the launcher's relay routing every line.
        "ours+pipe": f"{py} -m wrap_rank 0 -- cat {f} | cat",
        "ours+relay": f"{py} -m wrap_rank 0 -- cat {f} | {py} -c {shlex.quote(_RELAY)}",
    }
    if peer:
        filters["determined"] = f"{shlex.quote(peer)} -m determined.launch.wrap_rank 0 -- cat {f}"
    sinks = {"/dev/null": " > /dev/null", "pipe": " | cat > /dev/null"}
    size_mb = path.stat().st_size / 1e6
    results: dict[str, float] = {}
    for sink_name, sink in sinks.items():
        best = {name: float("inf") for name in filters}
        for _ in range(repeat):  # interleaved, so noise hits every filter alike
            for name, cmd in filters.items():
                best[name] = min(best[name], timed(cmd + sink, env))
        for name, seconds in best.items():
            results[f"{name} -> {sink_name}"] = size_mb / seconds
    return results


def startup(peer: str | None, runs: int, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Median wall and CPU (user+sys, all descendants) milliseconds per command.

    CPU time is the steadier figure on a shared machine: waiting for a
    core does not count.
    """
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "ours: python -m wrap_rank 0 -- true": [
            sys.executable,
            "-m",
            "wrap_rank",
            "0",
            "--",
            "true",
        ],
    }
    if peer:
        # The same interpreter and site set-up for both wrappers: the
        # fairest comparison (ours needs only the standard library).
        cmds["peer python -c pass"] = [peer, "-c", "pass"]
        cmds["ours on peer python"] = [peer, "-m", "wrap_rank", "0", "--", "true"]
        cmds["determined: python -m determined.launch.wrap_rank 0 -- true"] = [
            peer,
            *("-m", "determined.launch.wrap_rank", "0", "--", "true"),
        ]
    for cmd in cmds.values():  # warm-up: fill the bytecode cache
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    wall: dict[str, list[float]] = {name: [] for name in cmds}
    cpu: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            wall[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {
        name: (statistics.median(wall[name]) * 1000, statistics.median(cpu[name]) * 1000)
        for name in cmds
    }


def report_throughput(peer: str | None, mb: int, repeat: int, env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = make_input(tmp, mb)
        print(f"\nthroughput, {mb} MB of 100-byte lines, best of {repeat} (MB/s of input)")
        rates = throughput(path, peer, repeat, env)
    for name, rate in rates.items():
        print(f"  {name:28s} {rate:8.0f} MB/s")
    for sink in ("/dev/null", "pipe"):
        ours = rates[f"ours -> {sink}"]
        relay = rates[f"ours+relay -> {sink}"]
        print(f"  relay -> {sink}: {relay / ours:.2f}x ours alone, "
              f"{relay / rates[f'ours+pipe -> {sink}']:.2f}x ours | cat")
        ratios = [
            f"{ours / rates[f'{peer_name} -> {sink}']:.2f}x {peer_name}"
            for peer_name in ("cat", "sed", "determined")
            if f"{peer_name} -> {sink}" in rates
        ]
        print(f"  ours -> {sink}: " + ", ".join(ratios))


def report_startup(peer: str | None, runs: int, env: dict[str, str]) -> None:
    print(f"\nstart-up, median of {runs} runs: wall ms, CPU ms")
    times = startup(peer, runs, env)
    for name, (wall, cpu) in times.items():
        print(f"  {name:62s} {wall:7.1f} {cpu:7.1f}")
    bare, ours = times["python -c pass"], times["ours: python -m wrap_rank 0 -- true"]
    print(
        f"  ours over bare python: {ours[0] - bare[0]:+.1f} ms wall, "
        f"{ours[1] - bare[1]:+.1f} ms CPU (target <= 40)"
    )
    if peer:
        det = times["determined: python -m determined.launch.wrap_rank 0 -- true"]
        det_bare, ours_peer = times["peer python -c pass"], times["ours on peer python"]
        print(
            f"  on the peer's python: ours {ours_peer[0] - det_bare[0]:+.1f} ms wall, "
            f"{ours_peer[1] - det_bare[1]:+.1f} ms CPU over bare; determined "
            f"{det[0] - det_bare[0]:+.1f} ms wall, {det[1] - det_bare[1]:+.1f} ms CPU; "
            f"ours is {det[0] / ours_peer[0]:.1f}x faster end to end"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="input size in MB")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per filter")
    parser.add_argument("--startup-runs", type=int, default=30)
    parser.add_argument("--only", choices=["throughput", "startup"], help="run one part")
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("WRAP_RANK_STATUS_DIR", None)
    peer = peer_python()
    print(f"python: {sys.executable} ({sys.version.split()[0]}); peer: {peer}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    if args.only != "startup":
        report_throughput(peer, args.mb, args.repeat, env)
    if args.only != "throughput":
        # As after ``pip install``: modules come from cached bytecode. The
        # cache goes to a temporary prefix, never into the source tree.
        with tempfile.TemporaryDirectory() as cache:
            startup_env = dict(env, PYTHONPYCACHEPREFIX=cache)
            startup_env.pop("PYTHONDONTWRITEBYTECODE", None)
            report_startup(peer, args.startup_runs, startup_env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
