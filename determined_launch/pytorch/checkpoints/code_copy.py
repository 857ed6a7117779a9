"""The bounded ``code/`` copy inside every checkpoint (FIX-14).

Determined copies the working directory into each checkpoint so that
``load_trial_from_checkpoint_path`` can import the trial class later.
Done naively here it would recurse into the default checkpoint storage
(``./det_runs/checkpoints`` is inside the working directory), so every
checkpoint would contain all earlier ones. The copy therefore leaves out:

* the paths given in ``exclude`` (checkpoint storage, run directory) and the
  destination itself;
* Determined's default ignore list, plus ``runs/`` (TensorBoard's default
  directory), ``./det_runs/`` (the default runs root), ``./det_experiments/``
  (``det-launch experiment``'s default directory) and tool caches, plus
  the patterns of a ``.detignore`` file in the source root (a gitignore
  subset: ``#`` comments, ``!`` negation, ``dir/`` for directories only,
  ``/x`` or ``a/b`` anchored at the root, ``*``/``?``/``[...]`` wildcards);
* the contents of symbolic links: a link is copied as a link, never followed;
* everything, with a warning, when the total exceeds ``DET_CHECKPOINT_CODE_MAX_MB``
  (default 32): a partial copy would look importable and not be.

``DET_CHECKPOINT_CODE=0`` turns the copy off. Unreadable files are skipped
with one warning instead of failing the checkpoint (Determined PR #8683).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
import pathlib
import shutil
from collections.abc import Iterable
from typing import Optional, Union

logger = logging.getLogger("determined_launch.pytorch")

PathLike = Union[str, "os.PathLike[str]"]

#: Determined's DEFAULT_DETIGNORE plus directories that are never model code.
DEFAULT_IGNORE = (
    "__pycache__/",
    "*.py[co]",
    "*$py.class",
    "terraform",
    "terraform_data",
    "terraform.tfstate*",
    "terraform.tfvars*",
    ".terraform*",
    ".git/",
    ".vscode/",
    ".idea/",
    ".mypy_cache/",
    "/shared_fs",
    "runs/",
    "/det_runs/",  # the default root of run directories and checkpoint storage
    "/det_experiments/",  # det-launch experiment's default directory (trials, checkpoints)
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
    ".venv/",
)
DEFAULT_MAX_MB = 32.0
ENV_ENABLE = "DET_CHECKPOINT_CODE"
ENV_MAX_MB = "DET_CHECKPOINT_CODE_MAX_MB"


@dataclasses.dataclass
class CodeCopyStats:
    """What ``copy_code`` did. ``skipped_reason`` is set when nothing was copied."""

    files: int = 0
    bytes: int = 0
    links: int = 0
    unreadable: list[str] = dataclasses.field(default_factory=list)
    skipped_reason: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class _Pattern:
    glob: str
    negate: bool
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return fnmatch.fnmatchcase(rel, self.glob)
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.glob)


def parse_ignore(lines: Iterable[str]) -> list[_Pattern]:
    """Parse ``.detignore``-style lines into patterns (see the module docstring)."""
    out = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        while line.startswith("**/"):
            line = line[3:]
        anchored = "/" in line
        line = line.lstrip("/")
        if line:
            out.append(_Pattern(line, negate, dir_only, anchored))
    return out


def _ignored(patterns: list[_Pattern], rel: str, is_dir: bool) -> bool:
    ignored = False
    for p in patterns:  # the last matching pattern wins, as in gitignore
        if p.matches(rel, is_dir):
            ignored = not p.negate
    return ignored


def _env_max_bytes() -> float:
    raw = os.environ.get(ENV_MAX_MB, "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MAX_MB
    except ValueError:
        logger.warning("%s=%r is not a number; using %s", ENV_MAX_MB, raw, DEFAULT_MAX_MB)
        mb = DEFAULT_MAX_MB
    return mb * 1024 * 1024


def _inside(path: pathlib.Path, roots: list[pathlib.Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _plan(
    src: pathlib.Path, excluded: list[pathlib.Path], patterns: list[_Pattern]
) -> tuple[list[str], list[str], int]:
    """Walk ``src`` without following links: (files, links, total file bytes)."""
    files: list[str] = []
    links: list[str] = []
    total = 0
    for parent, dirnames, filenames in os.walk(src, followlinks=False):
        parent_path = pathlib.Path(parent)
        rel_parent = parent_path.relative_to(src).as_posix()
        keep = []
        for d in sorted(dirnames):
            full = parent_path / d
            rel = d if rel_parent == "." else f"{rel_parent}/{d}"
            if full.is_symlink():
                if not _ignored(patterns, rel, True):
                    links.append(rel)
                continue
            if _inside(full.resolve(), excluded) or _ignored(patterns, rel, True):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            if rel_parent == "." and name == ".detignore":
                continue
            full = parent_path / name
            rel = name if rel_parent == "." else f"{rel_parent}/{name}"
            if _ignored(patterns, rel, False):
                continue
            if full.is_symlink():
                links.append(rel)
                continue
            try:
                total += full.stat().st_size
            except OSError:
                pass
            files.append(rel)
    return files, links, total


def copy_code(
    src: PathLike,
    dst: PathLike,
    exclude: Iterable[PathLike] = (),
    max_bytes: Optional[float] = None,
) -> CodeCopyStats:
    """Copy the code directory ``src`` to ``dst`` (created; must not exist),
    leaving out ``exclude`` and ignored paths. Returns what was copied.

    ``max_bytes`` defaults to ``DET_CHECKPOINT_CODE_MAX_MB`` (MiB, default 32).
    """
    stats = CodeCopyStats()
    if os.environ.get(ENV_ENABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        stats.skipped_reason = f"{ENV_ENABLE}=0"
        return stats
    src_path = pathlib.Path(src).resolve()
    dst_path = pathlib.Path(dst)
    excluded = [pathlib.Path(p).resolve() for p in exclude]
    excluded.append(dst_path.resolve())
    patterns = parse_ignore(DEFAULT_IGNORE)
    detignore = src_path / ".detignore"
    if detignore.is_file():
        try:
            patterns += parse_ignore(detignore.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as e:
            logger.warning("ignoring unreadable %s: %s", detignore, e)

    files, links, total = _plan(src_path, excluded, patterns)
    limit = _env_max_bytes() if max_bytes is None else max_bytes
    if total > limit:
        stats.skipped_reason = (
            f"{src_path} holds {total / 2**20:.1f} MiB of files to copy, over the "
            f"{limit / 2**20:.1f} MiB limit"
        )
        logger.warning(
            "checkpoint code/ copy skipped: %s. List large data in a .detignore file, raise "
            "%s, or set %s=0 to silence this (load_trial_from_checkpoint_path then needs "
            "trial_class=...)",
            stats.skipped_reason,
            ENV_MAX_MB,
            ENV_ENABLE,
        )
        return stats

    dst_path.mkdir(parents=True)
    for rel in files + links:  # only directories that hold something: no empty husks
        (dst_path / rel).parent.mkdir(parents=True, exist_ok=True)
    for rel in files:
        try:
            shutil.copyfile(src_path / rel, dst_path / rel, follow_symlinks=False)
            shutil.copymode(src_path / rel, dst_path / rel, follow_symlinks=False)
        except OSError:
            stats.unreadable.append(rel)
            continue
        stats.files += 1
        stats.bytes += (dst_path / rel).stat().st_size
    for rel in links:
        try:
            os.symlink(os.readlink(src_path / rel), dst_path / rel)
            stats.links += 1
        except OSError:
            stats.unreadable.append(rel)
    if stats.unreadable:
        logger.warning(
            "checkpoint code/ copy left out %d unreadable path(s): %s",
            len(stats.unreadable),
            ", ".join(stats.unreadable[:5]) + (" ..." if len(stats.unreadable) > 5 else ""),
        )
    os.chmod(dst_path, 0o755)
    return stats
