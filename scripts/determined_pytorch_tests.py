#!/usr/bin/env python3
"""Run Determined's own PyTorch API unit tests against determined_launch.

    python scripts/determined_pytorch_tests.py CHECKOUT [--ref v0.38.1] [--secret]
                                               [--keep DIR] [-- PYTEST ARGS...]

CHECKOUT is a checkout of github.com/determined-ai/determined (a directory with
``harness/tests``) or its git directory (then ``git archive REF`` reads the tests
at ``--ref``, default v0.38.1). The tests and the helpers they import are copied
into a temporary directory (never into this repository), only their imports are
changed (``determined`` -> ``determined_launch``), and pytest runs them there with
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (Determined's own files need it). With
``--secret`` a random ``DET_DIST_SECRET`` is set: the multi-node reducer tests
need one here. The exit status is pytest's (2 for a bad argument).
docs/pytorch.md records the count.
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile

#: what the PyTorch tests import from harness/tests (relative to it)
PATHS = (
    "__init__.py",
    "conftest.py",
    "experiment/__init__.py",
    "experiment/utils.py",
    "experiment/pytorch_utils.py",
    "experiment/fixtures",
    "experiment/pytorch",
    "launch/__init__.py",
    "launch/test_util.py",
)

_RULES = (
    # `import determined.errors` binds the name `determined`, which the tests then use.
    (re.compile(r"^(\s*)import determined\.([\w.]+)\s*$"),
     r"\1import determined_launch.\2; import determined_launch as determined"),
    (re.compile(r"^(\s*)import determined\.([\w.]+) as (\w+)"),
     r"\1import determined_launch.\2 as \3"),
    (re.compile(r"^(\s*)import determined as (\w+)"), r"\1import determined_launch as \2"),
    (re.compile(r"^(\s*)import determined\s*$"), r"\1import determined_launch as determined"),
    (re.compile(r"^(\s*)from determined(\.[\w.]+)? import"), r"\1from determined_launch\2 import"),
)


def rewrite_imports(text: str) -> str:
    """Only import lines change; every other line is left as it is."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        for pattern, repl in _RULES:
            new = pattern.sub(repl, body, count=1)
            if new != body:
                line = new + line[len(body):]
                break
        out.append(line)
    return "".join(out)


def _copy_from_checkout(checkout: pathlib.Path, dest: pathlib.Path) -> None:
    src = checkout / "harness" / "tests"
    for rel in PATHS:
        s, d = src / rel, dest / rel
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, symlinks=True)
        else:
            shutil.copy2(s, d)


def _copy_from_git(git_dir: pathlib.Path, ref: str, dest: pathlib.Path) -> None:
    paths = [f"harness/tests/{rel}" for rel in PATHS]
    data = subprocess.run(["git", "--git-dir", str(git_dir), "archive", ref, *paths],
                          check=True, stdout=subprocess.PIPE).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest.parent / "archive", filter="data")
    shutil.move(str(dest.parent / "archive" / "harness" / "tests"), str(dest))


def prepare(checkout: pathlib.Path, ref: str, root: pathlib.Path) -> pathlib.Path:
    """The rewritten tests under ``root/tests``."""
    dest = root / "tests"
    if (checkout / "harness" / "tests").is_dir():
        _copy_from_checkout(checkout, dest)
    elif (checkout / "HEAD").is_file() or (checkout / ".git").exists():
        _copy_from_git(checkout / ".git" if (checkout / ".git").exists() else checkout, ref, dest)
    else:
        raise ValueError(f"{checkout}: neither a determined checkout (harness/tests) "
                         "nor a git directory")
    for path in dest.rglob("*.py"):
        if path.is_symlink():  # links to examples/ outside harness/: left as they are
            continue
        path.write_text(rewrite_imports(path.read_text()))
    return dest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=pathlib.Path)
    parser.add_argument("--ref", default="v0.38.1", help="tag read from a git directory")
    parser.add_argument("--secret", action="store_true", help="set a random DET_DIST_SECRET")
    parser.add_argument("--keep", type=pathlib.Path, help="prepare here and keep it")
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    pytest_args = argv[cut + 1:]
    with tempfile.TemporaryDirectory(prefix="det-pytorch-tests-") as tmp:
        root = args.keep or pathlib.Path(tmp)
        if args.keep and (root / "tests").exists():
            parser.error(f"--keep {root}: {root / 'tests'} exists already")
        root.mkdir(parents=True, exist_ok=True)
        try:
            tests = prepare(args.checkout.resolve(), args.ref, root)
        except ValueError as e:
            parser.error(str(e))
        except subprocess.CalledProcessError:
            parser.error(f"{args.checkout}: git archive {args.ref} failed (see above)")
        env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
        env.pop("DET_DIST_SECRET", None)
        if args.secret:
            env["DET_DIST_SECRET"] = secrets.token_hex(16)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               str(tests / "experiment" / "pytorch"), *pytest_args]
        return subprocess.run(cmd, cwd=root, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
