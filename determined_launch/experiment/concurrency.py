"""How many trials one ``det-launch experiment`` runs at once, and on which GPUs.

Determined ran up to ``searcher.max_concurrent_trials`` trials at once (default
16), as many as the cluster had slots for, each on ``resources.slots_per_trial``
slots (default 1). Here the cluster is this machine (or this worker's share of
an allocation), so the default is::

    min(max_concurrent_trials or 16, this node's slots // a trial's slots)

and at least 1. Trials running at once each get their own GPUs
(``CUDA_VISIBLE_DEVICES``), so two trials never train on one device.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping, Sequence

#: Determined's default for searcher.max_concurrent_trials
DETERMINED_DEFAULT = 16


def default_concurrency(max_concurrent_trials: int, node_slots: int, trial_slots: int) -> int:
    """Trials at once when nothing on the command line says: the config's limit
    (0: unset, Determined's 16), and no more than the node's slots hold."""
    limit = max_concurrent_trials or DETERMINED_DEFAULT
    return max(1, min(limit, node_slots // max(trial_slots, 1)))


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """This machine's GPUs as ``CUDA_VISIBLE_DEVICES`` names them: its entries when
    set (a scheduler's share), else the NVIDIA device nodes' numbers."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    found = (re.fullmatch(r"/dev/nvidia(\d+)", p) for p in glob.glob("/dev/nvidia*"))
    return sorted((m.group(1) for m in found if m), key=int)


def gpu_groups(gpus: Sequence[str], trial_slots: int, concurrency: int) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` values of disjoint GPU groups, one per trial running
    at once; none when trials cannot each have their own (one trial at a time, no
    GPUs, or fewer GPUs than the trials need: then every trial sees them all)."""
    per = max(trial_slots, 1)
    if concurrency < 2 or len(gpus) < per * 2:
        return []
    return [",".join(gpus[i * per:(i + 1) * per]) for i in range(len(gpus) // per)]
