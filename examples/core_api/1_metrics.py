"""Step 1: report training and validation metrics through the Core API."""

import logging
import time

# NEW: import determined (here: its standalone launch layer).
import determined_launch as det


def main(core_context, increment_by):
    x = 0
    for batch in range(100):
        x += increment_by
        steps_completed = batch + 1
        time.sleep(0.1)
        logging.info(f"x is now {x}")
        # NEW: report training metrics every 10 steps.
        if steps_completed % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
    # NEW: report a "validation" metric at the end.
    core_context.train.report_validation_metrics(steps_completed=steps_completed, metrics={"x": x})


if __name__ == "__main__":
    # NEW: log with det.LOG_FORMAT, so log lines carry their level.
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)

    # NEW: create a core.Context and pass it to main().
    with det.core.init() as core_context:
        main(core_context=core_context, increment_by=1)
