"""``DistributedContext``: allgather, gather and broadcast of Python objects.

The seed's Core API coordination primitives, with three things
Determined's implementation lacks:

- every frame is authenticated (HMAC-SHA256 under the job secret) before
  anything in it is trusted, so nobody who merely reaches a port can make a
  worker unpickle bytes (``transport/wire``);
- a dead peer makes every other rank's collective raise ``DistributedError``
  within seconds, naming the missing ranks, instead of blocking forever
  (``transport/links``);
- ports come from the launcher (``DET_DIST_PORT``) or the caller, a busy
  port is a one-line error, and single-node jobs listen on a Unix socket in
  a private directory or on loopback only.

This module is the public class: its state, its API and its failure rule
(one failure fails every later call). How the links are set up is
``wiring``, the collective algorithms are ``ops``, the ``from_*``
constructors ``factories``. See docs/distributed.md for the user guide.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

from determined_launch import envvars
from determined_launch.core.distributed import env as dist_env
from determined_launch.core.distributed import ops
from determined_launch.core.distributed.errors import (
    DistributedConfigError,
    DistributedError,
    InsecureWarning,
)
from determined_launch.core.distributed.factories import Factories
from determined_launch.core.distributed.transport import wire
from determined_launch.core.distributed.wiring import Wiring

__all__ = ["DistributedConfigError", "DistributedContext", "DistributedError", "InsecureWarning"]

logger = logging.getLogger("determined_launch.core.distributed")

_warned_insecure = False
_warn_lock = threading.Lock()


def _warn_insecure() -> None:
    global _warned_insecure
    with _warn_lock:
        if _warned_insecure:
            return
        _warned_insecure = True
    warnings.warn(
        f"DistributedContext: no secret ({envvars.DIST_SECRET} unset); messages between ranks "
        "are not authenticated, so any local process that reaches the chief's loopback port "
        "could inject data. Our launchers set a secret; outside them, export "
        f"{envvars.DIST_SECRET} (16+ random characters, the same on every rank).",
        InsecureWarning,
        stacklevel=3,
    )


def check_layout(layout: dist_env.Layout) -> None:
    """Every field an int, every rank inside its size, one node = the job."""
    fields = {
        "rank": layout.rank,
        "size": layout.size,
        "local_rank": layout.local_rank,
        "local_size": layout.local_size,
        "cross_rank": layout.cross_rank,
        "cross_size": layout.cross_size,
    }
    for name, value in fields.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise DistributedConfigError(f"DistributedContext {name}={value!r} is not an int")
    ok = (
        0 <= layout.rank < layout.size
        and 0 <= layout.local_rank < layout.local_size <= layout.size
        and 0 <= layout.cross_rank < layout.cross_size <= layout.size
    )
    if ok and layout.cross_size == 1:
        ok = layout.local_size == layout.size and layout.local_rank == layout.rank
    if not ok:
        raise DistributedConfigError(
            "DistributedContext got an inconsistent layout: "
            + ", ".join(f"{k}={v}" for k, v in fields.items())
        )


class DistributedContext(Factories):
    """Coordination between the workers of one job.

    ``rank``/``size`` place this worker in the job, ``local_rank``/
    ``local_size`` on its node, ``cross_rank``/``cross_size`` the node in the
    job. ``chief_ip`` (or ``DET_CHIEF_IP``) is the address of rank 0's node,
    required when ``cross_size > 1``.

    Extra keyword arguments (all optional, the environment supplies them
    under our launchers):

    - ``port``: the chief's TCP port (``DET_DIST_PORT``; else
      ``MASTER_PORT + 2``; else 29502). Also names the ipc socket.
    - ``secret``: the job secret for HMAC-SHA256 (``DET_DIST_SECRET``).
    - ``timeout``: seconds one collective (and start-up) may wait before it
      raises ``DistributedError`` (``DET_DIST_TIMEOUT``; default: wait as
      long as the peers are alive).
    - ``ipc_dir``: private 0700 directory for node-local Unix sockets
      (``DET_DIST_IPC_DIR``; loopback TCP without it).
    - ``hierarchical``: route global collectives through the local chiefs.
    - ``force_tcp``: never use Unix sockets.
    - ``transport``: ``"direct"`` (stream sockets, default) or ``"zmq"``
      (``DET_DIST_TRANSPORT``).
    - ``env``: the environment to read instead of ``os.environ``.

    Creating the context is a barrier: it returns once every rank has
    connected. A size-1 context opens no sockets.
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        cross_rank: int,
        cross_size: int,
        chief_ip: Optional[str] = None,
        port: Optional[int] = None,
        secret: Optional[str] = None,
        timeout: Optional[float] = None,
        ipc_dir: Optional[str] = None,
        hierarchical: bool = False,
        force_tcp: bool = False,
        transport: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        layout = dist_env.Layout(
            rank, size, local_rank, local_size, cross_rank, cross_size, "DistributedContext"
        )
        check_layout(layout)
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self.hierarchical = bool(hierarchical) and cross_size > 1
        self._closed = False
        self._failure: Optional[DistributedError] = None
        self._drops = wire.DropLog(logger)
        self._wiring: Optional[Wiring] = None
        #: The wiring while collectives may run (connected, not closed, not
        #: failed), else None: one check on every collective's way.
        self._live: Optional[Wiring] = None
        self.chief_ip: Optional[str] = None
        self.port: Optional[int] = None
        self.timeout: Optional[float] = None
        self.transport: Optional[str] = None
        if size == 1:
            return

        env = os.environ if env is None else env
        self.chief_ip = chief_ip or env.get(envvars.CHIEF_IP) or None
        if cross_size > 1 and not self.chief_ip:
            raise DistributedConfigError(
                f"DistributedContext spans {cross_size} nodes but has no chief address; pass "
                f"chief_ip= or set {envvars.CHIEF_IP}"
            )
        self.port = dist_env.resolve_port(port, env)
        self.timeout = dist_env.resolve_timeout(timeout, env)
        resolved_secret = dist_env.resolve_secret(secret, env)
        if resolved_secret is None:
            if cross_size > 1:
                raise DistributedConfigError(
                    f"DistributedContext spans {cross_size} nodes, so it must listen on the "
                    f"network, and refuses to do that without a secret: set {envvars.DIST_SECRET} "
                    "(16+ random characters, the same on every rank) or pass secret="
                )
            _warn_insecure()
        self.transport = dist_env.resolve_transport(transport, env)
        wiring = Wiring(
            layout,
            hierarchical=self.hierarchical,
            chief_ip=self.chief_ip,
            port=self.port,
            timeout=self.timeout,
            key=wire.job_key(resolved_secret),
            drops=self._drops,
            ipc_dir=None if force_tcp else dist_env.private_dir(
                ipc_dir or env.get(envvars.DIST_IPC_DIR)
            ),
            transport=self.transport,
        )
        self._wiring = wiring
        # The finalizer holds the wiring, never the context, so an unclosed
        # context is still collected (and its sockets closed) like any object.
        self._finalizer = weakref.finalize(self, wiring.close, os.getpid())
        try:
            wiring.connect()
        except BaseException:
            wiring.linger_ms = 0
            self._finalizer()
            raise
        self._live = wiring

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close the sockets. Idempotent; also done at exit and on GC."""
        if self._closed:
            return
        self._closed = True
        self._live = None
        if self._wiring is not None:
            if self._failure is not None:
                self._wiring.linger_ms = 0
            self._finalizer()

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    @property
    def dropped_frames(self) -> int:
        """Frames dropped because they failed authentication or were malformed,
        replayed or out of order. None of them was deserialized."""
        return self._drops.count

    def _run(self, fn: Callable[[Wiring, Any, int], Any], stuff: Any, kind: int) -> Any:
        """Run one collective; a failure makes the context fail for good and
        is reported to the hubs, so one failure fails the job everywhere."""
        wiring = self._live
        if wiring is None:
            if self._closed:
                raise DistributedError("DistributedContext is closed")
            if self._failure is not None:
                raise self._failure
            raise RuntimeError("no links")  # pragma: no cover - size 1 never gets here
        try:
            return fn(wiring, stuff, kind)
        except BaseException as e:
            failure = wiring.failed(e)
            if failure is not None:
                self._failure, self._live = failure, None
            raise

    # ------------------------------------------------------------- getters
    def get_rank(self) -> int:
        """This worker's rank in the job (unique across the job)."""
        return self.rank

    def get_local_rank(self) -> int:
        """This worker's rank on its node."""
        return self.local_rank

    def get_size(self) -> int:
        """Number of workers in the job."""
        return self.size

    def get_local_size(self) -> int:
        """Number of workers on this node."""
        return self.local_size

    def get_cross_rank(self) -> int:
        """Index of this node in the job."""
        return self.cross_rank

    def get_cross_size(self) -> int:
        """Number of nodes in the job."""
        return self.cross_size

    def get_num_agents(self) -> int:
        """Number of nodes (Determined's name for ``get_cross_size``)."""
        return self.cross_size

    # ---------------------------------------------------------- collectives
    def allgather(self, stuff: Any) -> list[Any]:
        """Every rank gets the list of every rank's ``stuff``, ordered by rank."""
        if self.size < 2:
            return [stuff]
        # _run, inlined: with more ranks than cores a call costs about 1 % of
        # an allgather (ops.allgather_global says why).
        wiring = self._live
        if wiring is None:
            return self._run(ops.allgather_global, stuff, wire.AG)  # it raises why
        try:
            return ops.allgather_global(wiring, stuff, wire.AG)
        except BaseException as e:
            failure = wiring.failed(e)
            if failure is not None:
                self._failure, self._live = failure, None
            raise

    def gather(self, stuff: Any) -> Optional[list[Any]]:
        """The chief gets the list of every rank's ``stuff`` ordered by rank;
        other ranks get ``None`` once their part is sent."""
        if self.size < 2:
            return [stuff]
        return self._run(ops.run_global, stuff, wire.GA)

    def broadcast(self, stuff: Any) -> Any:
        """Every rank gets the chief's ``stuff``; other ranks' argument is ignored."""
        if self.size < 2:
            return stuff
        return self._run(ops.run_global, stuff, wire.BCAST)

    def allgather_local(self, stuff: Any) -> list[Any]:
        """Like ``allgather`` among the workers of this node, ordered by local rank."""
        if self.local_size < 2:
            return [stuff]
        return self._run(ops.run_local, stuff, wire.AG)

    def gather_local(self, stuff: Any) -> Optional[list[Any]]:
        """Like ``gather`` to this node's local chief (local rank 0)."""
        if self.local_size < 2:
            return [stuff]
        return self._run(ops.run_local, stuff, wire.GA)

    def broadcast_local(self, stuff: Any = None) -> Any:
        """Every worker of this node gets its local chief's ``stuff``."""
        if self.local_size < 2:
            return stuff
        return self._run(ops.run_local, stuff, wire.BCAST)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "failed" if self._failure else "open"
        return (
            f"DistributedContext(rank={self.rank}, size={self.size}, local_rank="
            f"{self.local_rank}, local_size={self.local_size}, cross_rank={self.cross_rank}, "
            f"cross_size={self.cross_size}, {state})"
        )
