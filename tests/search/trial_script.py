"""A tiny Core API trial for the search tests: no torch, milliseconds per step.

Its searcher metric is a known function of its hparams (minimum at x=0.7,
layers=2) that improves with training length, so ASHA's choices can be
checked. It resumes from its latest checkpoint and stops on preemption.
"""

import json
import os
import pathlib
import time

import determined_launch as det
from determined_launch import core


def loss(hp, step):
    return (hp.get("x", 0.7) - 0.7) ** 2 + 0.1 * abs(hp.get("layers", 2) - 2) + 1.0 / step


def save(ctx, step):
    if ctx.distributed.rank == 0:
        with ctx.checkpoint.store_path({"step": step}) as (path, _):
            (pathlib.Path(path) / "state.json").write_text(json.dumps({"step": step}))


def die_like_oom(trackers_file):
    """SIGKILL ourselves (as the OOM killer would) once the trackers started
    their run: nothing in this process can end it any more."""
    deadline = time.monotonic() + 120
    while "mlflow" not in (trackers_file.read_text() if trackers_file.exists() else ""):
        assert time.monotonic() < deadline, "the mlflow run never started"
        time.sleep(0.05)
    os.kill(os.getpid(), 9)


def main():
    info = det.get_cluster_info()
    hp = dict(info.trial.hparams)
    hp.update(hp.get("cases", {}).get(hp.get("case"), {}))  # per-trial variations of a test
    if hp.get("invalid"):
        with core.init():
            raise det.InvalidHP("x is not allowed")
    if hp.get("env_probe"):  # what of the experiment's environment reached the trial
        pathlib.Path(os.environ["DET_RUN_DIR"], "env_probe.json").write_text(
            json.dumps({k: v for k, v in os.environ.items() if "STUDY" in k}))
    marker = pathlib.Path(os.environ["DET_RUN_DIR"], "failed_once")
    if (hp.get("fail_once") or hp.get("fail_once_on_node") == info.container_rank) and \
            not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise SystemExit(3)
    dist = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist = core.DistributedContext.from_torch_distributed()
    elif info.num_nodes > 1:  # det-launch exec on several nodes: one process per node
        node, nodes = info.container_rank, info.num_nodes
        dist = core.DistributedContext(rank=node, size=nodes, local_rank=0, local_size=1,
                                       cross_rank=node, cross_size=nodes, chief_ip=info.chief_ip)
    period = int(hp.get("period", 4))
    metric = hp.get("metric_name", "loss")
    with core.init(distributed=dist) as ctx:
        with open(os.environ["DET_RUN_DIR"] + "/searcher_env.log", "w") as f:
            f.write(f"{os.environ.get('DET_SEARCHER_METRIC')} "
                    f"{os.environ.get('DET_SMALLER_IS_BETTER')}\n")
        with open(os.environ["DET_RUN_DIR"] + "/ranks.log", "a") as f:
            f.write(f"{ctx.distributed.rank}/{ctx.distributed.size}\n")
        step = 0
        if info.latest_checkpoint:
            with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
                step = json.loads((pathlib.Path(path) / "state.json").read_text())["step"]
        stop = False
        length = int(os.environ.get("DET_TEST_LENGTH") or info.trial.max_length)
        ckpt_every = int(hp.get("ckpt_every", 0))
        ops = ctx.searcher.operations() if hp.get("ops", True) else [None]
        for op in ops:
            target = op.length if op is not None else length
            while step < target:
                step += 1
                time.sleep(float(hp.get("sleep", 0.0)))
                if ctx.distributed.rank == 0:
                    with open(os.environ["DET_RUN_DIR"] + "/batches.log", "a") as f:
                        f.write("1\n")
                if step % period == 0 and ctx.distributed.rank == 0:
                    ctx.train.report_validation_metrics(
                        step, {metric: loss(hp, step), "batches": step,
                               "world_size": ctx.distributed.size})
                if ckpt_every and step % ckpt_every == 0:
                    save(ctx, step)
                if hp.get("kill_self_at") == step:
                    die_like_oom(pathlib.Path(os.environ["DET_RUN_DIR"], "trackers.json"))
                if ctx.preempt.should_preempt():
                    save(ctx, step)
                    stop = True
                    break
            if stop:
                break
            if op is not None and ctx.distributed.rank == 0:
                op.report_completed(loss(hp, step))


if __name__ == "__main__":
    main()
