"""Test-compat: ``determined.common.util.safe_load_yaml_with_exceptions``,
which Determined's test helpers use to read experiment configs."""

from __future__ import annotations

from typing import IO, Any, Union

from determined_launch import values


def safe_load_yaml_with_exceptions(yaml_file: Union[IO[Any], str]) -> Any:
    """One YAML document from an open file or a string; a syntax error is one
    ``ValueError`` line naming the file, line and column (``values.yaml_document``)."""
    if isinstance(yaml_file, str):
        return values.yaml_document(yaml_file, "<string>")
    text = yaml_file.read()
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return values.yaml_document(text, str(getattr(yaml_file, "name", "<stream>")))
