"""The ssh pieces both backends share: derived keys, the gate, a real sshd."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from determined_launch.backends import ssh, ssh_keys
from determined_launch.backends.plan import FileToWrite
from determined_launch.errors import LaunchError
from determined_launch.supervisor import write_private_file
from tests._hvdds_helpers import SECRET, make_facts, make_info, make_runtime, real_env
from tests.conftest import free_port_block


def test_derived_keys_are_valid_openssh_keys(tmp_path: Path) -> None:
    if not shutil.which("ssh-keygen"):
        pytest.skip("ssh-keygen (openssh-client) is not installed")
    key = ssh.derive_key(SECRET, "client")
    path = tmp_path / "k"
    path.write_text(key.private_file)
    path.chmod(0o600)
    out = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert out.split()[:2] == key.public_line.split()[:2]


def test_key_derivation_is_deterministic_and_separates_purposes() -> None:
    assert ssh.derive_key(SECRET, "host") == ssh.derive_key(SECRET, "host")
    assert ssh.derive_key(SECRET, "host") != ssh.derive_key(SECRET, "client")
    assert ssh.derive_key(SECRET, "host") != ssh.derive_key(SECRET[::-1], "host")


def test_ed25519_matches_rfc8032_test_vector() -> None:
    # RFC 8032, section 7.1, TEST 1.
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    expected = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    public = ssh_keys.ed25519_key(seed, "c").public_key.split()[1]
    assert base64.b64decode(public)[-32:].hex() == expected


def test_missing_cryptography_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives", None)
    with pytest.raises(LaunchError, match=re.escape("pip install 'determined_launch[ssh]'")):
        ssh.derive_key(SECRET, "host")


# ------------------------------------------------------------------- the gate
def run_gate(
    args: list[str], env: dict[str, str], timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "determined_launch.nodeexec.gate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_gate_times_out_with_the_endpoint_named(tmp_path: Path) -> None:
    port = free_port_block(1)  # nothing listens there
    r = run_gate(
        ["--wait-ssh", f"127.0.0.1:{port}", "--timeout", "0.5", "--", "true"],
        real_env(tmp_path / "tmp"),
    )
    assert r.returncode == 1
    assert f"sshd at 127.0.0.1:{port} did not answer within 0.5s" in r.stderr


def test_gate_waits_for_a_late_listener_then_execs(tmp_path: Path) -> None:
    port = free_port_block(1)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "determined_launch.nodeexec.gate",
            "--wait-tcp",
            f"127.0.0.1:{port}",
            "--timeout",
            "20",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.getpid())",
        ],
        env=real_env(tmp_path / "tmp"),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    assert proc.poll() is None  # still waiting
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert int(out) == proc.pid  # exec: the command *is* the gate's process


def test_gate_node_env_prefers_what_sshd_set(tmp_path: Path) -> None:
    chief = tmp_path / "chief.json"
    peer = tmp_path / "peer.json"
    chief.write_text(json.dumps({"DET_LAUNCH_JOB_DIR": "/chief"}))
    peer.write_text(json.dumps({"DET_LAUNCH_JOB_DIR": "/peer", "DET_DIST_SECRET": SECRET}))
    show = ["--", sys.executable, "-c", "import os; print(os.environ['DET_LAUNCH_JOB_DIR'])"]
    env = real_env(tmp_path / "tmp", DET_LAUNCH_NODE_ENV_FILE=str(chief), DET_LAUNCH_JOB_DIR="/x")
    assert run_gate(["--node-env", *show], env).stdout.strip() == "/chief"
    env["DET_LAUNCH_SSHD_NODE_ENV"] = str(peer)
    assert run_gate(["--node-env", *show], env).stdout.strip() == "/peer"
    del env["DET_LAUNCH_SSHD_NODE_ENV"], env["DET_LAUNCH_NODE_ENV_FILE"]
    r = run_gate(["--node-env", *show], env)
    assert r.returncode == 1 and "--node-env" in r.stderr


def test_gate_finds_the_loopback_interface_for_any_127_address() -> None:
    from determined_launch.nodeexec.gate import iface_for

    lo = iface_for("127.0.0.1")
    assert lo is not None
    assert iface_for("127.0.0.2") == lo
    assert iface_for("198.51.100.7") is None  # TEST-NET-2: on no interface here


# ------------------------------------------------------------ a real sshd
def write_files(files: tuple[FileToWrite, ...]) -> None:
    for f in files:
        write_private_file(f.path, f.content, f.mode)


def test_real_sshd_accepts_only_the_job_key_and_sets_the_node_env(tmp_path: Path) -> None:
    """The generated sshd config, host key and client wrapper against the
    real OpenSSH: a command runs through the wrapper, the session sees
    sshd's SetEnv, and the pinned host key is checked."""
    facts = ssh.HostFacts.current()
    if not (facts.sshd and facts.ssh):
        pytest.skip("OpenSSH server or client is not installed")
    port = free_port_block(1)
    peer_dir, chief_dir = tmp_path / "peer", tmp_path / "chief"
    peer_dir.mkdir(mode=0o700)
    chief_dir.mkdir(mode=0o700)
    peer_info = make_info(["127.0.0.1", "127.0.0.2"], [1, 1], rank=1)
    chief_info = make_info(["127.0.0.1", "127.0.0.2"], [1, 1], rank=0)
    peer_rt = make_runtime(str(peer_dir))
    chief_rt = make_runtime(str(chief_dir))
    peer_rt = type(peer_rt)(**{**peer_rt.__dict__, "python": sys.executable})
    write_files(ssh.sshd_files(peer_info, peer_rt, facts, port))
    write_files((ssh.node_env_file(peer_rt, {"DET_LAUNCH_JOB_DIR": str(peer_dir)}),))
    write_files(ssh.client_files(chief_info, chief_rt, facts, port))
    spec = ssh.sshd_process(peer_info, peer_rt, facts, port)
    env = real_env(tmp_path / "tmp")
    sshd = subprocess.Popen(
        list(spec.argv), env=env, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    try:
        r = run_gate(["--wait-ssh", f"127.0.0.2:{port}", "--timeout", "20", "--", "true"], env)
        assert r.returncode == 0, r.stderr
        wrapper = str(chief_dir / "ssh")
        out = subprocess.run(
            [wrapper, "127.0.0.2", "echo $DET_LAUNCH_SSHD_NODE_ENV"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(peer_dir / "node-env.json")
        # Another job's secret gives another key: refused.
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        write_files(
            ssh.client_files(chief_info, make_runtime(str(other), secret="f" * 32), facts, port)
        )
        denied = subprocess.run(
            [str(other / "ssh"), "127.0.0.2", "true"], capture_output=True, text=True, timeout=30
        )
        assert denied.returncode == 255
        assert "Host key verification failed" in denied.stderr  # host key is pinned
        # Even when trusting the right host key, the other key cannot log in.
        (other / "ssh_known_hosts").write_text((chief_dir / "ssh_known_hosts").read_text())
        denied = subprocess.run(
            [str(other / "ssh"), "127.0.0.2", "true"], capture_output=True, text=True, timeout=30
        )
        assert denied.returncode == 255
        assert "Permission denied" in denied.stderr
    finally:
        os.killpg(sshd.pid, signal.SIGTERM)
        _, sshd_log = sshd.communicate(timeout=30)
    # The gate's readiness probe completes the greeting, so sshd logs no error.
    assert "kex_exchange_identification" not in sshd_log, sshd_log


def test_known_hosts_names_every_node_as_ssh_looks_it_up() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2", "10.0.0.1"], [1, 1, 1])
    for port, names in ((2222, "[10.0.0.1]:2222,[10.0.0.2]:2222"), (22, "10.0.0.1,10.0.0.2")):
        files = ssh.client_files(info, make_runtime(), make_facts(), port)
        known = next(f for f in files if f.path.endswith("ssh_known_hosts")).content
        assert known == f"{names} {ssh.derive_key(SECRET, 'host').public_key}\n"


def test_sshd_listens_only_on_the_nodes_address(tmp_path: Path) -> None:
    from determined_launch.nodeexec.sshd import listen_address

    assert listen_address("127.0.0.2", 2222) == "127.0.0.2:2222"
    assert listen_address("198.51.100.7", 2222) == "0.0.0.0:2222"  # not ours: NAT'd address
    assert ssh.client_path(make_runtime("/j"), {"PATH": "/bin"}) == "/j" + os.pathsep + "/bin"
    assert make_facts().user == "alice"
