"""core/distributed/ stays a house a newcomer can find their way in (issue 11):
the transport never reaches up into the context's modules, and no module or
class grows past the size limits the project set."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "determined_launch" / "core" / "distributed"
#: What transport/ may never import: the layer above it.
ABOVE_TRANSPORT = tuple(
    f"determined_launch.core.distributed.{m}"
    for m in ("context", "factories", "wiring", "ops", "env")
)
MAX_LINES = 410
MAX_METHODS = 20


def imported_modules(path: Path) -> set[str]:
    """Absolute names this module imports, anywhere in it (the package uses
    absolute imports only; a relative one would show up as ``.name``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", sorted((PKG / "transport").glob("*.py")), ids=lambda p: p.name)
def test_transport_never_imports_the_context_layer(path: Path) -> None:
    found = imported_modules(path)
    bad = sorted(imp for imp in found if any(imp.startswith(m) for m in ABOVE_TRANSPORT))
    assert not bad, f"transport/{path.name} imports {bad}"
    assert not any(imp.startswith(".") for imp in found), "use absolute imports"


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(PKG)))
def test_modules_and_classes_stay_small(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_LINES, f"{path.name}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
            assert len(methods) <= MAX_METHODS, f"{node.name} has {len(methods)} methods"


def test_public_names_stay_where_they_were() -> None:
    import determined_launch
    from determined_launch import core
    from determined_launch.core import distributed

    assert determined_launch.DistributedContext is core.DistributedContext
    assert core.DistributedContext is distributed.DistributedContext
    assert core.DistributedError is distributed.DistributedError
    assert issubclass(distributed.DistributedConfigError, distributed.DistributedError)
    assert issubclass(distributed.InsecureWarning, UserWarning)
