"""Step 2: checkpoints, and stopping when asked to (pause and resume)."""

import logging
import pathlib
import time

import determined_launch as det


# NEW: save and load the "model weight" (x) and the progress (steps_completed).
def save_state(x, steps_completed, trial_id, checkpoint_directory):
    with checkpoint_directory.joinpath("state").open("w") as f:
        f.write(f"{x},{steps_completed},{trial_id}")


def load_state(trial_id, checkpoint_directory):
    checkpoint_directory = pathlib.Path(checkpoint_directory)
    with checkpoint_directory.joinpath("state").open("r") as f:
        x, steps_completed, ckpt_trial_id = [int(field) for field in f.read().split(",")]
    if ckpt_trial_id == trial_id:
        # Same trial (pause and resume): continue from the same batch.
        return x, steps_completed
    # A new trial starting from an old checkpoint: keep the weight, not the batch.
    return x, 0


def main(core_context, latest_checkpoint, trial_id, increment_by):
    x = 0

    # NEW: load a checkpoint if we were given one.
    starting_batch = 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            x, starting_batch = load_state(trial_id, path)
        logging.info(f"resuming from checkpoint {latest_checkpoint} at batch {starting_batch}")

    steps_completed = starting_batch
    for batch in range(starting_batch, 100):
        x += increment_by
        steps_completed = batch + 1
        time.sleep(0.1)
        logging.info(f"x is now {x}")
        if steps_completed % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )

            # NEW: checkpoint regularly, to lose little progress to a crash.
            checkpoint_metadata = {"steps_completed": steps_completed}
            with core_context.checkpoint.store_path(checkpoint_metadata) as (path, uuid):
                save_state(x, steps_completed, trial_id, path)

            # NEW: check for a preemption request (a signal to the launcher, the
            # operator's DET_PREEMPT_FILE, or request_preemption()).
            if core_context.preempt.should_preempt():
                # A checkpoint was just saved: exit now, resume on the next run.
                logging.info(f"preempted after {steps_completed} steps; exiting to be resumed")
                return

    core_context.train.report_validation_metrics(steps_completed=steps_completed, metrics={"x": x})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)

    # NEW: read the checkpoint to resume from and the trial id from the cluster info.
    info = det.get_cluster_info()
    assert info is not None, "this example only runs on-cluster"
    latest_checkpoint = info.latest_checkpoint
    trial_id = info.trial.trial_id

    with det.core.init() as core_context:
        # Off-cluster no master remembers the latest checkpoint; the run
        # directory does (docs/core_api.md, "Pause and resume").
        latest_checkpoint = latest_checkpoint or core_context.checkpoint.latest()
        main(
            core_context=core_context,
            latest_checkpoint=latest_checkpoint,
            trial_id=trial_id,
            increment_by=1,
        )
