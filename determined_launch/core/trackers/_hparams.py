"""TensorBoard's HParams summary: the trial's hyperparameters beside its scalars.

``--report-to tensorboard`` writes one ``session_start_info`` summary into
the run's TensorBoard directory (where its scalars already go), so the
HParams tab of ``tensorboard --logdir <experiment>/trials`` lists every trial
with its hyperparameters against its metrics. The ``tensorboard`` package's
own writer and protocol buffers: no TensorFlow, no torch.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Mapping
from typing import Any

from determined_launch.core.trackers import RunIdentity, flatten


def write_session_start(directory: pathlib.Path, who: RunIdentity) -> None:
    from google.protobuf import struct_pb2
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def value(v: Any) -> struct_pb2.Value:
        if isinstance(v, bool):
            return struct_pb2.Value(bool_value=v)
        if isinstance(v, (int, float)):
            return struct_pb2.Value(number_value=float(v))
        return struct_pb2.Value(string_value=str(v))

    hparams: Mapping[str, Any] = flatten(who.hparams)
    info = plugin_data_pb2.SessionStartInfo(
        hparams={k: value(v) for k, v in hparams.items()},
        group_name=who.experiment or "", start_time_secs=time.time())
    content = plugin_data_pb2.HParamsPluginData(session_start_info=info, version=0)
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=metadata.SESSION_START_INFO_TAG,
        metadata=metadata.create_summary_metadata(content))])
    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory), filename_suffix=".hparams")
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))
    writer.close()
