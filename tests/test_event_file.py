"""core/event_file.py: TensorBoard's event-file format with the standard library,
checked byte for byte against TensorBoard's own protocol buffers and record
writer, and read back by TensorBoard's reader."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from determined_launch.core import event_file as ef


def test_crc32c_check_value() -> None:
    assert ef.crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value
    assert ef.crc32c(b"") == 0


def test_events_and_records_are_tensorboards_bytes() -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    value = summary_pb2.Summary.Value
    cases = [
        (event_pb2.Event(wall_time=1.5, file_version="brain.Event:2"),
         ef.event(1.5, file_version="brain.Event:2")),
        (event_pb2.Event(wall_time=12.25, step=7, summary=summary_pb2.Summary(
            value=[value(tag="training/loss", simple_value=0.125)])),
         ef.event(12.25, step=7, scalars=(("training/loss", 0.125),))),
        (event_pb2.Event(wall_time=3.0, step=2**40, summary=summary_pb2.Summary(
            value=[value(tag="a", simple_value=-1e30), value(tag="é/b", simple_value=2.0)])),
         ef.event(3.0, step=2**40, scalars=(("a", -1e30), ("é/b", 2.0)))),
        (event_pb2.Event(wall_time=0.0, step=-5), ef.event(0.0, step=-5)),
    ]
    for theirs, ours in cases:
        assert theirs.SerializeToString() == ours
        buf = io.BytesIO()
        RecordWriter(buf).write(ours)
        assert buf.getvalue() == ef.record(ours)


def test_tensorboard_reads_the_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = ef.EventFileWriter(str(tmp_path))
    writer.add_scalar("training/loss", 0.5, 1)
    writer.add_scalar("training/loss", 0.25, 2)
    writer.add_scalar("validation/acc", 0.75, 2)
    writer.close()
    with pytest.raises(ValueError, match="the event file is closed"):
        writer.add_scalar("x", 1.0, 3)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    got = {(tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    assert got == {("training/loss", 1, 0.5), ("training/loss", 2, 0.25),
                   ("validation/acc", 2, 0.75)}
    assert Path(writer.path).name.startswith("events.out.tfevents.")
