"""``DistributedContext``: authenticated allgather, gather and broadcast between workers.

Layout: ``context`` (the public class), ``factories`` (its ``from_*``
constructors), ``env`` (reading launchers' variables; host lists come from
``cluster/``), ``wiring`` (setting up links), ``ops`` (the collective
algorithms), ``errors``, and ``transport/`` (``wire`` frames and HMAC,
``links`` hub/member protocol, ``chan`` the channel interface, ``direct``
and ``zeromq`` the two channels).
"""

from determined_launch.core.distributed.context import DistributedContext
from determined_launch.core.distributed.errors import (
    DistributedConfigError,
    DistributedError,
    InsecureWarning,
)

__all__ = ["DistributedConfigError", "DistributedContext", "DistributedError", "InsecureWarning"]
