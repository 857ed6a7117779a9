"""The docs say what the code does: regression guards for statements found stale."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _rows(text: str, heading: str) -> list[str]:
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_readme_lists_each_worker_variable_once() -> None:
    rows = _rows((ROOT / "README.md").read_text(), "## Environment variables set for every worker")
    names = [n for row in rows for n in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split(" | ")[0])]
    assert names and len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_no_doc_says_storage_is_a_directory_only() -> None:
    # core/storage has s3://, gs:// and az:// backends (docs/storage.md)
    for doc in DOCS:
        text = " ".join(doc.read_text().split())
        assert "shared directory only" not in text, doc
        assert "-> a shared directory" not in text, doc


def test_no_doc_says_checkpoint_gc_or_search_are_missing() -> None:
    # retention (save_trial_latest, ...), det-launch checkpoints gc, det-launch experiment exist
    for doc in DOCS:
        text = " ".join(doc.read_text().split())
        for sentence in re.findall(r"[^.]*(?:Not available|not available)[^.]*\.", text):
            for feature in ("garbage collection", "hyperparameter search", "web UI"):
                assert feature not in sentence, (doc.name, sentence)
        assert "No web UI" not in text, doc  # det-launch ui
