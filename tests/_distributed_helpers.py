"""Helpers for the DistributedContext tests: jobs in threads or processes.

Run as a script, this module is a job worker::

    python tests/_distributed_helpers.py <scenario> '<json args>'

and prints one JSON line with what it saw, so tests can check every rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPO))

from determined_launch.core import DistributedContext, DistributedError  # noqa: E402
from tests._ports import free_port  # noqa: E402, F401  (tests import it from here)

SECRET = "test-secret-" + "x" * 20
BIG = 200_000  # bytes: more than a socket buffer, exercises partial writes


def layouts(cross: int, local: int) -> list[dict[str, int]]:
    """Ranks in node-major blocks, like torchrun's."""
    out = []
    for node in range(cross):
        for lr in range(local):
            out.append(
                dict(
                    rank=node * local + lr,
                    size=cross * local,
                    local_rank=lr,
                    local_size=local,
                    cross_rank=node,
                    cross_size=cross,
                )
            )
    return out


# ---------------------------------------------------------------- semantics
def exercise(ctx: DistributedContext) -> dict[str, Any]:
    """Every collective once, plus a large and a repeated one."""
    r = ctx.rank
    return {
        "allgather": ctx.allgather({"r": r}),
        "gather": ctx.gather(r * 10),
        "broadcast": ctx.broadcast(f"from {r}"),
        "allgather_local": ctx.allgather_local(r),
        "gather_local": ctx.gather_local(-r),
        "broadcast_local": ctx.broadcast_local(f"local {r}"),
        "big": [len(x) for x in ctx.allgather(bytes([r % 256]) * BIG)],
        "repeat": [ctx.allgather(i * 100 + r) for i in range(5)],
        "getters": [ctx.get_rank(), ctx.get_size(), ctx.get_local_rank(), ctx.get_num_agents()],
    }


def expected(lay: dict[str, int]) -> dict[str, Any]:
    """What ``exercise`` must return on the rank with layout ``lay``."""
    r, size, local_size = lay["rank"], lay["size"], lay["local_size"]
    node = [lay["cross_rank"] * local_size + i for i in range(local_size)]
    chief_of_node = node[0]
    return {
        "allgather": [{"r": i} for i in range(size)],
        "gather": [i * 10 for i in range(size)] if r == 0 else None,
        "broadcast": "from 0",
        "allgather_local": node,
        "gather_local": [-i for i in node] if lay["local_rank"] == 0 else None,
        "broadcast_local": f"local {chief_of_node}",
        "big": [BIG] * size,
        "repeat": [[i * 100 + k for k in range(size)] for i in range(5)],
        "getters": [r, size, lay["local_rank"], lay["cross_size"]],
    }


def run_threads(
    cross: int,
    local: int,
    body: Callable[[DistributedContext], Any] = exercise,
    timeout: float = 60,
    **kwargs: Any,
) -> list[Any]:
    """One job, one thread per rank, in this process; returns each rank's
    ``body(ctx)``. Raises the first rank's exception."""
    lays = layouts(cross, local)
    kwargs.setdefault("port", free_port())
    kwargs.setdefault("secret", SECRET)
    results: list[Any] = [None] * len(lays)
    errors: list[BaseException] = []

    def work(lay: dict[str, int]) -> None:
        try:
            with DistributedContext(**lay, chief_ip="127.0.0.1", **kwargs) as ctx:
                results[lay["rank"]] = body(ctx)
        except BaseException as e:  # noqa: B036 - reported to the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(lay,), daemon=True) for lay in lays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"a rank of the {cross}x{local} job hung")
    if errors:
        raise errors[0]
    return results


# ---------------------------------------------------------------- processes
def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    for var in ("DET_DIST_SECRET", "DET_DIST_PORT", "DET_DIST_IPC_DIR", "DET_DIST_TIMEOUT"):
        env.pop(var, None)
    env.update(extra)
    return env


class Job:
    """One process per rank running a scenario of this module."""

    def __init__(
        self,
        scenario: str,
        cross: int,
        local: int,
        args: Optional[dict[str, Any]] = None,
        env: Optional[dict[str, str]] = None,
        ranks: Optional[Sequence[int]] = None,
    ) -> None:
        self.lays = layouts(cross, local)
        common = dict(args or {})
        common.setdefault("port", free_port())
        env = env if env is not None else child_env(DET_DIST_SECRET=SECRET)
        self.procs: dict[int, subprocess.Popen[str]] = {}
        for lay in self.lays:
            if ranks is not None and lay["rank"] not in ranks:
                continue
            self.procs[lay["rank"]] = subprocess.Popen(
                [sys.executable, __file__, scenario, json.dumps({**common, "layout": lay})],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        self.out: dict[int, tuple[int, str, str]] = {}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def wait(self, timeout: float = 60) -> dict[int, tuple[int, str, str]]:
        deadline = time.monotonic() + timeout
        try:
            for rank, proc in self.procs.items():
                left = max(0.1, deadline - time.monotonic())
                stdout, stderr = proc.communicate(timeout=left)
                self.out[rank] = (proc.returncode, stdout, stderr)
        finally:
            self.kill()
        return self.out

    def result(self, rank: int) -> Any:
        code, stdout, stderr = self.out[rank]
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise AssertionError(f"rank {rank} exited {code} without a result:\n{stderr[-3000:]}")
        return json.loads(lines[-1])

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


# ---------------------------------------------------------------- scenarios
def _context(args: dict[str, Any]) -> DistributedContext:
    kwargs = {
        k: args[k]
        for k in ("port", "ipc_dir", "transport", "hierarchical", "timeout", "force_tcp")
        if k in args
    }
    return DistributedContext(**args["layout"], chief_ip="127.0.0.1", **kwargs)


def scenario_semantics(args: dict[str, Any]) -> dict[str, Any]:
    with _context(args) as ctx:
        return exercise(ctx)


def scenario_die(args: dict[str, Any]) -> dict[str, Any]:
    """Rank ``victim`` dies after the first allgather; with ``pending`` the
    others are already blocked in the next collective when it does."""
    ctx = _context(args)
    ctx.allgather(None)
    me = ctx.rank
    if me == args["victim"]:
        time.sleep(args.get("delay", 0.5))
        print(json.dumps({"died_at": time.time()}), flush=True)
        os._exit(0)
    if not args.get("pending", True):
        time.sleep(args.get("delay", 0.5) + 1.0)
    start = time.time()
    try:
        ctx.allgather(me)
    except DistributedError as e:
        # The context stays failed: the next collective raises at once.
        try:
            ctx.broadcast(1)
            again = False
        except DistributedError:
            again = True
        ctx.close()
        return {"error": str(e), "missing": list(e.missing_ranks), "at": time.time(),
                "start": start, "again": again}  # fmt: skip
    return {"error": None}


def scenario_soak(args: dict[str, Any]) -> dict[str, Any]:
    """Collectives in a loop, each result checked, until ``stop`` exists."""
    with _context(args) as ctx:
        Path(args["ready"], f"rank-{ctx.rank}").write_text(str(os.getpid()))
        rounds = 0
        bad = 0
        while True:
            stop = ctx.broadcast(os.path.exists(args["stop"]) if ctx.rank == 0 else None)
            if stop:
                break
            got = ctx.allgather(ctx.rank * 7 + rounds)
            bad += got != [r * 7 + rounds for r in range(ctx.size)]
            local = ctx.allgather_local(ctx.rank)
            bad += local != [ctx.rank - ctx.local_rank + i for i in range(ctx.local_size)]
            g = ctx.gather(rounds)
            bad += ctx.rank == 0 and g != [rounds] * ctx.size
            rounds += 1
            time.sleep(0.01)
        return {"rounds": rounds, "bad": bad, "dropped": ctx.dropped_frames}


def scenario_plain(args: dict[str, Any]) -> dict[str, Any]:
    """Two allgathers and nothing else (for warnings and exit behaviour)."""
    ctx = _context(args)
    out = [ctx.allgather(ctx.rank), ctx.allgather("x")]
    if args.get("no_close"):
        return {"out": out}
    ctx.close()
    return {"out": out}


def scenario_stall_exit(args: dict[str, Any]) -> dict[str, Any]:
    """The chief broadcasts a large object to a worker that has been
    stopped (SIGSTOP), then exits without closing anything."""
    ctx = _context(args)
    ctx.allgather(None)
    if ctx.rank != 0:
        time.sleep(60)
        return {}
    Path(args["ready"]).write_text("")
    while not os.path.exists(args["stopped"]):
        time.sleep(0.02)
    try:
        ctx.broadcast(b"z" * 20_000_000)
        error = None
    except DistributedError as e:
        error = str(e)
    print(json.dumps({"broadcast_error": error, "leaving_at": time.time()}), flush=True)
    return {"broadcast_error": error, "leaving_at": time.time()}


def scenario_torchrun(args: dict[str, Any]) -> dict[str, Any]:
    """Under torchrun (or det-launch torch): rank layout from the environment."""
    with DistributedContext.from_torch_distributed() as ctx:
        out = exercise(ctx)
        out["layout"] = dict(
            rank=ctx.rank,
            size=ctx.size,
            local_rank=ctx.local_rank,
            local_size=ctx.local_size,
            cross_rank=ctx.cross_rank,
            cross_size=ctx.cross_size,
        )
        out["transport"] = ctx.transport
        out["ipc"] = ctx._wiring is not None and ctx._wiring.ipc_dir is not None
    if args.get("out_dir"):
        Path(args["out_dir"], f"rank-{out['layout']['rank']}.json").write_text(json.dumps(out))
    return out


SCENARIOS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "semantics": scenario_semantics,
    "die": scenario_die,
    "soak": scenario_soak,
    "plain": scenario_plain,
    "stall_exit": scenario_stall_exit,
    "torchrun": scenario_torchrun,
}


if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]](json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    print(json.dumps(result), flush=True)
