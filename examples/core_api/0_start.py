"""Step 0: the "model" before any Core API: increment an integer in a loop."""

import time


def main(increment_by):
    x = 0
    for _batch in range(100):
        x += increment_by
        time.sleep(0.1)
        print("x is now", x)


if __name__ == "__main__":
    main(increment_by=1)
