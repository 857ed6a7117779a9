"""Determined's Core API tutorials 2 and 4, in their own patterns, with only
the import changed: the trial id, hyperparameters and checkpoint to resume
from come from ``det.get_cluster_info()``; nothing else resumes.

``python tutorial_resume.py``: one process (tutorial 2).
``python tutorial_resume.py launcher``: tutorial 4's hand-written launcher,
which starts ``python3 -m determined.launch.wrap_rank RANK -- ... worker``.

``TOUCH_AT=N`` (with ``TOUCH_FILE``): the chief creates the preempt file
after step N, so the preemption lands at a known step.
"""

import logging
import os
import pathlib
import subprocess
import sys
import time

import determined_launch as det

MAX_LENGTH = 30


def save_state(x, steps_completed, trial_id, checkpoint_directory):
    with checkpoint_directory.joinpath("state").open("w") as f:
        f.write(f"{x},{steps_completed},{trial_id}")


def load_state(trial_id, checkpoint_directory):
    checkpoint_directory = pathlib.Path(checkpoint_directory)
    with checkpoint_directory.joinpath("state").open("r") as f:
        x, steps_completed, ckpt_trial_id = [int(field) for field in f.read().split(",")]
    if ckpt_trial_id == trial_id:
        return x, steps_completed
    return x, 0


def main(core_context, latest_checkpoint, trial_id, increment_by):
    chief = core_context.distributed.rank == 0
    x = 0
    starting_batch = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            x, starting_batch = load_state(trial_id, path)
    for batch in range(starting_batch, MAX_LENGTH):
        x += sum(core_context.distributed.allgather(increment_by))
        steps_completed = batch + 1
        time.sleep(0.05)
        if chief:
            print(f"x is now {x}", flush=True)
            if steps_completed == int(os.environ.get("TOUCH_AT", "0")):
                pathlib.Path(os.environ["TOUCH_FILE"]).touch()
        if steps_completed % 5 == 0:
            if chief:
                core_context.train.report_validation_metrics(
                    steps_completed=steps_completed, metrics={"x": x})
                with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (
                        path, _uuid):
                    save_state(x, steps_completed, trial_id, path)
            if core_context.preempt.should_preempt():
                return


def launcher_main(slots_per_node, cross_rank):
    procs = []
    for local_rank in range(slots_per_node):
        rank = cross_rank * slots_per_node + local_rank
        procs.append(subprocess.Popen([
            sys.executable, "-m", "determined.launch.wrap_rank", str(rank), "--",
            sys.executable, __file__, "worker", str(rank), str(local_rank)]))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    latest_checkpoint = info.latest_checkpoint
    trial_id = info.trial.trial_id
    hparams = info.trial.hparams
    slots_per_node = len(info.slot_ids)
    num_nodes = len(info.container_addrs)
    cross_rank = info.container_rank

    if sys.argv[1:2] == ["launcher"]:
        sys.exit(launcher_main(slots_per_node, cross_rank))
    distributed = None
    if sys.argv[1:2] == ["worker"]:
        rank, local_rank = int(sys.argv[2]), int(sys.argv[3])
        distributed = det.core.DistributedContext(
            rank=rank, size=num_nodes * slots_per_node, local_rank=local_rank,
            local_size=slots_per_node, cross_rank=cross_rank, cross_size=num_nodes,
            chief_ip=info.container_addrs[0])
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, latest_checkpoint, trial_id, hparams["increment_by"])
