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
  from the peer environment (``benchmarks/peer_env.sh``);
* ``ours x4``: four ranks, each ``wrap_rank N -- cat`` of a quarter of the
  file, into one shared pipe (issue 24: the lines must stay whole there);
* ``baseline`` and ``baseline x4``: the same with the wrap_rank of another
  checkout (``--baseline DIR``, e.g. ``git worktree add DIR HEAD~1``), run
  interleaved with ours, so a change is measured before and after at once.

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
    """``lines.txt`` of ``mb`` MB and ``quarter.txt`` of a quarter of it."""
    path = Path(directory) / "lines.txt"
    block = LINE * 10_000  # 1 MB
    with open(path, "wb") as f, open(Path(directory) / "quarter.txt", "wb") as q:
        for i in range(mb):
            f.write(block)
            if i < mb // 4:
                q.write(block)
    return path


def timed(cmd: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user+sys of every process in ``cmd``):
    CPU time is the steadier figure on a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def four_ranks(tree: Path, quarter: Path) -> str:
    """Four wrap_ranks of ``tree`` writing into one pipe (run from ``tree``:
    ``python -m`` looks in the working directory first)."""
    py, q = shlex.quote(sys.executable), shlex.quote(str(quarter))
    ranks = " ".join(f"{py} -m wrap_rank {r} -- cat {q} &" for r in range(4))
    return f"(cd {shlex.quote(str(tree))} && {{ {ranks} wait; }})"


def throughput(
    path: Path, peer: str | None, repeat: int, env: dict[str, str], baseline: Path | None
) -> dict[str, float]:
    f = shlex.quote(str(path))
    py = shlex.quote(sys.executable)
    quarter = path.parent / "quarter.txt"
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
    filters["ours x4"] = four_ranks(REPO, quarter)
    if baseline is not None:
        b = shlex.quote(str(baseline))
        filters["baseline"] = f"(cd {b} && PYTHONPATH={b} {py} -m wrap_rank 0 -- cat {f})"
        filters["baseline x4"] = four_ranks(baseline, quarter)
    # What each filter reads, in MB (the x4 ones read four quarters).
    sizes = {name: path.stat().st_size / 1e6 for name in filters}
    for name in filters:
        if name.endswith(" x4"):
            sizes[name] = 4 * quarter.stat().st_size / 1e6
    sinks = {"/dev/null": " > /dev/null", "pipe": " | cat > /dev/null"}
    results: dict[str, float] = {}
    for sink_name, sink in sinks.items():
        best = {name: float("inf") for name in filters}
        cpu: dict[str, list[float]] = {name: [] for name in filters}
        for _ in range(repeat):  # interleaved, so noise hits every filter alike
            for name, cmd in filters.items():
                wall, used = timed(cmd + sink, env)
                best[name] = min(best[name], wall)
                cpu[name].append(used)
        for name, seconds in best.items():
            results[f"{name} -> {sink_name}"] = sizes[name] / seconds
            results[f"cpu {name} -> {sink_name}"] = (
                statistics.median(cpu[name]) * 1000 / sizes[name]
            )
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


def report_throughput(
    peer: str | None, mb: int, repeat: int, env: dict[str, str], baseline: Path | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = make_input(tmp, mb)
        print(f"\nthroughput, {mb} MB of 100-byte lines, best of {repeat} (MB/s of input)")
        rates = throughput(path, peer, repeat, env, baseline)
    for name, rate in rates.items():
        if not name.startswith("cpu "):
            cpu = rates[f"cpu {name}"]
            print(f"  {name:28s} {rate:8.0f} MB/s {cpu:8.2f} CPU ms/MB (median)")
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
        for name in ("ours", "ours x4", "baseline", "baseline x4"):
            if f"{name} -> {sink}" in rates and "determined -> " + sink in rates:
                ratio = rates[f"{name} -> {sink}"] / rates[f"determined -> {sink}"]
                cpu = rates[f"cpu determined -> {sink}"] / rates[f"cpu {name} -> {sink}"]
                print(f"  {name} -> {sink}: {ratio:.2f}x determined's MB/s, "
                      f"{cpu:.2f}x less CPU per MB")


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
    parser.add_argument("--baseline", type=Path, help="another checkout to measure alongside")
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("WRAP_RANK_STATUS_DIR", None)
    peer = peer_python()
    print(f"python: {sys.executable} ({sys.version.split()[0]}); peer: {peer}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    if args.only != "startup":
        report_throughput(peer, args.mb, args.repeat, env, args.baseline)
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
