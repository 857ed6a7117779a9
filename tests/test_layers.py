"""Data flows one way (DESIGN.md): nothing lower imports anything higher.

Every import in a module counts, including those inside functions: a lazy
import that runs back up the layers is still a cycle waiting to happen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = "determined_launch"

#: package (or module) -> what it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    f"{PKG}.values": (PKG + ".",),
    f"{PKG}.errors": (PKG + ".",),
    f"{PKG}.envvars": (PKG + ".",),
    # The run directory's one owner: below cluster, core and the launcher, which all ask it.
    f"{PKG}.rundir": (PKG + ".",),
    f"{PKG}.cluster": (f"{PKG}.backends", f"{PKG}.supervisor", f"{PKG}.core", f"{PKG}.pytorch",
                       f"{PKG}.launch", f"{PKG}.cli"),
    f"{PKG}.backends": (f"{PKG}.supervisor", f"{PKG}.core", f"{PKG}.pytorch",
                        f"{PKG}.launch", f"{PKG}.cli"),
    f"{PKG}.supervisor": (f"{PKG}.core", f"{PKG}.pytorch", f"{PKG}.launch", f"{PKG}.cli"),
    f"{PKG}.core": (f"{PKG}.supervisor", f"{PKG}.backends", f"{PKG}.pytorch",
                    f"{PKG}.launch", f"{PKG}.cli"),
    f"{PKG}.pytorch": (f"{PKG}.supervisor", f"{PKG}.backends", f"{PKG}.launch",
                       f"{PKG}.cli"),
    # Helper programs started in front of every worker: light, and below everything.
    f"{PKG}.nodeexec": (f"{PKG}.cluster", f"{PKG}.backends", f"{PKG}.supervisor", f"{PKG}.core",
                        f"{PKG}.pytorch", f"{PKG}.launch", f"{PKG}.cli"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str = "") -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def modules() -> list[Path]:
    return sorted(p for p in (ROOT / PKG).rglob("*.py") if "__pycache__" not in p.parts)


def rules_for(name: str) -> tuple[str, ...]:
    for owner, forbidden in FORBIDDEN.items():
        if name == owner or name.startswith(owner + "."):
            return forbidden
    return ()


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_back_up_the_layers(path: Path) -> None:
    name = module_name(path)
    forbidden = rules_for(name)
    bad = sorted(
        imp for imp in imports_of(path)
        if any(imp == f or imp.startswith(f if f.endswith(".") else f + ".") for f in forbidden)
    )
    assert not bad, f"{name} imports {bad}, which sit above it"


def test_wrap_rank_imports_nothing_of_ours() -> None:
    for path in sorted((ROOT / "wrap_rank").glob("*.py")):
        assert not any(i.startswith(PKG) for i in imports_of(path)), path


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    # The checker itself can fail: a core module importing the supervisor.
    fake = ROOT / PKG / "core" / "_layers_probe.py"
    assert rules_for(module_name(fake))
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..supervisor import node\n")
    found = imports_of(probe, f"{PKG}.core._layers_probe")
    assert "determined_launch.supervisor.node" in found


#: the command lines at the top: det-launch, and det (Determined's CLI over the experiments root)
CLIS = (f"{PKG}.cli", f"{PKG}.det")
DET = f"{PKG}.det."


def test_only_the_cli_imports_the_experiment_layer() -> None:
    # experiment/ is the top layer (it runs launcher jobs); below it nothing may know it.
    # Determined's hyperparameters block (hparams.py) sits at the bottom instead, as a pure
    # leaf, because one off-cluster trial (`det-launch --config`) reads it too.
    top = f"{PKG}.experiment"
    for path in modules():
        name = module_name(path)
        if name == top or name.startswith(top + ".") or name in CLIS or name.startswith(DET):
            continue
        if name.startswith(f"{PKG}.ui."):
            continue  # the UI reads experiments' files and studies (a reader beside the flow)
        bad = sorted(i for i in imports_of(path) if i == top or i.startswith(top + "."))
        assert not bad, f"{name} imports {bad}, which sit above it"
    # exproot.py (the experiments root's one owner: ids, lookup; pytorch's
    # load_checkpoint_trial asks it for a trial's checkpoints) is a leaf beside rundir.py:
    # the standard library and rundir.py only.
    ours = {i for i in imports_of(ROOT / PKG / "exproot.py") if i.startswith(PKG)}
    assert ours <= {f"{PKG}.rundir", f"{PKG}.rundir.read_log"}, ours
    hparams = ROOT / PKG / "hparams.py"
    ours = {i for i in imports_of(hparams) if i.startswith(PKG)}
    assert ours <= {f"{PKG}.errors", f"{PKG}.errors.LaunchError"}, ours
    # The experiment config's one reader sits there too (det-launch --config and the legacy
    # runner check a file as det-launch experiment does): it knows only the leaves.
    leaves = {f"{PKG}.errors", f"{PKG}.errors.LaunchError", f"{PKG}.hparams", f"{PKG}.values"}
    ours = {i for i in imports_of(ROOT / PKG / "expconf.py") if i.startswith(PKG + ".")}
    assert ours <= leaves, ours


def test_only_the_cli_imports_the_ui() -> None:
    # ui/ (det-launch ui) reads what the flow writes; nothing in the flow may depend on it.
    top = f"{PKG}.ui"
    for path in modules():
        name = module_name(path)
        if name == top or name.startswith(top + ".") or name in CLIS or name.startswith(DET):
            continue
        bad = sorted(i for i in imports_of(path) if i == top or i.startswith(top + "."))
        assert not bad, f"{name} imports {bad}, which sit above it"
