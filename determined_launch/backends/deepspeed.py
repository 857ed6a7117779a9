"""DeepSpeed plans: the ``deepspeed`` launcher on one node or several.

``python -m determined_launch.deepspeed [DS_ARGS... --] SCRIPT...``. Every
shape passes ``--no_python --no_local_rank`` and runs each worker under
``wrap_rank RANK``; the hostfile (``host slots=N`` per node) and the
environment export file live in the job's private directory, never in the
working directory or a fixed ``/tmp`` name.

* one node: ``deepspeed --num_gpus S`` (on CPU, DeepSpeed picks its CPU
  accelerator and the script chooses gloo).
* several nodes, the default: ``deepspeed --no_ssh --node_rank R
  --master_addr CHIEF`` on every node; each starts its own workers.
* several nodes, ``--ssh`` (or ``DET_LAUNCH_SSH=1``), as Determined does
  it: every node runs the job's sshd, and the chief's ``deepspeed`` reaches
  them all with pdsh (``--no_ssh_check``: the chief has already waited for
  every sshd). The export file carries the launcher's environment to the
  remote workers; DeepSpeed reads it only in this mode.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Optional

from determined_launch import envvars
from determined_launch.backends import ssh
from determined_launch.backends.common import worker_env, wrap_rank_argv
from determined_launch.backends.plan import (
    BackendArgs,
    FileToWrite,
    JobRuntime,
    LaunchPlan,
    ProcessSpec,
)
from determined_launch.cluster.info import ClusterInfo

logger = logging.getLogger("determined_launch.deepspeed")

#: DeepSpeed reads the export file named by this variable (default
#: ``.deepspeed_env`` in the home and working directories); an absolute
#: path makes it read ours, and only ours.
DS_ENV_FILE = "DS_ENV_FILE"
ENV_FILE_NAME = ".deepspeed_env"
HOSTFILE_NAME = "hostfile"

#: Variables never copied to other nodes: they describe this node, this
#: process or this shell, and would be wrong (or harmful) elsewhere.
UNSAFE_VARS = frozenset(
    {
        # devices: DeepSpeed sets them per node
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        # ranks and rendezvous: DeepSpeed sets them per worker
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "LOCAL_SIZE",
        "CROSS_RANK",
        "CROSS_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MPI_LOCALRANKID",
        # the shell and the session
        "HOSTNAME",
        "HOST",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "DISPLAY",
        "MAIL",
        "PS1",
        "PROMPT_COMMAND",
        "COLUMNS",
        "LINES",
        "LS_COLORS",
        # DeepSpeed's own choice of export file
        DS_ENV_FILE,
    }
    | ssh.NODE_LOCAL_VARS
)
#: Prefixes of per-node or per-task variables from schedulers, MPI and ssh.
UNSAFE_PREFIXES = (
    "BASH_FUNC_",
    "SLURM_",
    "SLURMD_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "HYDRA_",
    "LSB_",
    "PBS_",
    "FLUX_",
    "TORCHELASTIC_",
    "HOROVOD_",
    "SSH_",
    "XDG_",
    "PDSH_",
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: DeepSpeed 0.19 wraps a value in double quotes (without escaping) when it
#: has any character outside this set; see ``MultiNodeRunner.add_export``.
_DS_SAFE = re.compile(r"[\w@%+=:,./-]*\Z")


def is_exportable(name: str) -> bool:
    return (
        bool(_NAME.match(name)) and name not in UNSAFE_VARS and not name.startswith(UNSAFE_PREFIXES)
    )


def quote_value(value: str) -> str:
    """Escape ``value`` for the double quotes DeepSpeed puts around it.

    The export line becomes ``export K="<this>";`` in the remote shell
    whenever the value needs quoting, so ``\\``, ``"``, ``$`` and backquote
    are escaped; a value that needs no quoting is left as it is (and then
    DeepSpeed adds no quotes either, as it contains none of them).
    """
    if _DS_SAFE.match(value):
        return value
    return re.sub(r'([\\"$`])', r"\\\1", value)


def _unreadable_by_deepspeed(value: str) -> Optional[str]:
    if "\n" in value or "\r" in value:
        return "its value has a newline"
    if value != value.strip():
        return "DeepSpeed would strip the blanks around its value"
    return None


def env_file_content(environ: Mapping[str, str], warn: bool = True) -> str:
    """``KEY=VALUE`` lines for every exportable variable.

    Lines are what DeepSpeed can read back exactly: a value with a newline
    (one line per variable) or with leading or trailing blanks (DeepSpeed
    strips them) is dropped, with a warning when ``warn`` (the file is only
    read in the ssh mode, so only then is a dropped value worth a word).
    """
    lines = []
    for name in sorted(environ):
        if not is_exportable(name):
            continue
        value = environ[name]
        problem = _unreadable_by_deepspeed(value)
        if problem:
            if warn:
                logger.warning("det-launch: not exporting %s to other nodes: %s", name, problem)
            continue
        lines.append(f"{name}={quote_value(value)}\n")
    return "".join(lines)


def hostfile_content(info: ClusterInfo) -> str:
    return "".join(
        f"{addr} slots={n}\n" for addr, n in zip(info.container_addrs, info.container_slot_counts)
    )


@dataclasses.dataclass(frozen=True)
class DeepSpeedOptions:
    use_ssh: bool
    deepspeed_args: tuple[str, ...]


def parse_options(overrides: Sequence[str], environ: Mapping[str, str]) -> DeepSpeedOptions:
    """Our ``--ssh``/``--no-ssh`` (DeepSpeed's own ``--no_ssh`` means the
    same as ours) out of the overrides; the rest goes to ``deepspeed``."""
    use_ssh, rest = ssh.pop_mode_flags(overrides, environ)
    if "--no_ssh" in rest:
        use_ssh = False
        rest = [a for a in rest if a != "--no_ssh"]
    return DeepSpeedOptions(use_ssh=use_ssh, deepspeed_args=tuple(rest))


def _deepspeed(runtime: JobRuntime) -> list[str]:
    """The ``deepspeed`` console script is ``deepspeed.launcher.runner:main``;
    run it with the launcher's interpreter, which must be the job's."""
    return [runtime.python, "-m", "deepspeed.launcher.runner"]


def build_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    args: BackendArgs,
    facts: Optional[ssh.HostFacts] = None,
) -> LaunchPlan:
    """The plan for this node. ``facts`` defaults to this machine's."""
    facts = facts or ssh.HostFacts.current()
    opts = parse_options(args.overrides, facts.environ)
    env = worker_env(info, runtime)
    env[envvars.USE_DEEPSPEED] = "1"
    hostfile = os.path.join(runtime.job_dir, HOSTFILE_NAME)
    env_file = os.path.join(runtime.job_dir, ENV_FILE_NAME)
    env[DS_ENV_FILE] = env_file
    exported = {**facts.environ, **env}
    files = [
        FileToWrite(hostfile, hostfile_content(info)),
        FileToWrite(
            env_file, env_file_content(exported, warn=opts.use_ssh and not info.single_node)
        ),
    ]
    common = [
        "--hostfile",
        hostfile,
        "--master_port",
        str(runtime.master_port),
        "--no_python",
        "--no_local_rank",
    ]
    worker = [*wrap_rank_argv(runtime, "RANK"), *args.script]
    unset: tuple[str, ...] = ()
    if info.single_node:
        argv = [
            *_deepspeed(runtime),
            *common,
            "--master_addr",
            "127.0.0.1",
            "--no_ssh_check",
            "--num_gpus",
            str(info.slots_per_node),
            *opts.deepspeed_args,
            *worker,
        ]
    elif not opts.use_ssh:
        argv = [
            *_deepspeed(runtime),
            *common,
            "--no_ssh",
            "--node_rank",
            str(info.container_rank),
            "--master_addr",
            info.chief_ip,
            *opts.deepspeed_args,
            *worker,
        ]
    else:
        return _ssh_plan(info, runtime, facts, opts, env, files, common, args.script)
    return LaunchPlan(
        processes=(ProcessSpec(argv=tuple(argv), name="deepspeed", tool=True),),
        env=env,
        files=tuple(files),
        unset_env=unset,
        name="deepspeed",
        leftovers=shm_buffers(facts, runtime) if info.single_node else (),
    )


def shm_buffers(facts: ssh.HostFacts, runtime: JobRuntime) -> tuple[str, ...]:
    """DeepSpeed's CPU allreduce, used when every rank is on one node, maps
    a 69 MB ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
    per rank and never unlinks it (0.19.8): every job would leave them in
    memory for good. The name has this job's port, so the pattern matches no
    other job's buffers."""
    return (f"/dev/shm/deepspeed_allreduce_buffer_{facts.uid}_127.0.0.1_{runtime.master_port}_*",)


def _ssh_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    facts: ssh.HostFacts,
    opts: DeepSpeedOptions,
    env: dict[str, str],
    files: list[FileToWrite],
    common: Sequence[str],
    script: Sequence[str],
) -> LaunchPlan:
    """Every node runs sshd (pdsh reaches the chief over ssh too); the
    chief also runs ``deepspeed --launcher pdsh`` once all sshds answer."""
    ssh.require_real_secret(info, facts, "multi-node DeepSpeed")
    port = ssh.ssh_port(facts.environ)
    files = [*files, ssh.node_env_file(runtime, env), *ssh.sshd_files(info, runtime, facts, port)]
    procs = [ssh.sshd_process(info, runtime, facts, port)]
    if info.is_chief:
        files += ssh.client_files(info, runtime, facts, port)
        everyone = list(dict.fromkeys(ssh.endpoint(a, port) for a in info.container_addrs))
        argv = [
            *ssh.gate_argv(runtime, wait_ssh=everyone, timeout=ssh.connect_timeout(facts.environ)),
            *_deepspeed(runtime),
            *common,
            "--launcher",
            "pdsh",
            "--ssh_port",
            str(port),
            "--no_ssh_check",
            "--master_addr",
            info.chief_ip,
            *opts.deepspeed_args,
            *ssh.gate_argv(runtime, node_env=True),
            *wrap_rank_argv(runtime, "RANK"),
            *script,
        ]
        procs.append(ProcessSpec(argv=tuple(argv), name="deepspeed", tool=True))
    shared = {k: v for k, v in env.items() if k not in ssh.NODE_LOCAL_VARS}
    shared["PATH"] = ssh.client_path(runtime, facts.environ)
    return LaunchPlan(
        processes=tuple(procs),
        env=shared,
        files=tuple(files),
        unset_env=(envvars.DIST_SECRET,),
        name="deepspeed",
    )
