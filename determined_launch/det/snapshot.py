"""``det e create CONFIG CONTEXT``'s copy of CONTEXT, as Determined uploads it:
the files under CONTEXT less what ``.detignore`` (gitignore patterns) and
Determined's default list leave out, at most 95 MiB (Determined's limit). The
experiments root and ``det_runs`` inside CONTEXT are left out too (a new
experiment never copies the old ones). Symbolic links are copied as links when
they point inside CONTEXT and skipped otherwise: nothing is followed out of it.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from collections.abc import Sequence

from determined_launch.errors import LaunchError

#: Determined 0.38.1's default .detignore
DEFAULT_IGNORE = ("__pycache__/", "*.py[co]", "*$py.class", "terraform", "terraform_data",
                  "terraform.tfstate*", "terraform.tfvars*", ".terraform*", ".git/", ".vscode/",
                  ".idea/", ".mypy_cache/", "/shared_fs")
MAX_BYTES = 95 * 1024 * 1024


def _translate(glob: str) -> str:
    """A gitignore glob (no slashes at its ends) as a regular expression."""
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("(?:/.*)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            end = glob.index("]", i + 2)
            body = glob[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


class Ignore:
    """gitignore's rules over paths relative to the context (the last match wins)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.rules: list[tuple[re.Pattern[str], bool, bool]] = []  # (regex, negated, dir only)
        for raw in lines:
            line = raw.rstrip("\n").rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            line = line[1:] if negated else line
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/")
            prefix = "^" if anchored else "^(?:.*/)?"
            self.rules.append((re.compile(prefix + _translate(line) + "$"), negated, dir_only))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        result = False
        for regex, negated, dir_only in self.rules:
            if (is_dir or not dir_only) and regex.match(rel):
                result = not negated
        return result


def snapshot(src: pathlib.Path, dst: pathlib.Path, skip: Sequence[pathlib.Path] = (),
             limit: int = MAX_BYTES) -> tuple[int, int]:
    """Copy CONTEXT ``src`` into ``dst`` (new); (files copied, bytes). Over ``limit``:
    ``LaunchError`` (exit 2) naming the limit, and nothing is left in ``dst``."""
    src = src.absolute()
    if not src.is_dir():
        raise LaunchError(f"context path '{src}' must be a directory")
    lines = list(DEFAULT_IGNORE)
    try:
        with open(src / ".detignore", encoding="utf-8") as f:
            lines += f.read(1 << 20).splitlines()
    except OSError:
        pass
    rules = Ignore(lines)
    skipped = {os.path.abspath(p) for p in skip}
    files = size = 0
    dst.mkdir(parents=True, exist_ok=False)
    try:
        for parent, dirs, names in os.walk(src):
            rel_parent = os.path.relpath(parent, src)
            rel_parent = "" if rel_parent == "." else rel_parent + "/"
            keep = []
            for d in sorted(dirs):
                path = os.path.join(parent, d)
                if os.path.islink(path):
                    names.append(d)  # copied as a link (or skipped), never entered
                elif not (rules.ignored(rel_parent + d, True) or path in skipped):
                    keep.append(d)
                    os.makedirs(os.path.join(dst, rel_parent, d), exist_ok=True)
            dirs[:] = keep
            for name in sorted(names):
                rel = rel_parent + name
                path = os.path.join(parent, name)
                if name == ".detignore" or rules.ignored(rel, False) or path in skipped:
                    continue
                target = os.path.join(dst, rel)
                if os.path.islink(path):
                    link = os.readlink(path)
                    real = os.path.realpath(path)
                    if real == str(src) or real.startswith(str(src) + os.sep):
                        os.symlink(link, target)
                    continue
                if not os.path.isfile(path):
                    continue  # sockets, fifos
                size += os.path.getsize(path)
                if size > limit:
                    raise LaunchError(
                        f"context {src}: the files to copy exceed the maximum allowed size "
                        f"{limit // (1 << 20)} MiB; leave some out with a .detignore file")
                shutil.copy2(path, target, follow_symlinks=False)
                files += 1
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    return files, size
