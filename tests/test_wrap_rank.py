"""wrap_rank, end to end with real processes, plus the line rules as a pure function.

The pure part (``LinePrefixer``) is checked against a byte-by-byte reference
of the documented rules on random streams cut at random places; the rest
starts ``python -m wrap_rank`` around real shell and Python children.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._burst import problems, write_burst
from tests.conftest import base_env
from wrap_rank import LINE_CAP, STATUS_DIR_ENV, LinePrefixer
from wrap_rank._out import SharedOutput

REPO = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for var in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", STATUS_DIR_ENV):
        env.pop(var, None)
    env.update(extra)
    return env


def wrap(
    *args: str,
    module: str = "wrap_rank",
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 20,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        env=env or _env(),
        timeout=timeout,
    )


def sh(script: str) -> list[str]:
    return ["--", "sh", "-c", script]


# --- the line rules, as a pure function ----------------------------------------------


LINE_END = re.compile(rb"[\r\n]")


def reference(stream: bytes, prefix: bytes, cap: int) -> bytes:
    """The documented rules, one line-end byte at a time (slow and obviously right)."""
    lines: list[bytes] = []
    cur = bytearray()
    i, n = 0, len(stream)
    while i < n:
        c = stream[i : i + 1]
        if c == b"\n":
            lines.append(bytes(cur))
            cur.clear()
            i += 1
        elif c == b"\r":
            j = i
            while j < n and stream[j : j + 1] == b"\r":
                j += 1
            if j < n and stream[j : j + 1] == b"\n":
                i = j  # \r...\r\n is one line end: the \n handles it
                continue
            if cur:  # a bare \r at the start of a line ends nothing
                lines.append(bytes(cur))
                cur.clear()
            i = j
        else:  # copy up to the next line-end byte
            m = LINE_END.search(stream, i)
            j = m.start() if m else n
            cur += stream[i:j]
            i = j
    if cur:
        lines.append(bytes(cur))
    out = bytearray()
    for line in lines:
        for k in range(0, max(len(line), 1), cap):
            out += prefix + line[k : k + cap] + b"\n"
    return bytes(out)


def run_prefixer(stream: bytes, cuts: list[int], prefix: bytes, cap: int) -> bytes:
    p = LinePrefixer(prefix, cap)
    out = []
    start = 0
    for cut in sorted(set(cuts)) + [len(stream)]:
        if start < cut <= len(stream):
            out.append(p.feed(stream[start:cut]))
            start = cut
    out.append(p.flush())
    return b"".join(out)


@settings(max_examples=400, deadline=None)
@given(
    stream=st.lists(
        st.sampled_from([b"\n", b"\r", b"\r\n", b"a", b"bc", b"\xff", b"\xe2\x82", b"xyz" * 5]),
        max_size=60,
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    cap=st.integers(min_value=1, max_value=12),
)
def test_prefixer_matches_reference_for_any_chunking(
    stream: bytes, cuts: list[int], cap: int
) -> None:
    assert run_prefixer(stream, cuts, b"[rank=7] ", cap) == reference(stream, b"[rank=7] ", cap)


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (b"a\nb\n", [b"a", b"b"]),
        (b"a\r\nb\r\n", [b"a", b"b"]),  # CRLF is one line end
        (b"\r 10%\r 50%\r100%\n", [b" 10%", b" 50%", b"100%"]),  # tqdm
        (b"a\n\nb\n", [b"a", b"", b"b"]),  # blank lines are kept
        (b"a\r\r\nb", [b"a", b"b"]),
        (b"tail", [b"tail"]),
    ],
)
def test_prefixer_examples(stream: bytes, expected: list[bytes]) -> None:
    assert run_prefixer(stream, [], b"> ", LINE_CAP) == b"".join(
        b"> " + x + b"\n" for x in expected
    )


# --- real processes -----------------------------------------------------------------


def test_prefixes_each_stream_separately() -> None:
    r = wrap("3", *sh("echo out1; echo err1 >&2; echo out2; printf 'err2\\n' >&2"))
    assert r.returncode == 0
    assert r.stdout == b"[rank=3] out1\n[rank=3] out2\n"
    assert r.stderr == b"[rank=3] err1\n[rank=3] err2\n"


def test_carriage_returns_crlf_and_partial_last_line() -> None:
    r = wrap("0", *sh(r"printf '\r 10%%\r 50%%\r100%%\nwin\r\ndos\r\nno newline'"))
    assert r.stdout == (
        b"[rank=0]  10%\n[rank=0]  50%\n[rank=0] 100%\n[rank=0] win\n[rank=0] dos\n"
        b"[rank=0] no newline\n"
    )


def test_overlong_line_is_split_at_the_cap() -> None:
    n = 3 * LINE_CAP + 10
    r = wrap(
        "1", "--", sys.executable, "-c", f"import sys; sys.stdout.write('x' * {n} + '\\nend\\n')"
    )
    lines = r.stdout.split(b"\n")
    assert [len(x) for x in lines] == [9 + LINE_CAP] * 3 + [9 + 10, 9 + 3, 0]
    assert all(x.startswith(b"[rank=1] ") for x in lines[:-1])


def test_invalid_utf8_passes_through_byte_exact_and_stream_survives() -> None:
    payload = b"ok \xff\xfe\x80 bad\n\xc3\x28\nafter\n"
    code = f"import sys; sys.stdout.buffer.write({payload!r}); sys.stderr.buffer.write({payload!r})"
    r = wrap("2", "--", sys.executable, "-c", code)
    expected = b"[rank=2] ok \xff\xfe\x80 bad\n[rank=2] \xc3\x28\n[rank=2] after\n"
    assert (r.returncode, r.stdout, r.stderr) == (0, expected, expected)


def test_big_random_stream_is_exact(tmp_path: Path) -> None:
    """Real pipes cut the stream wherever they like; the output must not care."""
    rnd = random.Random(1234)
    alphabet = [b"\n", b"\r", b"\r\n", b"\xff\xfe", b"abc", b"d" * 90, b"e" * 5000]
    data = b"".join(rnd.choice(alphabet) for _ in range(40000)) + b"x" * (LINE_CAP + 7)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    r = wrap("5", "--", "cat", str(src))
    assert r.returncode == 0
    assert r.stdout == reference(data, b"[rank=5] ", LINE_CAP)


def test_nonblocking_stdout_with_a_slow_reader_loses_nothing() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)  # as some parents (node.js, for one) leave it
    code = "import sys; sys.stdout.write(('y' * 99 + chr(10)) * 20000)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "wrap_rank", "0", "--", sys.executable, "-c", code],
        stdout=w,
        stdin=subprocess.DEVNULL,
        env=_env(),
    )
    os.close(w)
    time.sleep(0.5)  # let the pipe fill up while nobody reads
    with os.fdopen(r, "rb") as reader:
        out = reader.read()
    assert proc.wait(timeout=20) == 0
    assert out == (b"[rank=0] " + b"y" * 99 + b"\n") * 20000


def test_ranks_sharing_one_pipe_keep_every_line_whole(tmp_path: Path) -> None:
    """Issue 24: four ranks flooding one pipe, as torchrun's workers share its stdout.
    Before, a 64 KiB write was cut wherever the pipe filled and another rank's
    lines landed inside a line (dozens of these 20,000 lines)."""
    burst, n = write_burst(tmp_path), 5_000
    r, w = os.pipe()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "wrap_rank", str(rank), "--", sys.executable, str(burst),
             str(rank), str(n)],
            stdout=w, stderr=w, stdin=subprocess.DEVNULL, env=_env(),
        )
        for rank in range(4)
    ]
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        out = reader.read()
    assert [p.wait(timeout=60) for p in procs] == [0] * 4
    assert problems(out, 4, n) == []


def test_ranks_flooding_the_per_slot_launcher_reach_stdout_whole(tmp_path: Path) -> None:
    """Issue 24 through ``det.launch_per_slot``: its four wrap_rank'd workers
    share the launcher's stdout (a pipe here), with no relay between."""
    burst, n = write_burst(tmp_path), 5_000
    launcher = tmp_path / "launcher.py"
    launcher.write_text(
        "import sys, determined_launch as det\n"
        f"sys.exit(det.launch_per_slot(lambda r, lr: [sys.executable, {str(burst)!r}, '{n}']))\n"
    )
    env = base_env(DET_LAUNCH_SLOTS="4", TMPDIR=str(tmp_path))
    run = subprocess.run([sys.executable, str(launcher)], env=env, capture_output=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert problems(run.stdout, 4, n) == []


def test_shared_streams_are_locked_and_files_are_not(tmp_path: Path) -> None:
    r, w = os.pipe()
    a, b = socket.socketpair()
    with open(tmp_path / "log", "wb") as f, a, b:
        kinds = {name: SharedOutput(fd) for name, fd in
                 (("pipe", w), ("socket", a.fileno()), ("file", f.fileno()))}
        assert {k: (o.lock, o.batch) for k, o in kinds.items()} == {
            "pipe": (True, True), "socket": (True, False), "file": (False, False)}
        lines = b"".join(b"%d %s\n" % (i, b"z" * (i * 97 % 9000)) for i in range(40))
        kinds["file"].write(lines)
    os.set_blocking(r, False)
    kinds["pipe"].write(b"short\n")
    assert os.read(r, 100) == b"short\n"
    os.close(r)
    os.close(w)
    assert (tmp_path / "log").read_bytes() == lines


def test_stdin_is_inherited() -> None:
    r = wrap("0", "--", "cat", stdin=b"from stdin\n")
    assert r.stdout == b"[rank=0] from stdin\n"


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_exit_status_passes_through(code: int) -> None:
    assert wrap("0", *sh(f"exit {code}")).returncode == code


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_death_by_signal_is_128_plus_signal(sig: signal.Signals) -> None:
    r = wrap("0", *sh(f"echo before; kill -{int(sig)} $$"))
    assert r.returncode == 128 + sig
    assert r.stdout == b"[rank=0] before\n"


def test_torch_rank_label_is_not_repeated() -> None:
    """torch's excepthook (once a process group exists) and TORCH_LOGS put their own
    ``[rankN]:`` before lines: one label per line (issue 33 §2.10). Another rank's
    label, and the text elsewhere in a line, stay."""
    r = wrap("2", *sh("printf '[rank2]: Traceback\\n[rank2]:   File x\\n[rank2]:W1128 log\\n"
                      "[rank3]: other\\nsaw [rank2]: here\\n[rank2]: tail' >&2"))
    assert r.stderr == (b"[rank=2] Traceback\n[rank=2]   File x\n[rank=2] W1128 log\n"
                        b"[rank=2] [rank3]: other\n[rank=2] saw [rank2]: here\n[rank=2] tail\n")
    for chunks in ([b"[rank2]: a\n[ran", b"k2]: b\n"], [b"[rank2]: a\n[rank2]:", b" b"]):
        p = LinePrefixer(b"[rank=2] ", duplicate=b"[rank2]:")
        assert b"".join([*map(p.feed, chunks), p.flush()]) == b"[rank=2] a\n[rank=2] b\n"


def test_command_not_found_is_127(tmp_path: Path) -> None:
    r = wrap("4", "--", "no-such-command-xyz", env=_env(**{STATUS_DIR_ENV: str(tmp_path)}))
    assert r.returncode == 127
    assert r.stderr.count(b"\n") == 1 and b"no-such-command-xyz" in r.stderr
    record = json.loads((tmp_path / "rank-4.json").read_text())
    assert (record["exit_status"], record["pid"]) == (127, None)


TRAPPER = """
import os, signal, sys, time
names = sys.argv[1:]
def on(signum, frame):
    name = signal.Signals(signum).name
    print("got", name, flush=True)
    if name == "SIGTERM":
        sys.exit(5)
for name in names:
    signal.signal(getattr(signal, name), on)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

FORWARDED = ["SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGTERM"]


def readline(proc: subprocess.Popen[bytes], timeout: float = 10) -> bytes:
    """One line of ``proc``'s stdout, or b"" if none comes in time (fail, not hang)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else b""


def _default_dispositions() -> None:
    """A signal ignored at start stays ignored (by design; next test), so a
    suite run under ``nohup`` (SIGHUP ignored) must not make this one fail."""
    for name in FORWARDED:
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def test_signals_are_forwarded_to_the_child() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "wrap_rank", "6", "--", sys.executable, "-c", TRAPPER, *FORWARDED],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=_env(),
        preexec_fn=_default_dispositions,
    )
    try:
        assert readline(proc) == b"[rank=6] ready\n"
        for name in FORWARDED:
            proc.send_signal(getattr(signal, name))
            assert readline(proc) == f"[rank=6] got {name}\n".encode()
        assert proc.wait(timeout=10) == 5
    finally:
        proc.kill()
        proc.wait()


def test_signal_ignored_at_start_stays_ignored_for_both() -> None:
    """The supervisor starts workers with preemption signals ignored (SLURM
    signals every process of a step); wrap_rank must neither die of them nor
    hand them to the child."""
    code = (
        "import signal, sys, time; "
        "print(signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN, flush=True); "
        "sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "wrap_rank", "0", "--", sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN),
    )
    try:
        assert readline(proc) == b"[rank=0] True\n"
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        assert proc.stdin is not None
        proc.stdin.close()  # now the child ends normally
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_no_redirect_stdio_leaves_output_alone_and_still_reports() -> None:
    r = wrap("--no-redirect-stdio", "1", *sh("echo plain; echo err >&2; exit 3"))
    assert (r.returncode, r.stdout, r.stderr) == (3, b"plain\n", b"err\n")


@pytest.mark.parametrize("background", ["sleep 30", "yes"])
def test_returns_when_the_child_exits_even_if_a_background_process_holds_the_pipes(
    background: str,
) -> None:
    start = time.monotonic()
    r = wrap("0", *sh(f"{background} >&2 & echo $!"))
    elapsed = time.monotonic() - start
    try:
        os.kill(int(r.stdout.split()[-1]), signal.SIGKILL)
    except ProcessLookupError:
        pass  # yes died of the broken pipe by itself
    assert r.returncode == 0 and r.stdout.startswith(b"[rank=0] ")
    assert elapsed < 10


# --- rank resolution ------------------------------------------------------------------

RANK_VARS = "RANK,HOROVOD_RANK,OMPI_COMM_WORLD_RANK,PMI_RANK"


def test_rank_from_first_set_variable() -> None:
    r = wrap(RANK_VARS, *sh("echo hi"), env=_env(OMPI_COMM_WORLD_RANK="12", PMI_RANK="3"))
    assert r.stdout == b"[rank=12] hi\n"


@pytest.mark.parametrize(
    ("spec", "env"),
    [
        (RANK_VARS, {}),  # none set
        (RANK_VARS, {"HOROVOD_RANK": "one"}),  # not an integer
        (RANK_VARS, {"RANK": "-1"}),
        ("1x", {}),  # neither integer nor names
        ("RANK,,PMI_RANK", {"RANK": "0"}),
    ],
)
def test_bad_rank_is_one_line_exit_2_and_no_child(
    tmp_path: Path, spec: str, env: dict[str, str]
) -> None:
    marker = tmp_path / "started"
    r = wrap(spec, "--", "touch", str(marker), env=_env(**env))
    assert r.returncode == 2
    assert r.stderr.count(b"\n") == 1 and r.stderr.startswith(b"wrap_rank: ")
    assert not marker.exists()


@pytest.mark.parametrize("args", [[], ["0"], ["0", "--"], ["--bogus", "0", "true"]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    r = wrap(*args)
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1


# --- status file ----------------------------------------------------------------------


def test_status_file_records_exit(tmp_path: Path) -> None:
    status_dir = tmp_path / "missing" / "status"
    env = _env(**{STATUS_DIR_ENV: str(status_dir)})
    r = wrap("3", *sh("echo $$; exit 9"), env=env)
    assert r.returncode == 9
    record = json.loads((status_dir / "rank-3.json").read_text())
    pid = int(r.stdout.split()[-1])
    assert record["rank"] == 3 and record["exit_status"] == 9 and record["signal"] is None
    assert record["pid"] == pid and record["host"] == os.uname().nodename
    assert abs(record["time"] - time.time()) < 60
    assert stat.S_IMODE(status_dir.stat().st_mode) == 0o700
    assert [p.name for p in status_dir.iterdir()] == ["rank-3.json"]  # no temp file left


def test_status_file_records_signal(tmp_path: Path) -> None:
    r = wrap("0", *sh("kill -KILL $$"), env=_env(**{STATUS_DIR_ENV: str(tmp_path)}))
    record = json.loads((tmp_path / "rank-0.json").read_text())
    assert r.returncode == 137
    assert (record["exit_status"], record["signal"]) == (137, "SIGKILL")


def test_status_file_error_warns_once_and_keeps_exit_status(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    r = wrap("0", *sh("exit 4"), env=_env(**{STATUS_DIR_ENV: str(not_a_dir)}))
    assert r.returncode == 4
    assert r.stderr.count(b"\n") == 1 and b"status file" in r.stderr


def test_status_dir_name_matches_the_launcher_contract() -> None:
    from determined_launch import envvars

    assert envvars.WRAP_RANK_STATUS_DIR == STATUS_DIR_ENV


# --- packaging ------------------------------------------------------------------------


def test_determined_launch_module_behaves_the_same() -> None:
    args = ["2", *sh("echo o; echo e >&2; printf 'a\\rb'; exit 6")]
    ours, theirs = wrap(*args), wrap(*args, module="determined_launch.wrap_rank")
    assert (theirs.returncode, theirs.stdout, theirs.stderr) == (
        ours.returncode,
        ours.stdout,
        ours.stderr,
    )
    assert ours.returncode == 6 and ours.stdout == b"[rank=2] o\n[rank=2] a\n[rank=2] b\n"


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="needs Python 3.10+")
def test_imports_only_the_standard_library() -> None:
    # -S: no site-packages hooks, so every import listed is wrap_rank's or Python's own.
    r = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", "-m", "wrap_rank", "0", "--", "true"],
        capture_output=True,
        env=_env(**{STATUS_DIR_ENV: ""}),
        timeout=20,
    )
    assert r.returncode == 0
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in r.stderr.decode().splitlines()
        if line.startswith("import time:") and "|" in line and "self [us]" not in line
    }
    assert "wrap_rank" in names
    assert names - {"wrap_rank"} <= set(sys.stdlib_module_names), names
    # and none of the heavy ones, which the start-up budget has no room for
    assert not names & {"determined_launch", "subprocess", "threading", "json", "argparse"}
