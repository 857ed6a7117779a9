"""The chief's launcher keeps the run's output in ``<run_dir>/output.log``
(launch/output_record.py) without changing what programs see: a terminal stays
a terminal of the same size, and a launcher whose stdout already is that file
(the experiment driver's trials) does not write it twice."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from determined_launch.common.redact import as_shown
from tests.conftest import base_env

PROGRAM = """\
import os, sys, time
print("tty", sys.stdout.isatty(), sys.stderr.isatty(), tuple(os.get_terminal_size()))
print("\\x1b[31mred\\x1b[0m")
sys.stdout.write("bar 1\\rbar 2\\r"); sys.stdout.flush()
time.sleep(0.4)  # the unfinished line is passed on meanwhile
print("done")
print("to stderr", file=sys.stderr)
raise SystemExit(3)
"""


def _exec(cwd: Path, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "determined_launch.cli", "exec", "--",
                             sys.executable, "prog.py"], cwd=cwd, env=base_env(), **kw)  # type: ignore[call-overload]


@pytest.mark.slow
def test_a_terminal_stays_a_terminal_and_the_run_keeps_its_output(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 123, 0, 0))
    proc = _exec(tmp_path, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the launcher and all it started are gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(60) == 3
    assert b"tty True True (123, 40)" in seen, seen  # isatty and the terminal's size
    assert b"\x1b[31mred\x1b[0m\r\n" in seen and b"bar 1\rbar 2\rdone" in seen
    assert b"to stderr" in seen and b"job failed" in seen
    log = (tmp_path / "det_runs" / "local" / "output.log").read_bytes()
    assert b"\r\n" not in log  # the pty's own "\r" is not recorded
    assert log.startswith(b"tty True True (123, 40)\n\x1b[31mred")
    assert b"to stderr\n" in log and b"det-launch: job failed" in log
    assert as_shown(log.decode()).splitlines()[1:3] == ["red", "done"]


@pytest.mark.slow
def test_a_launcher_writing_to_the_runs_output_log_already_does_not_double_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "prog.py").write_text("print('once')\n")
    log = tmp_path / "det_runs" / "local" / "output.log"
    log.parent.mkdir(parents=True)
    with open(log, "ab") as out:  # as the experiment driver runs a trial's launcher
        assert _exec(tmp_path, stdout=out, stderr=subprocess.STDOUT).wait(60) == 0
    assert log.read_text().count("once") == 1


def test_captured_terminal_output_is_shown_as_the_terminal_showed_it() -> None:
    assert as_shown("\x1b[1;32mok\x1b[0m done\n") == "ok done\n"
    assert as_shown("10%\r50%\r100%\nnext\n") == "100%\nnext\n"
    assert as_shown("windows line\r\n") == "windows line\r\n"  # not a rewrite
    assert as_shown("a\x1b]0;title\x07b") == "a\x1b]0;title\x07b"  # not CSI: escaped later


@pytest.mark.slow
def test_no_output_log_keeps_nothing(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("print('not kept')\n")
    done = subprocess.run([sys.executable, "-m", "determined_launch.cli", "--no-output-log",
                           "exec", "--", sys.executable, "prog.py"], cwd=tmp_path,
                          env=base_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "not kept" in done.stdout, done.stderr
    assert (tmp_path / "det_runs" / "local" / "exit.json").exists()
    assert not (tmp_path / "det_runs" / "local" / "output.log").exists()
