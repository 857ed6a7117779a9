"""The launcher checks checkpoint storage before any worker starts (docs/storage.md): a missing
extra, a bad block or a missing bucket is one line and exit status 2, and no worker runs (before,
each rank died with an 18-19 line traceback from core.init). Against moto's real S3 server."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

import yaml

from tests.conftest import base_env


def _launch(tmp_path: pathlib.Path, storage: Any, *, no_s3fs: bool = False
            ) -> tuple[subprocess.CompletedProcess[str], pathlib.Path]:
    block = tmp_path / "storage.yaml"
    block.write_text(yaml.safe_dump(storage))
    marker = tmp_path / "worker-ran"
    argv = ["exec", "--", sys.executable, "-c",
            f"open({str(marker)!r}, 'a').write('x')"]
    # The launcher without s3fs (the workers would have it): only the launcher's check can fail.
    code = (f"import sys\nif {no_s3fs!r}: sys.modules['s3fs'] = None\n"
            f"from determined_launch.cli import main\nsys.exit(main({argv!r}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120,
                       env=base_env(DET_CHECKPOINT_STORAGE=str(block)))
    return r, marker


def _refused(r: subprocess.CompletedProcess[str], marker: pathlib.Path, want: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("det-launch: error: ") and want in lines[0], lines[0]
    assert not marker.exists()  # no worker started


def test_storage_mistakes_are_one_line_before_any_worker(tmp_path: pathlib.Path,
                                                         s3_server: Any) -> None:
    missing = s3_server.block("no-such-bucket-" + tmp_path.name[-8:].lower().replace("_", "-"))
    r, marker = _launch(tmp_path, missing)
    _refused(r, marker, "checkpoint_storage.bucket 'no-such-bucket-")
    assert "does not exist" in r.stderr

    typo = s3_server.block(s3_server.new_bucket())
    typo["buckt"] = typo.pop("bucket")
    r, marker = _launch(tmp_path, typo)
    _refused(r, marker, "checkpoint_storage.buckt: unknown key for type s3 (did you mean "
                        "bucket?)")

    good = s3_server.block(s3_server.new_bucket())
    r, marker = _launch(tmp_path, good, no_s3fs=True)
    _refused(r, marker, "needs s3fs: pip install 'determined_launch[s3]'")

    r, marker = _launch(tmp_path, good)  # the same storage, reachable: the workers run
    assert r.returncode == 0, r.stderr
    assert marker.read_text() == "x"


def test_an_experiments_storage_is_checked_before_its_first_trial(tmp_path: pathlib.Path,
                                                                  s3_server: Any) -> None:
    storage = s3_server.block("no-such-bucket-exp")
    conf = {"searcher": {"name": "single", "metric": "loss"}, "checkpoint_storage": storage,
            "max_restarts": 5}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(conf))
    marker = tmp_path / "trial-ran"
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "experiment", "exp.yaml",
                        "exec", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=base_env())
    _refused(r, marker, "checkpoint_storage.bucket 'no-such-bucket-exp' does not exist")
    assert not (tmp_path / "det_experiments").exists()
