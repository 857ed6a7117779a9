"""A rerun on object storage resumes from the newest *committed* checkpoint,
as ``checkpoint.latest()`` finds it (issue 24, item 4.5), on a real S3 server."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import base_env
from tests.storage_servers import S3Server

yaml = pytest.importorskip("yaml")
pytest.importorskip("s3fs")


def _info(env: dict[str, str], cwd: pathlib.Path) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "info"], cwd=cwd,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout)["cluster_info"])


#: A bare process (no launcher): what core.init() itself resumes from.
BARE = """
from determined_launch import core
with core.init() as ctx:
    print(ctx.info.latest_checkpoint)
"""


def _bare_resume_point(env: dict[str, str], cwd: pathlib.Path) -> str:
    r = subprocess.run([sys.executable, "-c", BARE], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[-1]


SAVE = """
from determined_launch import core
for steps in (185, 186):
    with core.init() as ctx:
        with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, storage_id):
            (path / "w").write_text(str(steps))
        print(storage_id)
"""


def test_a_save_killed_between_its_marker_and_the_pointer_still_resumes_from_it(
        tmp_path: pathlib.Path, s3_server: S3Server) -> None:
    block = tmp_path / "storage.yaml"
    block.write_text(yaml.safe_dump(s3_server.block(s3_server.new_bucket())))
    run = tmp_path / "run"
    env = base_env(DET_CHECKPOINT_STORAGE=str(block), DET_RUN_DIR=str(run))
    saved = subprocess.run([sys.executable, "-c", SAVE], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert saved.returncode == 0, saved.stderr
    older, newer = saved.stdout.split()
    pointer = run / "latest_checkpoint.json"
    record = json.loads(pointer.read_text())
    assert record["storage_id"] == newer and _info(env, tmp_path)["latest_checkpoint"] == newer
    # What a SIGKILL after the commit marker, before the pointer's second write, leaves:
    pointer.write_text(json.dumps({**record, "storage_id": older, "pending": newer}))
    assert _info(env, tmp_path)["latest_checkpoint"] == newer
    assert _bare_resume_point(env, tmp_path) == newer  # core.init() without a launcher too
    # ...and one before the marker: the pending id was never committed.
    pointer.write_text(json.dumps({**record, "storage_id": older, "pending": "not-committed"}))
    assert _info(env, tmp_path)["latest_checkpoint"] == older
