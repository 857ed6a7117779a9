"""What ``core.init`` builds around checkpoint storage: the backend (probed
once by the chief), the TensorBoard manager, the chief's sync of the run's
records to object storage, and the chief's after-commit step (the run's
checkpoint log and the ``save_*`` retention)."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any, Callable, Optional

from determined_launch.core import _record_sync
from determined_launch.core._dist import Collectives
from determined_launch.core._rundir import RunDir
from determined_launch.core.storage import StorageBackend, StorageSpec, open_storage, retention
from determined_launch.core.tensorboard import STORAGE_DIR, TensorboardManager, TensorboardMode


@dataclasses.dataclass
class StorageSetup:
    backend: StorageBackend
    tensorboard: TensorboardManager
    after_commit: Callable[[str, Mapping[str, Any]], None]


def build_storage(spec: StorageSpec, dist: Collectives, run_dir: RunDir,
                  tensorboard_mode: TensorboardMode) -> StorageSetup:
    backend = open_storage(spec, probe=dist.rank == 0)
    # A trial's directory is its number: named as its records are (<experiment>.trial-<id>),
    # so two experiments' trial 1 in one storage keep separate TensorBoard directories.
    run_name = _record_sync.storage_run_name(run_dir.path)

    def upload(name: str, local: pathlib.Path) -> None:
        backend.put_extra(f"{STORAGE_DIR}/{run_name}/{name}", local)

    tb_path = run_dir.path / ("tensorboard" if dist.rank == 0 else f"tensorboard-rank{dist.rank}")
    tensorboard = TensorboardManager(tb_path, tensorboard_mode, upload=upload, rank=dist.rank,
                                     auto_sync=not spec.is_directory)
    if dist.rank == 0 and not spec.is_directory:
        records_at = f"{_record_sync.STORAGE_DIR}/{run_name}"
        records = _record_sync.RecordSync(
            run_dir.path, lambda name, local: backend.put_extra(f"{records_at}/{name}", local))
        run_dir.on_write = records.poke
        tensorboard.on_close.append(records.close)

    def after_commit(storage_id: str, metadata: Mapping[str, Any]) -> None:
        run_dir.append(retention.LOG_STREAM, {
            **run_dir.identity.fields(), "storage_id": storage_id,
            "steps_completed": metadata.get("steps_completed")})
        policy: Optional[retention.Retention] = spec.retention
        if policy is not None:
            retention.apply(policy, run_dir.path, lambda sid: backend.delete(sid, None),
                            lambda record: run_dir.append(retention.LOG_STREAM, record))

    return StorageSetup(backend, tensorboard, after_commit)
