"""Horovod plans, as data: no processes are started here."""

from __future__ import annotations

import json

import pytest

from determined_launch.backends import horovod, ssh
from determined_launch.backends.plan import BackendArgs
from determined_launch.errors import LaunchError
from tests._hvdds_helpers import SECRET, make_facts, make_info, make_runtime

SCRIPT = ("python", "train.py", "--lr", "0.1")


def plan_for(info, overrides=(), environ=None, **facts_kw):  # type: ignore[no-untyped-def]
    return horovod.build_plan(
        info, make_runtime(), BackendArgs(tuple(overrides), SCRIPT), make_facts(environ, **facts_kw)
    )


def test_single_node_runs_horovodrun_with_gloo_when_mpi_is_absent() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [4]))
    (proc,) = plan.processes
    argv = list(proc.argv)
    assert argv[:4] == ["/py/bin/python", "-m", "determined_launch.nodeexec.horovodrun", "--gloo"]
    assert argv[4:8] == ["-np", "4", "-H", "localhost:4"]
    assert argv[-len(SCRIPT) :] == list(SCRIPT)
    i = argv.index("wrap_rank")
    assert argv[i + 1] == "HOROVOD_RANK,OMPI_COMM_WORLD_RANK,PMI_RANK"
    # The gate restores the secret and node-local paths that horovodrun
    # would otherwise copy onto every worker's command line.
    assert argv[argv.index("determined_launch.nodeexec.gate") + 1] == "--node-env"
    assert plan.env["USE_HOROVOD"] == "1"
    assert plan.env["DET_CHIEF_IP"] == "127.0.0.1"
    assert "DET_DIST_SECRET" not in plan.env
    assert "DET_DIST_SECRET" in plan.unset_env
    (node_env,) = [f for f in plan.files if f.path.endswith("node-env.json")]
    values = json.loads(node_env.content)
    assert values["DET_DIST_SECRET"] == SECRET
    assert values["DET_LAUNCH_JOB_DIR"] == "/jobs/n0"
    assert node_env.mode == 0o600


def test_horovodrun_gets_determineds_timeouts_and_no_slurm_jobid() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [2]), environ={"DET_LAUNCH_CONNECT_TIMEOUT": "50"})
    argv = list(plan.processes[0].argv)
    assert argv[argv.index("--start-timeout") + 1] == "50"
    assert argv[argv.index("--gloo-timeout-seconds") + 1] == "50"
    assert "-p" not in argv  # no ssh on one node
    assert "SLURM_JOBID" in plan.unset_env


def test_single_node_leaves_the_controller_to_horovodrun_when_mpirun_exists() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [2]), mpirun=True)
    assert "--gloo" not in plan.processes[0].argv


def test_overrides_follow_our_defaults_so_they_win() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [2]), ["--start-timeout", "99", "--verbose"])
    argv = list(plan.processes[0].argv)
    assert argv.index("--start-timeout") > argv.index("-H")
    assert "--verbose" in argv


def test_autohorovod_one_slot_runs_the_script_alone() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [1]), ["--autohorovod"])
    (proc,) = plan.processes
    assert "determined_launch.nodeexec.horovodrun" not in proc.argv
    assert proc.argv[-len(SCRIPT) :] == SCRIPT
    assert plan.env["USE_HOROVOD"] == "1"


def test_autohorovod_with_two_slots_still_uses_horovodrun() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [2]), ["--autohorovod"])
    argv = plan.processes[0].argv
    assert "determined_launch.nodeexec.horovodrun" in argv and "--autohorovod" not in argv


# ------------------------------------------------------------------ ssh mode
def test_ssh_chief_waits_for_every_peer_sshd_then_runs_horovodrun() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2", "10.0.0.3"], [2, 2, 1])
    plan = plan_for(info, ["--ssh"], {"DTRAIN_SSH_PORT": "2222"})
    (proc,) = plan.processes
    argv = list(proc.argv)
    gate_end = argv.index("--")
    assert argv[:3] == ["/py/bin/python", "-m", "determined_launch.nodeexec.gate"]
    waits = [argv[i + 1] for i in range(gate_end) if argv[i] == "--wait-ssh"]
    assert waits == ["10.0.0.2:2222", "10.0.0.3:2222"]
    hvd = argv[gate_end + 1 :]
    assert hvd[:3] == ["/py/bin/python", "-m", "determined_launch.nodeexec.horovodrun"]
    assert hvd[hvd.index("-p") + 1] == "2222"
    assert argv[argv.index("--timeout") + 1] == "300"
    assert hvd[hvd.index("-np") + 1] == "5"
    assert hvd[hvd.index("-H") + 1] == "10.0.0.1:2,10.0.0.2:2,10.0.0.3:1"
    # The wrapper dir comes first on PATH, so horovodrun's ssh is ours.
    assert plan.env["PATH"] == "/jobs/n0:/usr/bin:/bin"
    names = {f.path.rsplit("/", 1)[1] for f in plan.files}
    assert {"ssh", "ssh_config", "ssh_client_key", "ssh_known_hosts", "node-env.json"} <= names
    assert "sshd_config" not in names  # horovodrun starts the chief's own ranks locally


def test_ssh_peer_runs_only_sshd_as_a_service() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [2, 2], rank=1)
    plan = plan_for(info, ["--ssh"])
    (proc,) = plan.processes
    assert proc.role == "service"
    assert proc.argv[:3] == ("/py/bin/python", "-m", "determined_launch.nodeexec.sshd")
    assert proc.argv[proc.argv.index("--port") + 1] == str(ssh.DEFAULT_SSH_PORT)
    assert proc.argv[proc.argv.index("--addr") + 1] == "10.0.0.2"
    config = next(f for f in plan.files if f.path.endswith("sshd_config")).content
    assert "AllowUsers alice" in config
    assert "PasswordAuthentication no" in config
    assert "SetEnv DET_LAUNCH_SSHD_NODE_ENV=/jobs/n0/node-env.json" in config


def test_ssh_mode_by_environment_variable() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1], rank=1)
    assert plan_for(info, environ={"DET_LAUNCH_SSH": "1"}).processes[0].role == "service"
    assert plan_for(info, ["--no-ssh"], {"DET_LAUNCH_SSH": "1"}).processes[0].role == "worker"
    with pytest.raises(LaunchError, match="DET_LAUNCH_SSH"):
        plan_for(info, environ={"DET_LAUNCH_SSH": "maybe"})


def test_ssh_mode_refuses_a_guessable_secret() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1], secret=None)
    with pytest.raises(LaunchError, match="needs a job secret"):
        plan_for(info, ["--ssh"])
    # An explicit DET_DIST_SECRET is a real secret.
    plan_for(info, ["--ssh"], {"DET_DIST_SECRET": SECRET})


def test_ssh_mode_without_sshd_is_a_clear_error() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1], rank=1)
    with pytest.raises(LaunchError, match="openssh-server"):
        plan_for(info, ["--ssh"], sshd=None)


def test_bad_ssh_port() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1])
    with pytest.raises(LaunchError, match="DTRAIN_SSH_PORT"):
        plan_for(info, ["--ssh"], {"DTRAIN_SSH_PORT": "ssh"})


# --------------------------------------------------------------- ssh-free mode
def test_slot_assignments_match_horovodrun_layout() -> None:
    slots = horovod.slot_assignments([2, 3, 1])
    assert [(s.node, s.rank, s.local_rank) for s in slots] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 2, 0),
        (1, 3, 1),
        (1, 4, 2),
        (2, 5, 0),
    ]
    # Local rank 1 exists on nodes 0 and 1 only; local rank 2 on node 1 only.
    assert [(s.cross_rank, s.cross_size) for s in slots] == [
        (0, 3),
        (0, 2),
        (1, 3),
        (1, 2),
        (0, 1),
        (2, 3),
    ]
    assert {s.size for s in slots} == {6}
    assert [s.local_size for s in slots] == [2, 2, 3, 3, 3, 1]


def test_slot_assignments_agree_with_horovod_itself() -> None:
    hosts_mod = pytest.importorskip("horovod.runner.common.util.hosts")
    counts = [2, 3, 1]
    theirs = hosts_mod.get_host_assignments(hosts_mod.parse_hosts("a:2,b:3,c:1"), sum(counts))
    ours = horovod.slot_assignments(counts)
    assert [
        (s.rank, s.local_rank, s.cross_rank, s.size, s.local_size, s.cross_size) for s in ours
    ] == [(t.rank, t.local_rank, t.cross_rank, t.size, t.local_size, t.cross_size) for t in theirs]


def test_direct_mode_chief_runs_rendezvous_service_and_its_workers() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [2, 2])
    plan = plan_for(info)
    service, *workers = plan.processes
    assert service.role == "service"
    rendezvous = "determined_launch.nodeexec.horovod_rendezvous"
    assert service.argv[:3] == ("/py/bin/python", "-m", rendezvous)
    assert service.argv[service.argv.index("--hosts") + 1] == "10.0.0.1:2,10.0.0.2:2"
    assert service.argv[service.argv.index("--port") + 1] == "29400"
    assert [w.env["HOROVOD_RANK"] for w in workers] == ["0", "1"]
    assert plan.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1"
    assert plan.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "29400"
    assert plan.env["HOROVOD_CONTROLLER"] == "gloo"
    assert plan.env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert plan.env["HOROVOD_HOSTNAME"] == "10.0.0.1"
    argv = list(workers[0].argv)
    assert argv[argv.index("--wait-tcp") + 1] == "10.0.0.1:29400"
    assert argv[argv.index("--gloo-iface-for") + 1] == "10.0.0.1"


def test_direct_mode_peer_has_no_server_and_later_ranks() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [2, 3], rank=1)
    plan = plan_for(info)
    assert all(p.role == "worker" for p in plan.processes)
    assert [p.env["HOROVOD_RANK"] for p in plan.processes] == ["2", "3", "4"]
    assert [p.env["HOROVOD_LOCAL_RANK"] for p in plan.processes] == ["0", "1", "2"]
    assert [p.env["HOROVOD_CROSS_SIZE"] for p in plan.processes] == ["2", "2", "1"]
    assert plan.env["HOROVOD_HOSTNAME"] == "10.0.0.2"


def test_direct_mode_distinguishes_nodes_that_share_an_address() -> None:
    info = make_info(["127.0.0.1", "127.0.0.1"], [1, 1], rank=1)
    assert plan_for(info).env["HOROVOD_HOSTNAME"] == "127.0.0.1-node1"


def test_direct_mode_maps_horovodrun_flags_to_variables() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1])
    plan = plan_for(info, ["--fusion-threshold-mb", "2", "--network-interface=eth1"])
    assert plan.env["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
    assert plan.env["HOROVOD_GLOO_IFACE"] == "eth1"
    with pytest.raises(LaunchError, match="--mpi-args.*--ssh"):
        plan_for(info, ["--mpi-args", "-x FOO"])


def test_direct_mode_gloo_timeout_follows_connect_timeout_unless_set() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1])
    env = plan_for(info, environ={"DET_LAUNCH_CONNECT_TIMEOUT": "42"}).env
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "42"
    env = plan_for(info, environ={"HOROVOD_GLOO_TIMEOUT_SECONDS": "7"}).env
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "7"
