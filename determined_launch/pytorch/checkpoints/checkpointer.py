"""``Checkpointer``: save and restore the loop's state (spec 3.10, format section 4).

Saving goes through ``core_context.checkpoint.store_path`` (atomic commit),
or with ``asynchronous`` through ``save_async``: the state is copied to CPU
memory (``snapshot.cpu_copy``) and written, uploaded and committed on a
thread while training goes on. The files are Determined's, written by
``checkpoints.files``. The trial's
counters (``_TrialState``) belong to the loop: ``save`` takes them, ``load``
returns them.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any, Optional

import torch

from determined_launch._user import package_version
from determined_launch.core._async_save import CheckpointSaveError
from determined_launch.core._rundir import read_jsonl
from determined_launch.pytorch.api.trial import _state_from_dict, _TrialState
from determined_launch.pytorch.checkpoints import files as cio
from determined_launch.pytorch.checkpoints.snapshot import cpu_copy
from determined_launch.pytorch.data.batch_sizes import resize_check

logger = logging.getLogger("determined_launch.pytorch")


class Checkpointer:
    """Writes and reads checkpoints of ``trial`` (its context's wrapped objects
    and callbacks' states) for trial ``trial_id``."""

    def __init__(
        self, trial: Any, context: Any, core_context: Any, callbacks: dict[str, Any],
        trial_id: int,
    ) -> None:
        self.trial = trial
        self.context = context
        self.core_context = core_context
        self.callbacks = callbacks
        self.trial_id = trial_id
        self.is_chief = context.distributed.rank == 0
        #: storage id of the newest checkpoint this checkpointer saved
        self.latest_storage_id: Optional[str] = None
        #: fit(async_checkpoints=True): saves run in the background
        self.asynchronous = False
        self._in_flight: Optional[str] = None  # every rank: the async save not yet collected
        #: the chief's last CPU copy, overwritten by the next (its save has finished by then)
        self._snapshot: Any = None

    # ------------------------------------------------------------ where
    @contextlib.contextmanager
    def restore_path(self, checkpoint: str) -> Iterator[pathlib.Path]:
        """A checkpoint directory (FIX-10) or a storage id in our storage."""
        if os.path.isdir(checkpoint):
            yield pathlib.Path(checkpoint)
            return
        with self.core_context.checkpoint.restore_path(checkpoint) as path:
            yield pathlib.Path(path)

    def _is_trusted(self, path: pathlib.Path) -> bool:
        """Our own storage: a full unpickle may be used as a fallback (FIX-3)."""
        storage = getattr(self.core_context.checkpoint, "storage_dir", None)
        if storage is None:
            return False
        try:
            path.resolve().relative_to(pathlib.Path(storage).resolve())
        except ValueError:
            return False
        return True

    def resume_offset(self, latest_checkpoint: Optional[str], steps_completed: int) -> int:
        """FIX-1: the batch index to resume from, read before anything is built,
        because callbacks, the data loader skip and period arithmetic need it.
        0 for a fresh start or a checkpoint of another trial (warm start)."""
        if latest_checkpoint is None:
            return steps_completed
        with self.restore_path(latest_checkpoint) as path:
            saved = cio.read_trial_state(path)
            metadata = cio.read_metadata(path)
        if saved is None:
            return 0
        saved_id = saved.get("trial_id")
        if saved_id is not None and int(saved_id) != self.trial_id:
            return 0
        self._check_world(metadata)
        return int(saved.get("batches_trained") or 0)

    def _check_world(self, metadata: dict[str, Any]) -> None:
        """Issue 27: a resume on another world size keeps the global batch (or
        stops here, naming both numbers). The data stream needs nothing more: it
        is sharded from the same global order and skips global batches."""
        saved_slots = metadata.get("world_size")
        saved_global = metadata.get("global_batch_size")
        line = resize_check(
            saved_slots if isinstance(saved_slots, int) else None,
            saved_global if isinstance(saved_global, int) else None,
            self.context.distributed.size,
            _hparam_global_batch(self.context),
        )
        if line is not None:
            self.context._resized_from = saved_slots
            if self.is_chief:
                logger.info("%s", line)

    # ------------------------------------------------------------ save
    def save(self, state: _TrialState, already_exiting: bool) -> str:
        """Checkpoint at ``state.batches_trained`` (all ranks call it; the chief
        writes); returns the storage id, on every rank. Asynchronous: first
        waits for the previous background save (its failure raises here, on
        every rank), then returns once the state is copied."""
        state.last_ckpt = state.batches_trained
        dist = self.context.distributed
        if self.asynchronous:
            self.finish()
        uuid = ""
        if self.is_chief:
            metadata = self._metadata(state)
            if self.asynchronous:
                ckpt = self._snapshot = cpu_copy(self._state(), reuse=self._snapshot)
                trial_state = copy.deepcopy(vars(state))
                # collected by finish(): the next save, or the end of fit()
                uuid = self.core_context.checkpoint.save_async(
                    lambda path: self._write(path, ckpt, trial_state), metadata).storage_id
            else:
                with self.core_context.checkpoint.store_path(metadata) as (path, storage_id):
                    self._write(pathlib.Path(path), self._state(), vars(state))
                    uuid = storage_id
        if dist.size > 1:
            uuid = dist.broadcast(uuid)
        self.latest_storage_id = uuid
        if self.asynchronous:
            self._in_flight = uuid
        else:
            self._uploaded(uuid)
        if already_exiting:
            logger.info("saved checkpoint %s at batch %d before exiting%s", uuid,
                        state.batches_trained, " (in the background)" if self.asynchronous else "")
        return uuid

    def finish(self, *, quiet: bool = False) -> None:
        """Every rank: wait for the background save in flight (the chief joins
        it); its failure raises ``CheckpointSaveError`` on every rank.
        ``quiet`` (an error is already on its way out): the chief only waits and
        logs a failure, with no collective."""
        failure: Optional[str] = None
        if self.is_chief:
            try:
                self.core_context.checkpoint.wait()
            except CheckpointSaveError as e:
                if quiet:
                    logger.error("%s", e)
                failure = str(e)
        if quiet:
            return
        if self.context.distributed.size > 1:
            failure = self.context.distributed.broadcast(failure)
        uuid, self._in_flight = self._in_flight, None
        if failure is not None:
            raise CheckpointSaveError(failure)
        if uuid:
            self._uploaded(uuid)

    def _uploaded(self, uuid: str) -> None:
        for callback in self.callbacks.values():
            callback.on_checkpoint_upload_end(uuid=uuid)

    def _metadata(self, state: _TrialState) -> dict[str, Any]:
        dist = self.context.distributed
        metadata = {
            "determined_version": package_version(),
            "steps_completed": state.batches_trained,
            "framework": f"torch-{torch.__version__}",
            "format": "pickle",
            "trial_id": self.trial_id,
            "trial_seed": self.context._trial_seed,
            # issue 27: a resume on another world size compares against these
            "world_size": dist.size,
        }
        if self.context._global_batch_size is not None:
            metadata["global_batch_size"] = self.context._global_batch_size
        return metadata

    def _state(self) -> dict[str, Any]:
        """The state dicts to save (live tensors; ``cpu_copy`` them to keep them)."""
        ctx = self.context
        optim = ctx._optim
        ckpt: dict[str, Any] = {
            "models_state_dict": [cio.model_state_for_save(m) for m in ctx.models],
            "optimizers_state_dict": [o.state_dict() for o in ctx.optimizers],
            "lr_schedulers_state_dict": [s.state_dict() for s in ctx.lr_schedulers],
            "callbacks": {name: cb.state_dict() for name, cb in self.callbacks.items()},
            "rng_state": cio.rng_state(getattr(ctx.distributed, "local_rank", 0)),
        }
        if optim._scaler is not None:
            ckpt["scaler_state_dict"] = optim._scaler.state_dict()
        if optim._use_apex:
            import apex

            ckpt["amp_state"] = apex.amp.state_dict()
        for callback in self.callbacks.values():
            callback.on_checkpoint_save_start(ckpt)
        return ckpt

    def _write(self, path: pathlib.Path, ckpt: dict[str, Any], trial_state: dict[str, Any]
               ) -> None:
        """The files (on the save's thread when asynchronous, callbacks' write
        hooks included)."""
        ctx = self.context
        storage = getattr(self.core_context.checkpoint, "storage_dir", None)
        run_dir = getattr(self.core_context, "run_dir", None)
        exclude = [p for p in (storage, run_dir) if p is not None]
        cio.copy_code(os.getcwd(), path / "code", exclude=exclude)
        cio.save_state(ckpt, path)
        cio.write_trial_state(path, trial_state)
        cio.write_load_data(
            path, type(self.trial), ctx._hparams, ctx._exp_conf,
            is_trainer=not ctx._optim._is_pre_trainer,
        )
        for callback in self.callbacks.values():
            callback.on_checkpoint_end(str(path))
        for callback in self.callbacks.values():
            callback.on_checkpoint_write_end(str(path))

    # ------------------------------------------------------------ restore
    def load(self, load_path: pathlib.Path) -> _TrialState:
        """Restore everything from ``load_path``; returns the trial's counters
        (fresh ones for another trial's checkpoint: a warm start)."""
        ctx = self.context
        optim = ctx._optim
        load_path = pathlib.Path(load_path)
        ckpt = cio.load_state(load_path, trusted=self._is_trusted(load_path))
        for callback in self.callbacks.values():
            callback.on_checkpoint_load_start(ckpt)
        self._load_models(ckpt)
        self._load_list(ckpt, "optimizers_state_dict", "optimizer_state_dict", ctx.optimizers)
        self._load_list(ckpt, "lr_schedulers_state_dict", "lr_scheduler", ctx.lr_schedulers)
        if "scaler_state_dict" in ckpt:
            if optim._scaler is not None:
                optim._scaler.load_state_dict(ckpt["scaler_state_dict"])
            else:
                logger.warning("the checkpoint has a GradScaler state but no scaler was wrapped; "
                               "ignoring it")
        elif optim._scaler is not None:
            logger.warning("a GradScaler was wrapped but the checkpoint has no scaler state")
        if "amp_state" in ckpt and optim._use_apex:
            import apex

            apex.amp.load_state_dict(ckpt["amp_state"])
        cio.restore_rng_state(ckpt.get("rng_state"), getattr(ctx.distributed, "local_rank", 0))
        saved_callbacks = ckpt.get("callbacks") or {}
        for name, callback in self.callbacks.items():
            if name in saved_callbacks:
                callback.load_state_dict(saved_callbacks[name])
            elif type(callback).load_state_dict is not _base_load_state_dict():
                logger.warning(
                    "callback %r has load_state_dict() but the checkpoint has no state for it",
                    name,
                )
        saved = cio.read_trial_state(load_path, epoch_len=ctx._epoch_len)
        saved_id = saved.get("trial_id") if saved else None
        if saved and (saved_id is None or int(saved_id) == self.trial_id):
            state = _state_from_dict(saved, self.trial_id)
            state.trial_id = self.trial_id
        else:
            # Another trial's checkpoint: warm start (weights only), counters from zero.
            state = _state_from_dict(None, self.trial_id)
        if state.batches_trained and state.batches_trained == self._last_validation():
            state.last_val = state.batches_trained
        return state

    def _load_models(self, ckpt: dict[str, Any]) -> None:
        models = self.context.models
        if "model_state_dict" in ckpt:
            if "models_state_dict" in ckpt:
                raise RuntimeError(
                    "Both model_state_dict and models_state_dict in checkpoint."
                )
            if len(models) > 1:
                raise RuntimeError(
                    "Old-format checkpoint cannot be loaded into a context with more than one "
                    "model."
                )
            cio.load_model_state(models[0], ckpt["model_state_dict"])
            return
        states = ckpt.get("models_state_dict") or []
        if len(states) != len(models):
            raise RuntimeError(
                f"the checkpoint holds {len(states)} model(s) but the trial wrapped "
                f"{len(models)}; it comes from a different trial class"
            )
        for model, state in zip(models, states):
            cio.load_model_state(model, state)

    @staticmethod
    def _load_list(ckpt: dict[str, Any], key: str, legacy: str, targets: list[Any]) -> None:
        if key in ckpt:
            states = ckpt[key]
        elif legacy in ckpt:
            states = [ckpt[legacy]]
        else:
            return
        if len(states) != len(targets):
            raise RuntimeError(
                f"the checkpoint holds {len(states)} entries under {key!r} but the trial "
                f"wrapped {len(targets)}; it comes from a different trial"
            )
        for target, state in zip(targets, states):
            target.load_state_dict(state)

    def _last_validation(self) -> Optional[int]:
        """``steps_completed`` of this trial's last validation (the master's
        answer where there is one, else this run directory's)."""
        ask = getattr(self.core_context.train, "_get_last_validation", None)
        if ask is not None:
            last = ask()
            return None if last is None else int(last)
        run_dir = getattr(self.core_context, "run_dir", None)
        if run_dir is None:
            return None
        try:
            records = read_jsonl(f"{run_dir}/validation.jsonl")
        except FileNotFoundError:
            return None
        # the local trial (0) was written as null by earlier versions
        ids = (0, None) if self.trial_id == 0 else (self.trial_id,)
        steps = [r.get("steps_completed") for r in records if r.get("trial_id") in ids]
        return int(steps[-1]) if steps and steps[-1] is not None else None


def _hparam_global_batch(context: Any) -> Optional[int]:
    """The ``global_batch_size`` hparam, if it is an int (``init`` validated it)."""
    value = (context._hparams or {}).get("global_batch_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _base_load_state_dict() -> Any:
    from determined_launch.pytorch.api.callback import PyTorchCallback

    return PyTorchCallback.load_state_dict
