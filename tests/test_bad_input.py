"""Bad input: exit status 2, one line naming the input and the value, no
traceback, before anything starts (``--dry-run`` checks what a run would)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from determined_launch import values
from determined_launch.launch import config
from tests.conftest import base_env

Files = Callable[[Path], dict[str, str]]


def _info_file(content: bytes) -> Files:
    def make(tmp: Path) -> dict[str, str]:
        path = tmp / "info.json"
        path.write_bytes(content)
        return {"DET_CLUSTER_INFO_FILE": str(path)}

    return make


def _det_info_dir(rendezvous: bytes) -> Files:
    def make(tmp: Path) -> dict[str, str]:
        (tmp / "det-info").mkdir()
        (tmp / "det-info" / "rendezvous.json").write_bytes(rendezvous)
        return {"DET_INFO_DIR": str(tmp / "det-info")}

    return make


def _info(**fields: object) -> Files:
    return _info_file(json.dumps(fields).encode())


def _storage_under_a_file(tmp: Path) -> dict[str, str]:
    (tmp / "a-file").write_text("")
    return {"DET_CHECKPOINT_STORAGE": str(tmp / "a-file" / "ckpts")}


GOOD = {"container_addrs": ["127.0.0.1"], "container_rank": 0, "container_slot_counts": [1]}

#: (id, launcher flags, environment, files, what the one line must say)
CASES: list[tuple[str, list[str], dict[str, str], Optional[Files], str]] = [
    ("info-not-utf8", [], {}, _info_file(b'{"container_addrs": ["\xff\xfe"]}'), "not UTF-8"),
    ("info-deep", [], {}, _info_file(b"[" * 100000), "nested too deeply"),
    ("info-huge-slots", [], {},
     _info(container_addrs=["a", "b"], container_rank=0, container_slot_counts=[10**30, 1]),
     "container_slot_counts[0]': must be <= 4096"),
    ("info-bad-addr", [], {},
     _info(container_addrs=["not an address!!", "x"], container_rank=0,
           container_slot_counts=[1, 1]),
     "container_addrs[0]': \"not an address!!\" is not an IP address or host name"),
    ("info-5000-digits", [], {}, _info_file(
        b'{"container_addrs": ["127.0.0.1"], "container_rank": ' + b"9" * 5000
        + b', "container_slot_counts": [1]}'), "an integer with 5000 digits (999999999999...)"),
    ("rendezvous-5000-digits", [], {}, _det_info_dir(
        b'{"container_addrs": ["127.0.0.1"], "container_rank": 0, '
        b'"container_slot_counts": [' + b"1" * 5000 + b"]}"),
     "rendezvous.json: an integer with 5000 digits"),
    *[(f"info-unresolvable-host-rank-{rank}", [], {},
       _info(container_addrs=["127.0.0.1", "no-such-node.invalid"], container_rank=rank,
             container_slot_counts=[1, 1]),
       "container_addrs: cannot resolve host 'no-such-node.invalid'") for rank in (0, 1)],
    ("info-too-many-nodes", [], {},
     _info(container_addrs=["h"] * 65537, container_rank=0, container_slot_counts=[1] * 65537),
     "65537 nodes; at most 65536"),
    ("slots-huge", ["--slots", "1000000000"], {}, None, "--slots: expected an integer from 1"),
    ("slots-abc", ["--slots", "abc"], {}, None, "--slots: expected an integer from 1 to 4096"),
    ("slots-env", [], {"DET_LAUNCH_SLOTS": "abc"}, None, "DET_LAUNCH_SLOTS: expected an integer"),
    ("kill-after-negative", ["--kill-after", "-1"], {}, None, "--kill-after: expected a finite"),
    ("kill-after-nan", ["--kill-after", "nan"], {}, None, "--kill-after: expected a finite"),
    ("grace-negative", ["--preempt-grace", "-5"], {}, None, "--preempt-grace: expected"),
    ("kill-after-env-nan", [], {"DET_KILL_AFTER": "nan"}, None,
     "environment variable DET_KILL_AFTER: expected a finite number of seconds >= 0, got 'nan'"),
    ("grace-env-inf", [], {"DET_PREEMPT_GRACE": "inf"}, None, "DET_PREEMPT_GRACE: expected"),
    ("connect-timeout-nan", [], {"DET_LAUNCH_CONNECT_TIMEOUT": "nan"}, None,
     "DET_LAUNCH_CONNECT_TIMEOUT: expected a finite number of seconds > 0"),
    ("connect-timeout-zero", ["--connect-timeout", "0"], {}, None, "--connect-timeout"),
    ("dry-run-maybe", [], {"DET_LAUNCH_DRY_RUN": "maybe"}, None,
     "DET_LAUNCH_DRY_RUN: expected one of 1/true/yes/on or 0/false/no/off, got 'maybe'"),
    ("requeue-maybe", [], {"DET_LAUNCH_REQUEUE": "sure"}, None, "DET_LAUNCH_REQUEUE"),
    ("signals-99", [], {"DET_PREEMPT_SIGNALS": "99"}, None, "unknown signal '99'"),
    ("signals-0", ["--preempt-signals", "0"], {}, None, "--preempt-signals: unknown signal '0'"),
    ("signals-kill", ["--preempt-signals", "KILL"], {}, None, "cannot be caught"),
    ("dist-timeout", [], {"DET_DIST_TIMEOUT": "abc"}, None,
     "DET_DIST_TIMEOUT: expected a finite number of seconds > 0, got 'abc'"),
    ("dist-transport", [], {"DET_DIST_TRANSPORT": "foo"}, None,
     "DET_DIST_TRANSPORT: expected one of direct, zmq, got 'foo'"),
    ("c10d-port", [], {"C10D_PORT": "80"}, None, "C10D_PORT: expected a port in 1024-65533"),
    # checked before any worker starts, not at the first save (issue 33 §2.7); as root a
    # file in the path is what makes a directory unwritable
    ("storage-unwritable", [], {}, _storage_under_a_file,
     "ckpts (DET_CHECKPOINT_STORAGE or a checkpoint_storage block): cannot write there: "),
    ("unknown-flag", ["--bogus"], {}, None, "unknown launcher option --bogus"),
    ("no-script", [], {}, None, "no command to run"),
]


def run_cli(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", *args],
        env=env, capture_output=True, text=True, timeout=30,
    )
    return r, time.monotonic() - start


def assert_one_line_error(r: subprocess.CompletedProcess[str], elapsed: float, want: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert want in lines[0], lines[0]
    assert elapsed < 5, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(
    case: tuple[str, list[str], dict[str, str], Optional[Files], str], tmp_path: Path
) -> None:
    _, flags, extra_env, files, want = case
    env = base_env(**extra_env)
    if files is not None:
        env.update(files(tmp_path))
    tail = [] if "no-script" in case[0] else ["--", "python", "-c", "pass"]
    r, elapsed = run_cli([*flags, "--dry-run", "torch", *tail], env)
    assert_one_line_error(r, elapsed, want)


def test_busy_master_port_is_named_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        marker = tmp_path / "ran"
        env = base_env(C10D_PORT=str(port), DET_LAUNCH_SLOTS="1")
        r, elapsed = run_cli(["torch", "--", "python", "-c", f"open({str(marker)!r}, 'w')"], env)
    assert_one_line_error(r, elapsed, f"port {port} (torch's master port) is already in use")
    assert "set C10D_PORT to a free port" in r.stderr
    assert not marker.exists()


def test_python_m_entry_point_checks_the_same_variables() -> None:
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "determined_launch.torch_distributed", "--", "python", "-c", "1"],
        env=base_env(DET_KILL_AFTER="nan"), capture_output=True, text=True, timeout=30,
    )
    assert_one_line_error(r, time.monotonic() - start, "DET_KILL_AFTER: expected a finite")


def test_help_keeps_the_usage() -> None:
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--help"],
                       env=base_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "usage: det-launch" in r.stdout
    assert "DET_KILL_AFTER" in r.stdout  # each flag names its variable


@pytest.mark.parametrize("word,expected", [
    ("1", True), ("true", True), ("YES", True), ("on", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_one_boolean_parser_for_every_boolean_option(word: str, expected: bool) -> None:
    assert values.boolean(word) is expected
    assert config.resolve({"DET_LAUNCH_DRY_RUN": word})["dry_run"] is expected
    assert config.resolve({"DET_LAUNCH_REQUEUE": word})["requeue"] is expected


def test_flag_wins_over_its_variable() -> None:
    resolved = config.resolve({"DET_KILL_AFTER": "7"}, {"kill_after": "2.5"})
    assert resolved["kill_after"] == 2.5
    assert config.resolve({"DET_KILL_AFTER": "7"})["kill_after"] == 7.0
    assert config.resolve({})["kill_after"] == 10.0


def test_every_option_is_declared_once() -> None:
    names = [o.name for o in config.OPTIONS]
    envs = [o.env for o in config.OPTIONS if o.env]
    flags = [o.flag for o in config.OPTIONS if o.flag]
    for seen in (names, envs, flags):
        assert len(seen) == len(set(seen))


def test_valid_cluster_info_still_passes(tmp_path: Path) -> None:
    env = base_env(**_info(**GOOD)(tmp_path))
    r, _ = run_cli(["--dry-run", "torch", "--", "python", "-c", "pass"], env)
    assert r.returncode == 0, r.stderr


def test_readme_options_table_matches_the_declaration() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `--")]
    for option in config.OPTIONS:
        if option.flag is None:
            continue
        row = next((r for r in rows if r.startswith(f"| `{option.flag}")), None)
        assert row is not None, f"README's options table lacks {option.flag}"
        assert f"`{option.env}`" in row, f"README names another variable for {option.flag}"


def test_slots_flag_reaches_the_detector_but_not_the_workers(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ.get('DET_LAUNCH_SLOTS', '-'))"
    r = subprocess.run(
        [sys.executable, "-m", "determined_launch.cli", "--slots", "1", "torch", "--",
         sys.executable, "-c", script],
        env=base_env(), capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text() == "-"


def test_checkpoint_storage_flag_is_checked_and_reaches_the_workers(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    r, elapsed = run_cli(["--checkpoint-storage", str(tmp_path / "a-file" / "x"), "exec", "--",
                          "true"], base_env(DET_LAUNCH_SLOTS="1"))
    assert_one_line_error(r, elapsed, "cannot write there: ")
    store = tmp_path / "ck"
    code = ("import os, determined_launch as det\n"
            "with det.core.init() as c:\n"
            "    with c.checkpoint.store_path({'steps_completed': 1}) as (p, sid):\n"
            "        (p / 'w').write_text('1')\n"
            "print(os.environ['DET_CHECKPOINT_STORAGE'])\n")
    r = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--checkpoint-storage",
                        str(store), "exec", "--", sys.executable, "-c", code], cwd=tmp_path,
                       env=base_env(DET_LAUNCH_SLOTS="1"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert str(store) in r.stdout and len([p for p in store.iterdir()
                                           if not p.name.startswith(".")]) == 1
