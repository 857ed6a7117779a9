"""A study in a real PostgreSQL server (Debian's package), started by the test
as a non-root user on a loopback port in a temporary directory."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import base_env, free_port_block
from tests.test_search import EXEC, experiment, trial_dirs, write_config

pytestmark = pytest.mark.slow


def _bindir() -> str:
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return dirs[-1] if dirs else ""


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    bindir = _bindir()
    if not bindir:
        pytest.skip("PostgreSQL is not installed (bash scripts/install_search.sh)")
    pytest.importorskip("psycopg", reason="psycopg is not installed (the [search] extra)")
    top = tempfile.mkdtemp(prefix="det-search-pg-")
    os.chmod(top, 0o755)  # the server's user must reach its data directory
    data, sock, log = f"{top}/data", f"{top}/sock", f"{top}/server.log"
    os.mkdir(sock)
    prefix: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = pwd.getpwnam("nobody")
        os.chown(sock, user.pw_uid, user.pw_gid)
        os.chown(top, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "nobody", "--"]
    port = free_port_block(1)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=60,
                              check=False, cwd=top)

    init = run(f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
               "--no-sync")
    if init.returncode:
        shutil.rmtree(top, ignore_errors=True)
        pytest.skip(f"initdb failed: {init.stderr.strip()[-300:]}")
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = run(f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-l", log, "-w", "-t", "30", "start")
    if start.returncode:
        text = Path(log).read_text() if os.path.exists(log) else ""
        shutil.rmtree(top, ignore_errors=True)
        pytest.skip(f"PostgreSQL did not start: {start.stderr.strip()} {text[-300:]}")
    try:
        # trust authentication: the password is accepted and ignored, so the test can
        # check it is never written anywhere
        yield f"postgresql://postgres:pw-{port}-secret@127.0.0.1:{port}/postgres"
    finally:
        run(f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(top, ignore_errors=True)


def test_a_study_in_postgresql(tmp_path: Path, postgres_url: str) -> None:
    cfg = write_config(tmp_path, {"x": {"type": "double", "minval": 0, "maxval": 1},
                                  "layers": 2, "period": 2, "env_probe": True},
                       {"name": "random", "metric": "loss", "max_trials": 2, "max_length": 4,
                        "max_concurrent_trials": 2}, name="pg")
    r = experiment(cfg, *EXEC, env=base_env(DET_STUDY_STORAGE=postgres_url))
    assert r.returncode == 0, r.stdout + r.stderr
    exp = tmp_path / "exp"
    assert sorted(trial_dirs(exp)) == [1, 2]
    assert not (exp / "study.journal").exists()  # the study is in the server
    assert json.loads((exp / "trials" / "1" / "env_probe.json").read_text()) == {}
    secret = postgres_url.split(":")[2].split("@")[0]
    for f in exp.rglob("*"):
        if f.is_file() and f.suffix != ".png":
            assert secret not in f.read_text(errors="replace"), f
    assert secret not in r.stdout + r.stderr
    status_argv = [sys.executable, "-m", "determined_launch.cli", "experiment", "--status",
                   str(exp)]
    no_url = subprocess.run(status_argv, env=base_env(), capture_output=True, text=True,
                            timeout=30, check=False)
    assert no_url.returncode == 2 and "give its URL with --study-storage" in no_url.stderr
    status = subprocess.run([*status_argv, "--study-storage", postgres_url], env=base_env(),
                            capture_output=True, text=True, timeout=30, check=False)
    assert status.returncode == 0 and "2 completed" in status.stdout, status.stdout + status.stderr
