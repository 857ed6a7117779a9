"""``DistributedContext``: authenticated allgather, gather and broadcast between workers.

``context`` is the public class, ``env`` reads launchers' variables (host
lists come from ``cluster/``), ``errors`` its exceptions, and
``transport/`` moves frames: ``wire`` (frames, HMAC-SHA256), ``links`` (the
hub/member protocol), ``chan`` (what a channel provides), ``direct`` and
``zeromq`` (the two channels).
"""

from determined_launch.core.distributed.context import (
    DistributedConfigError,
    DistributedContext,
    DistributedError,
    InsecureWarning,
)

__all__ = ["DistributedConfigError", "DistributedContext", "DistributedError", "InsecureWarning"]
