"""DeepSpeed plans and export-file rendering, as data (no launcher runs)."""

from __future__ import annotations

import logging
import subprocess

import pytest

from determined_launch.backends import deepspeed
from determined_launch.backends.plan import BackendArgs
from determined_launch.errors import LaunchError
from tests._hvdds_helpers import SECRET, make_facts, make_info, make_runtime

SCRIPT = ("python", "train.py", "--deepspeed_config", "ds.json")


def plan_for(info, overrides=(), environ=None, **facts_kw):  # type: ignore[no-untyped-def]
    return deepspeed.build_plan(
        info, make_runtime(), BackendArgs(tuple(overrides), SCRIPT), make_facts(environ, **facts_kw)
    )


def files_of(plan):  # type: ignore[no-untyped-def]
    return {f.path.rsplit("/", 1)[1]: f for f in plan.files}


def test_single_node_uses_num_gpus_and_a_private_hostfile() -> None:
    plan = plan_for(make_info(["127.0.0.1"], [3]))
    (proc,) = plan.processes
    argv = list(proc.argv)
    assert argv[:3] == ["/py/bin/python", "-m", "deepspeed.launcher.runner"]
    assert argv[argv.index("--num_gpus") + 1] == "3"
    assert argv[argv.index("--hostfile") + 1] == "/jobs/n0/hostfile"
    assert argv[argv.index("--master_addr") + 1] == "127.0.0.1"
    assert argv[argv.index("--master_port") + 1] == "29400"
    assert {"--no_python", "--no_local_rank", "--no_ssh_check"} <= set(argv)
    assert argv[argv.index("wrap_rank") + 1] == "RANK"
    assert argv[-len(SCRIPT) :] == list(SCRIPT)
    files = files_of(plan)
    assert files["hostfile"].content == "127.0.0.1 slots=3\n"
    assert files[".deepspeed_env"].path == "/jobs/n0/.deepspeed_env"
    assert plan.env["DS_ENV_FILE"] == "/jobs/n0/.deepspeed_env"
    assert plan.env["USE_DEEPSPEED"] == "1"
    assert plan.env["DET_CHIEF_IP"] == "127.0.0.1"


def test_single_node_names_deepspeeds_shm_buffers_of_this_job_only() -> None:
    """DeepSpeed never unlinks its CPU allreduce buffers; the plan names
    them (this uid, this port) so the supervisor removes them."""
    single = plan_for(make_info(["127.0.0.1"], [2]), uid=1234)
    assert single.leftovers == ("/dev/shm/deepspeed_allreduce_buffer_1234_127.0.0.1_29400_*",)
    # Several nodes: DeepSpeed uses no shared memory buffers then.
    assert plan_for(make_info(["10.0.0.1", "10.0.0.2"], [1, 1])).leftovers == ()


def test_multi_node_default_is_no_ssh_with_node_rank() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [2, 4], rank=1)
    plan = plan_for(info)
    (proc,) = plan.processes
    argv = list(proc.argv)
    assert "--no_ssh" in argv
    assert argv[argv.index("--node_rank") + 1] == "1"
    assert argv[argv.index("--master_addr") + 1] == "10.0.0.1"
    assert "--num_gpus" not in argv  # the hostfile gives each node's slots
    assert files_of(plan)["hostfile"].content == "10.0.0.1 slots=2\n10.0.0.2 slots=4\n"


def test_deepspeeds_own_no_ssh_flag_is_not_passed_twice() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1])
    argv = plan_for(info, ["--no_ssh", "--zero"], {"DET_LAUNCH_SSH": "1"}).processes[0].argv
    assert argv.count("--no_ssh") == 1 and "--zero" in argv


def test_ssh_mode_every_node_runs_sshd_and_the_chief_runs_pdsh() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [2, 2])
    plan = plan_for(info, ["--ssh"], {"DTRAIN_SSH_PORT": "2200"})
    sshd, ds = plan.processes
    assert sshd.role == "service" and ds.role == "worker"
    argv = list(ds.argv)
    gate_end = argv.index("--")
    waits = [argv[i + 1] for i in range(gate_end) if argv[i] == "--wait-ssh"]
    assert waits == ["10.0.0.1:2200", "10.0.0.2:2200"]  # pdsh reaches the chief by ssh too
    assert argv[argv.index("--launcher") + 1] == "pdsh"
    assert argv[argv.index("--ssh_port") + 1] == "2200"
    assert "--no_ssh_check" in argv and "--no_ssh" not in argv
    assert argv.count("determined_launch.nodeexec.gate") == 2  # wait for sshds; restore node env
    assert "DET_DIST_SECRET" not in plan.env and "DET_DIST_SECRET" in plan.unset_env
    assert plan.env["PATH"].startswith("/jobs/n0:")
    peer = plan_for(make_info(["10.0.0.1", "10.0.0.2"], [2, 2], rank=1), ["--ssh"])
    assert [p.role for p in peer.processes] == ["service"]


def test_ssh_mode_refuses_a_guessable_secret() -> None:
    info = make_info(["10.0.0.1", "10.0.0.2"], [1, 1], secret=None)
    with pytest.raises(LaunchError, match="job secret"):
        plan_for(info, ["--ssh"])


# ------------------------------------------------------------- export file
def test_unsafe_and_node_local_variables_are_not_exported() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0",
        "SLURM_PROCID": "3",
        "SLURM_JOB_ID": "77",
        "BASH_FUNC_module%%": "() { :; }",
        "OMPI_COMM_WORLD_RANK": "1",
        "DET_DIST_SECRET": SECRET,
        "DET_LAUNCH_JOB_DIR": "/jobs/n0",
        "HOME": "/root",
        "NCCL_DEBUG": "INFO",
        "MY_SETTING": "a b",
        "PATH": "/usr/bin",
    }
    content = deepspeed.env_file_content(env)
    names = {line.split("=", 1)[0] for line in content.splitlines()}
    assert names == {"NCCL_DEBUG", "MY_SETTING", "PATH"}


def test_values_with_newlines_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="determined_launch.deepspeed"):
        content = deepspeed.env_file_content({"OK": "1", "MULTI": "a\nb", "PADDED": " x"})
    assert content == "OK=1\n"
    assert "MULTI" in caplog.text and "newline" in caplog.text
    assert "PADDED" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="determined_launch.deepspeed"):
        assert deepspeed.env_file_content({"MULTI": "a\nb"}, warn=False) == ""
    assert caplog.text == ""  # the file is unused without ssh: no noise


def test_only_the_ssh_mode_warns_about_dropped_values(caplog: pytest.LogCaptureFixture) -> None:
    env = {"MULTI": "a\nb"}
    with caplog.at_level(logging.WARNING, logger="determined_launch.deepspeed"):
        plan_for(make_info(["10.0.0.1", "10.0.0.2"], [1, 1]), environ=env)
        plan_for(make_info(["127.0.0.1"], [1]), environ=env)
        assert caplog.text == ""
        plan_for(make_info(["10.0.0.1", "10.0.0.2"], [1, 1]), ["--ssh"], environ=env)
    assert "MULTI" in caplog.text


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "with space",
        'quote"d',
        "dollar $HOME",
        "back\\slash",
        "tick `id`",
        "semi;colon",
        "it's",
        "",
        "a=b,c:d/e",
        "ünïcode",
        "*glob?",
        "$(touch /nonexistent)",
    ],
)
def test_exported_values_survive_deepspeeds_quoting_and_the_remote_shell(value: str) -> None:
    """The file is read by DeepSpeed's own ``add_export`` and the line it
    builds is run by a shell on the other node: what arrives must equal
    what was sent."""
    runner_mod = pytest.importorskip("deepspeed.launcher.multinode_runner")
    line = deepspeed.env_file_content({"V": value})
    key, val = line.split("=", 1)

    class Runner(runner_mod.MultiNodeRunner):  # type: ignore[misc,name-defined]
        def backend_exists(self) -> bool:
            return True

        def get_cmd(self, environment, active_resources):  # type: ignore[no-untyped-def]
            return []

        def validate_args(self) -> None:
            pass

        def parse_user_args(self):  # type: ignore[no-untyped-def]
            return []

    class Args:
        user_script = "x"
        user_args: list[str] = []

    r = Runner(Args(), "")
    r.add_export(key, val)  # exactly as runner.main() reads the file
    exports = "".join(f"export {k}={v}; " for k, v in r.exports.items())  # PDSHRunner.get_cmd
    out = subprocess.run(
        ["sh", "-c", exports + 'printf %s "$V"'], capture_output=True, text=True, check=True
    ).stdout
    assert out == value


def test_hostfile_lists_every_node_in_rank_order() -> None:
    info = make_info(["b", "a", "c"], [1, 2, 3])
    assert deepspeed.hostfile_content(info) == "b slots=1\na slots=2\nc slots=3\n"
