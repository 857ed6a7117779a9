"""``DistributedContext.from_*``: the rank layout from whatever started the process.

A mixin so the public class keeps its constructors under their usual names
while ``context`` holds only the API and its state. Reading the variables
is ``env``'s job (pure functions of a mapping); this only builds contexts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Optional, TypeVar, cast

from determined_launch.core.distributed import env as dist_env
from determined_launch.core.distributed.errors import DistributedConfigError

#: the class the constructors build: ``DistributedContext`` (context.py), which inherits them
#: (a type variable, so this module never names the class that imports it)
_C = TypeVar("_C", bound="Factories")


def _make(cls: type[_C], **kwargs: Any) -> _C:
    """``cls(**kwargs)``: the mixin itself has no constructor to type-check."""
    return cast(_C, cast(Any, cls)(**kwargs))


class Factories:
    """Class methods that build a context from a launcher's variables."""

    @classmethod
    def from_env(
        cls: type[_C],
        chief_ip: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        **kwargs: Any,
    ) -> _C:
        """Detect the rank layout from the launcher's variables: torchrun,
        DeepSpeed, Horovod, OpenMPI, PMI (MPICH/Intel MPI) or SLURM, in that
        order. No launcher variables: a size-1 context."""
        env = os.environ if env is None else env
        layout = dist_env.detect(env)
        if layout is None:
            one = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1}
            return _make(cls, **one, cross_rank=0, cross_size=1, **kwargs)
        if chief_ip is None:
            dist_env.check_chief_resolves(layout, env)
        return cls._from_layout(layout, chief_ip, env, kwargs)

    @classmethod
    def from_torch_distributed(
        cls: type[_C], chief_ip: Optional[str] = None, **kwargs: Any
    ) -> _C:
        """From torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``). The chief
        address is ``chief_ip``, ``DET_CHIEF_IP`` or ``MASTER_ADDR``."""
        return cls._from_reader(
            dist_env.read_torchrun,
            "from_torch_distributed: RANK and LOCAL_WORLD_SIZE are not set; run under "
            "torchrun (or det-launch torch)",
            chief_ip,
            kwargs,
        )

    @classmethod
    def from_deepspeed(cls: type[_C], chief_ip: Optional[str] = None, **kwargs: Any) -> _C:
        """From the DeepSpeed launcher's variables (``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, ``LOCAL_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``), or
        torchrun's when DeepSpeed was started by torchrun."""
        return cls._from_reader(
            lambda env: dist_env.read_deepspeed(env) or dist_env.read_torchrun(env),
            "from_deepspeed: RANK and CROSS_RANK (or LOCAL_WORLD_SIZE) are not set; run "
            "under the deepspeed launcher",
            chief_ip,
            kwargs,
        )

    @classmethod
    def _from_reader(
        cls: type[_C],
        read: Callable[[Mapping[str, str]], Optional[dist_env.Layout]],
        missing: str,
        chief_ip: Optional[str],
        kwargs: dict[str, Any],
    ) -> _C:
        """A launcher's ``from_*``: its variables (``env=`` or the process's),
        read by ``read``; ``missing`` is the error when they are absent."""
        env = kwargs.pop("env", None)
        env = os.environ if env is None else env
        layout = read(env)
        if layout is None:
            raise DistributedConfigError(missing)
        return cls._from_layout(layout, chief_ip, env, kwargs)

    @classmethod
    def from_horovod(
        cls: type[_C], hvd: Any, chief_ip: Optional[str] = None, **kwargs: Any
    ) -> _C:
        """From an initialized Horovod module (``import horovod.torch as hvd;
        hvd.init()``)."""
        return _make(
            cls,
            rank=hvd.rank(),
            size=hvd.size(),
            local_rank=hvd.local_rank(),
            local_size=hvd.local_size(),
            cross_rank=hvd.cross_rank(),
            cross_size=hvd.cross_size(),
            chief_ip=chief_ip,
            **kwargs,
        )

    @classmethod
    def from_tf_config(
        cls: type[_C], env: Optional[Mapping[str, str]] = None, **kwargs: Any
    ) -> tuple[_C, Any]:
        """A context and a ``tf.distribute.Strategy`` from ``TF_CONFIG``, as
        Determined's: several workers give one rank per worker (chief: the
        first worker's host) and ``MultiWorkerMirroredStrategy``; one worker
        or no ``TF_CONFIG`` give a size-1 context and ``MirroredStrategy``
        with several GPUs, else TensorFlow's default strategy. Keyword
        arguments (``port=``, ``secret=``, ...) go to the constructor; a
        multi-worker context needs a secret like any multi-node one."""
        env = os.environ if env is None else env
        layout = dist_env.read_tf_config(env)  # a bad TF_CONFIG fails before any import
        tf = _tensorflow()
        if layout is not None:
            dist = cls._from_layout(layout, None, env, kwargs)
            return dist, tf.distribute.MultiWorkerMirroredStrategy()
        one = {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1}
        dist = _make(cls, **one, cross_rank=0, cross_size=1, env=env, **kwargs)
        gpus = len(tf.config.list_physical_devices("GPU"))
        return dist, tf.distribute.MirroredStrategy() if gpus > 1 else tf.distribute.get_strategy()

    @classmethod
    def _from_layout(
        cls: type[_C],
        layout: dist_env.Layout,
        chief_ip: Optional[str],
        env: Mapping[str, str],
        kwargs: dict[str, Any],
    ) -> _C:
        return _make(
            cls,
            rank=layout.rank,
            size=layout.size,
            local_rank=layout.local_rank,
            local_size=layout.local_size,
            cross_rank=layout.cross_rank,
            cross_size=layout.cross_size,
            chief_ip=chief_ip or layout.chief_ip,
            env=env,
            **kwargs,
        )


def _tensorflow() -> Any:
    try:
        import tensorflow
    except ImportError:
        raise DistributedConfigError(
            "DistributedContext.from_tf_config() needs TensorFlow, which is not installed "
            "here: pip install tensorflow"
        ) from None
    return tensorflow
