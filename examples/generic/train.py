# train.py: seed 000's Generic API tutorial (steps 1-3 and "Pause and Resume"),
# with only the import changed and its typos fixed (see README.md).

import random

import torch
from data import build_datasets
from model import build_model, eval_model, train_model

if __name__ == "__main__":
    # initialize a context object for accessing the Generic API
    import determined_launch as det  # was: import determined
    context = det.generic.init()

    # seed RNGs based on context-provided seed
    seed = context.training.trial_seed
    random.seed(seed)
    torch.random.manual_seed(seed)
    # ... also seed any other RNGs you need to

    # read hyperparameters from the context object
    hparams = context.training.hparams

    model, loss_fn, opt = build_model(hparams["learning_rate"])

    train_data, eval_data = build_datasets(hparams["batch_size"])

    last_epoch = -1
    # keep track of how many batches we have trained
    batches_trained = 0

    # read state from the last checkpoint
    if context.latest_checkpoint is not None:
        with context.latest_checkpoint as path:
            state = torch.load(f"{path}/my_checkpoint")
        model.load_state_dict(state["model"])
        last_epoch = state["epoch"]
        batches_trained = state["batches_trained"]

    # basic searcher API: just find out how long to train for
    searcher_op = context.training.basic_search()

    # Only train for the amount that remains
    for epoch in range(last_epoch + 1, searcher_op.epochs):
        if context.should_preempt():
            break

        # train model
        train_loss = train_model(model, loss_fn, opt, train_data)
        print(f"after epoch {epoch}, train_loss={train_loss}")

        # report training metrics to the master
        batches_trained += len(train_data)
        context.training.report_training_metrics(
            batches_trained=batches_trained,
            metrics={"loss": train_loss},
        )

        # evaluate model
        eval_loss = eval_model(model, loss_fn, train_data)
        print(f"after epoch {epoch}, eval_loss={eval_loss}")

        # report validation metrics to the master
        context.training.report_validation_metrics(
            batches_trained=batches_trained,
            metrics={"loss": eval_loss},
        )

        if epoch == searcher_op.epochs - 1:
            # on the last epoch, report your final metric
            searcher_op.complete(eval_loss)
        else:
            # totally optional: tell the searcher about your intermediate
            # progress so the webui can estimate overall progress
            searcher_op.report_progress(epoch)

        # checkpoint every epoch for high fault-tolerance
        # also track how far we have trained
        state = {
            "model": model.state_dict(),
            "epoch": epoch,
            "batches_trained": batches_trained,
        }
        with context.checkpoint.save_path() as path:
            torch.save(state, f"{path}/my_checkpoint")
