"""det-launch ui: JSON-lines streams parsed a batch of lines per ``json.loads``
read exactly as one ``json.loads`` per line (the code before batching) reads them."""

from __future__ import annotations

import json
import pathlib
import random
from typing import Any

import pytest

from determined_launch.ui import files


def per_line(data: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The reference: every whole line through ``json.loads`` alone, bad ones skipped."""
    table = files.Table()
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            table.add(record)
    return list(table.rows()), table.records


def streamed(streams: files.Streams, path: pathlib.Path) -> tuple[list[dict[str, Any]],
                                                                   list[dict[str, Any]]]:
    table = streams.get(str(path), [str(path.parent)])
    return list(table.rows()), table.records


def record(i: int) -> bytes:
    return json.dumps({"steps_completed": i, "metrics": {"loss": 1 / (i + 1), "n": i},
                       "time": 1.7e9 + i}).encode()


#: lines that are not one JSON value, and lines json.loads reads but the batch must not merge
ODD = [b"", b"   ", b"{\"steps_completed\": 3, \"metr", b"not json", b"[1, 2]", b"7",
       b"{\"metrics\": {\"a\": 1}}, {\"metrics\": {\"b\": 2}}", b"\xff\xfe{}",
       b"{\"metrics\": {\"x\": 1}}\r", b"\xef\xbb\xbf{\"metrics\": {\"bom\": 1}}",
       b"{\"storage_id\": \"ck\"}", b"{\"metrics\": {\"s\": \"text\", \"b\": true}}"]


@pytest.mark.parametrize("batch", [2, 3, 8, 256])
def test_batched_lines_read_as_line_by_line(tmp_path: pathlib.Path, batch: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "BATCH", batch, raising=False)
    rng = random.Random(batch)
    lines = [record(i) for i in range(300)]
    for odd in ODD:  # each somewhere in the middle of a batch
        lines.insert(rng.randrange(1, len(lines)), odd)
    lines.insert(150, record(10_000)[:25] + record(10_001))  # a torn line, then a resumed write
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "training.jsonl"
    path.write_bytes(data)
    want = per_line(data)
    assert len(want[0]) == 300 + 3 and want[1] == [{"storage_id": "ck"}]  # the odd ones count
    assert streamed(files.Streams(), path) == want


def test_torn_last_line_waits_and_appended_rows_follow(tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "BATCH", 4, raising=False)
    path = tmp_path / "training.jsonl"
    data = b"\n".join(record(i) for i in range(10)) + b"\n" + record(10)[:30]  # torn last line
    path.write_bytes(data)
    streams = files.Streams()
    first = streamed(streams, path)
    assert first == per_line(data) and len(first[0]) == 10
    more = record(10)[30:] + b"\nbad\n" + b"\n".join(record(i) for i in range(11, 20)) + b"\n"
    with open(path, "ab") as f:
        f.write(more)
    data += more
    assert streamed(streams, path) == per_line(data)
    assert [r["steps_completed"] for r in streamed(streams, path)[0]] == list(range(20))
    assert streams._entries[str(path)].offset == len(data)  # only appended bytes were read


def test_a_clean_stream_is_parsed_a_batch_per_call(tmp_path: pathlib.Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    loads = json.loads

    def counting(text: Any) -> Any:
        calls.append(1)
        return loads(text)

    monkeypatch.setattr(json, "loads", counting)
    path = tmp_path / "training.jsonl"
    monkeypatch.setattr(files, "BATCH", 100, raising=False)
    path.write_bytes(b"\n".join(record(i) for i in range(300)) + b"\n")
    assert len(streamed(files.Streams(), path)[0]) == 300
    assert len(calls) == 3  # not one a line
