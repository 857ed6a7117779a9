"""Step 4: distributed training, one worker per slot on every node.

python 4_distributed.py launcher   # on every node; starts the workers
"""

import logging
import os
import pathlib
import sys
import time

import determined_launch as det


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
    x = 0

    starting_batch = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            x, starting_batch = load_state(trial_id, path)
        if core_context.distributed.rank == 0:
            logging.info(f"resuming from checkpoint {latest_checkpoint} at batch {starting_batch}")

    batch = starting_batch
    steps_completed = starting_batch
    last_checkpoint_batch = None
    for op in core_context.searcher.operations():
        while batch < op.length:
            # NEW: increment by the sum of every worker's increment_by value.
            # (That is increment_by * size, but it shows a collective.)
            all_increment_bys = core_context.distributed.allgather(increment_by)
            x += sum(all_increment_bys)
            steps_completed = batch + 1
            time.sleep(0.1)
            # NEW: some logs are easier to read if only the chief writes them.
            if core_context.distributed.rank == 0:
                logging.info(f"x is now {x}")
            if steps_completed % 10 == 0:
                # NEW: only the chief may report metrics and progress, or save
                # (non-sharded) checkpoints.
                if core_context.distributed.rank == 0:
                    core_context.train.report_training_metrics(
                        steps_completed=steps_completed, metrics={"x": x}
                    )
                    op.report_progress(steps_completed)
                    checkpoint_metadata = {"steps_completed": steps_completed}
                    with core_context.checkpoint.store_path(checkpoint_metadata) as (path, uuid):
                        save_state(x, steps_completed, trial_id, path)
                    last_checkpoint_batch = steps_completed
                # NEW: every rank calls should_preempt() in step and all get the
                # same answer, so all stop after the same step.
                if core_context.preempt.should_preempt():
                    logging.info(f"preempted after {steps_completed} steps; exiting to be resumed")
                    return
            batch += 1

        # NEW: only the chief may report validation metrics and completed operations.
        if core_context.distributed.rank == 0:
            core_context.train.report_validation_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
            op.report_completed(x)

    # NEW: again, only the chief may upload checkpoints.
    if core_context.distributed.rank == 0 and last_checkpoint_batch != steps_completed:
        checkpoint_metadata = {"steps_completed": steps_completed}
        with core_context.checkpoint.store_path(checkpoint_metadata) as (path, uuid):
            save_state(x, steps_completed, trial_id, path)


# NEW: launch one worker process per slot. Frameworks bring their own
# launchers (torch.distributed, horovod, deepspeed, all available as
# python -m determined_launch.<name>); this one starts the workers itself.
# launch_per_slot wraps each in wrap_rank (log lines prefixed with the rank),
# stops every worker if one fails, and turns a preemption signal into a
# request that every worker's should_preempt() sees.
def launcher_main():
    return det.launch_per_slot(lambda rank, local_rank: [sys.executable, __file__, "worker"])


def worker_main(
    slots_per_node, num_nodes, cross_rank, chief_ip, latest_checkpoint, trial_id, hparams
):
    # The launcher gives each worker its rank in the environment.
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])

    # NEW: create a DistributedContext for the workers to talk to each other.
    distributed = det.core.DistributedContext(
        rank=rank,
        size=num_nodes * slots_per_node,
        local_rank=local_rank,
        local_size=slots_per_node,
        cross_rank=cross_rank,
        cross_size=num_nodes,
        chief_ip=chief_ip,
    )
    with det.core.init(distributed=distributed) as core_context:
        main(
            core_context=core_context,
            latest_checkpoint=latest_checkpoint or core_context.checkpoint.latest(),
            trial_id=trial_id,
            increment_by=hparams["increment_by"],
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)

    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    slots_per_node = len(info.slot_ids)
    num_nodes = len(info.container_addrs)
    cross_rank = info.container_rank
    chief_ip = info.container_addrs[0]

    if sys.argv[1:] == ["launcher"]:
        sys.exit(launcher_main())
    elif sys.argv[1:] == ["worker"]:
        worker_main(
            slots_per_node,
            num_nodes,
            cross_rank,
            chief_ip,
            info.latest_checkpoint,
            info.trial.trial_id,
            info.trial.hparams,
        )
    else:
        sys.exit("usage: python 4_distributed.py launcher")
