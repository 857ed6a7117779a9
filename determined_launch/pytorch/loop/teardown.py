"""Ending torch.distributed so that gloo cannot abort the process at exit.

The abort (``terminate called without an active exception``, SIGABRT, exit
status 134, issue 23 item 1b), seen in a core dump: a gloo worker thread
(``pt_gloo_runloop``) drops its reference to a finished collective only
*after* marking it complete, so the rank's main thread may already be past
it. When that release is the last reference to a tensor made in Python, it
decrefs the tensor's Python object, which takes the GIL; once the
interpreter is finalizing, taking the GIL ends the thread with
``pthread_exit``, whose unwinding through the (noexcept) destructor calls
``std::terminate``.

Only the process group's destructor joins those threads, so it must run
while the interpreter is alive. ``destroy_process_group()`` drops torch's
own references, but ``torch.distributed.nn.functional`` (which DDP's
constructor imports) binds ``group.WORLD`` as a default argument when it is
imported: imported after ``init_process_group``, it keeps the default group,
and its threads, alive until the interpreter's final garbage collection. So
does a DDP wrapper that outlives the group (a user's trial usually does).
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Iterable
from typing import Any

import torch.distributed as dist

logger = logging.getLogger("determined_launch.pytorch")


def release_stale_defaults() -> int:
    """Unbind destroyed process groups that torch's ``torch.distributed.nn.functional``
    captured as default ``group=`` arguments; ``None`` (the default group at call
    time) is what it binds when imported before any group exists. Returns how many."""
    module = sys.modules.get("torch.distributed.nn.functional")
    if module is None:
        return 0
    live = dist.distributed_c10d._world.pg_map
    released = 0
    for fn in list(vars(module).values()):
        defaults = getattr(fn, "__defaults__", None)
        if not defaults:
            continue
        stale = [isinstance(d, dist.ProcessGroup) and d not in live for d in defaults]
        if any(stale):
            fn.__defaults__ = tuple(None if s else d for d, s in zip(defaults, stale))
            released += 1
    return released


#: What a DDP wrapper holds the process group by (the C++ reducer and logger too).
_DDP_GROUP_ATTRS = ("reducer", "logger", "process_group")


def detach_ddp(models: Iterable[Any]) -> None:
    """Let DDP wrappers that outlive the group stop holding it; their ``.module``
    (the model) stays usable, their collectives do not."""
    from torch.nn.parallel import DistributedDataParallel

    for model in models:
        if isinstance(model, DistributedDataParallel):
            for name in _DDP_GROUP_ATTRS:
                model.__dict__.pop(name, None)


def end_process_group(*, barrier: bool, models: Iterable[Any] = ()) -> None:
    """Destroy the default process group (if any) and let its destructor join
    gloo's threads now. ``barrier``: first wait for every rank (a clean exit;
    never on an exception, where a peer may never arrive). ``models``: DDP wrappers
    made on the group, detached from it. Errors are logged, not raised: a peer that
    is already gone must not turn an exit into a failure."""
    if not dist.is_available():
        return
    if dist.is_initialized():  # else the user destroyed it: still let its threads go
        if barrier:
            try:
                dist.barrier()
            except Exception as e:  # noqa: BLE001 - a peer gone: still end ours
                logger.debug("barrier before destroy_process_group failed: %s", e)
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            logger.debug("destroy_process_group failed: %s", e)
            return
    detach_ddp(models)
    release_stale_defaults()
    gc.collect()  # a DDP model in a reference cycle may hold the last reference
