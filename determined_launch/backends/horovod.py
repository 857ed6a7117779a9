"""Horovod plans: horovodrun on one node; over ssh or ssh-free on several.

``python -m determined_launch.horovod [HVD_ARGS... --] SCRIPT...`` takes the
same arguments as Determined's ``determined.launch.horovod``. Four shapes:

* ``--autohorovod`` with one slot on one node: the script alone (Horovod
  would only add start-up time).
* one node: ``horovodrun -np S -H localhost:S`` (``--gloo`` when there is no
  ``mpirun``), each worker under ``wrap_rank HOROVOD_RANK,...``.
* several nodes, ``--ssh`` (or ``DET_LAUNCH_SSH=1``), as Determined does it:
  the other nodes run the job's sshd on ``DTRAIN_SSH_PORT``; the chief waits
  for each of them, then horovodrun reaches them with ``-H a:S,b:S``.
* several nodes, the default: no ssh at all. Every node's launcher starts its
  own workers with the variables horovodrun would have given them
  (``HOROVOD_RANK``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR``, ...), and the chief
  runs Horovod's own rendezvous server (``determined_launch.nodeexec.horovod_rendezvous``)
  where horovodrun would have. Ranks are laid out as horovodrun lays them out.
"""

from __future__ import annotations

import dataclasses
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
from determined_launch.errors import LaunchError

#: Where Horovod (or the MPI under it) puts a worker's rank.
RANK_VARS = "HOROVOD_RANK,OMPI_COMM_WORLD_RANK,PMI_RANK"

GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"

#: horovodrun flags the ssh-free mode understands, as the variables
#: horovodrun itself would set from them (horovod/runner/common/util/config_parser.py).
_FLAG_ENV = {
    "--gloo-timeout-seconds": GLOO_TIMEOUT_ENV,
    "--network-interface": "HOROVOD_GLOO_IFACE",
    "--network-interfaces": "HOROVOD_GLOO_IFACE",
    "--cycle-time-ms": "HOROVOD_CYCLE_TIME",
    "--cache-capacity": "HOROVOD_CACHE_CAPACITY",
    "--timeline-filename": "HOROVOD_TIMELINE",
    "--log-level": "HOROVOD_LOG_LEVEL",
    "--fusion-threshold-mb": "HOROVOD_FUSION_THRESHOLD",  # converted to bytes
}


@dataclasses.dataclass(frozen=True)
class HorovodOptions:
    autohorovod: bool
    use_ssh: bool
    horovodrun_args: tuple[str, ...]


def parse_options(overrides: Sequence[str], environ: Mapping[str, str]) -> HorovodOptions:
    use_ssh, rest = ssh.pop_mode_flags(overrides, environ)
    autohorovod = "--autohorovod" in rest
    return HorovodOptions(
        autohorovod=autohorovod,
        use_ssh=use_ssh,
        horovodrun_args=tuple(a for a in rest if a != "--autohorovod"),
    )


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker as horovodrun would place it (``hosts.get_host_assignments``)."""

    node: int
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def slot_assignments(slot_counts: Sequence[int]) -> list[Slot]:
    """Ranks node by node; ``cross_*`` count the nodes that have that local rank."""
    size = sum(slot_counts)
    slots = []
    rank = 0
    for node, count in enumerate(slot_counts):
        for local_rank in range(count):
            having = [n for n, c in enumerate(slot_counts) if c > local_rank]
            slots.append(
                Slot(
                    node=node,
                    rank=rank,
                    local_rank=local_rank,
                    cross_rank=having.index(node),
                    size=size,
                    local_size=count,
                    cross_size=len(having),
                )
            )
            rank += 1
    return slots


def host_names(info: ClusterInfo) -> list[str]:
    """``HOROVOD_HOSTNAME`` per node. Horovod keys each node's local group by
    it, so nodes that share an address (simulated nodes) get a suffix."""
    addrs = list(info.container_addrs)
    return [a if addrs.count(a) == 1 else f"{a}-node{i}" for i, a in enumerate(addrs)]


def flags_to_env(args: Sequence[str]) -> dict[str, str]:
    """horovodrun flags -> Horovod variables, for the ssh-free mode."""
    env: dict[str, str] = {}
    it = iter(args)
    for arg in it:
        flag, eq, value = arg.partition("=")
        name = _FLAG_ENV.get(flag)
        if name is None:
            raise LaunchError(
                f"horovodrun argument {arg!r} needs horovodrun, which the ssh-free multi-node "
                f"mode does not run; supported there: {', '.join(sorted(_FLAG_ENV))} (or set "
                "HOROVOD_* variables, or use --ssh)"
            )
        if not eq:
            value = next(it, "")
            if not value:
                raise LaunchError(f"horovodrun argument {flag} needs a value")
        if flag == "--fusion-threshold-mb":
            if not value.isdigit():
                raise LaunchError(f"{flag}: expected whole megabytes, got {value!r}")
            value = str(int(value) * 1024 * 1024)
        env[name] = value
    return env


def _horovodrun(runtime: JobRuntime, facts: ssh.HostFacts) -> list[str]:
    """horovodrun, run by the launcher's own interpreter (the console script
    ``horovodrun`` is ``horovod.runner.launch:run_commandline``)."""
    argv = [runtime.python, "-m", "determined_launch.nodeexec.horovodrun"]
    if not facts.mpirun:
        argv.append("--gloo")
    return argv


def _base_env(info: ClusterInfo, runtime: JobRuntime) -> dict[str, str]:
    env = worker_env(info, runtime)
    env[envvars.USE_HOROVOD] = "1"
    return env


def _worker_argv(runtime: JobRuntime, script: Sequence[str]) -> list[str]:
    """What horovodrun starts per rank: the gate restores node-local
    variables and the secret (kept off horovodrun's command lines)."""
    return [
        *ssh.gate_argv(runtime, node_env=True),
        *wrap_rank_argv(runtime, RANK_VARS),
        *script,
    ]


def _horovodrun_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    args: BackendArgs,
    facts: ssh.HostFacts,
    opts: HorovodOptions,
    hosts: Sequence[tuple[str, int]],
    extra_files: tuple[FileToWrite, ...] = (),
    extra_env: Optional[Mapping[str, str]] = None,
    wait_ssh: Sequence[str] = (),
    ssh_port: Optional[int] = None,
) -> LaunchPlan:
    """horovodrun on this node; its environment (which horovodrun copies
    onto every worker's command line) has no secret and no local paths."""
    full = _base_env(info, runtime)
    env = {k: v for k, v in full.items() if k not in ssh.NODE_LOCAL_VARS}
    env[ssh.NODE_ENV_FILE] = ssh.SshLayout(runtime.job_dir).node_env
    env.update(extra_env or {})
    total = sum(n for _, n in hosts)
    timeout = f"{ssh.connect_timeout(facts.environ):g}"
    argv = [
        *_horovodrun(runtime, facts),
        "-np",
        str(total),
        "-H",
        ",".join(f"{h}:{n}" for h, n in hosts),
        *(["-p", str(ssh_port)] if ssh_port else []),
        "--start-timeout",
        timeout,
        "--gloo-timeout-seconds",
        facts.environ.get(GLOO_TIMEOUT_ENV, timeout),
        *opts.horovodrun_args,
        *_worker_argv(runtime, args.script),
    ]
    if wait_ssh:
        argv = [
            *ssh.gate_argv(runtime, wait_ssh=wait_ssh, timeout=ssh.connect_timeout(facts.environ)),
            *argv,
        ]
    return LaunchPlan(
        processes=(ProcessSpec(argv=tuple(argv), name="horovodrun", tool=True),),
        env=env,
        files=(ssh.node_env_file(runtime, full), *extra_files),
        # As Determined does: with SLURM_JOBID set, OpenMPI (if horovodrun
        # picks MPI) ignores -H and starts every rank on this node.
        unset_env=(envvars.DIST_SECRET, "SLURM_JOBID"),
        name="horovod",
    )


def _ssh_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    args: BackendArgs,
    facts: ssh.HostFacts,
    opts: HorovodOptions,
) -> LaunchPlan:
    ssh.require_real_secret(info, facts, "multi-node Horovod")
    port = ssh.ssh_port(facts.environ)
    if not info.is_chief:
        # Workers arrive through sshd; the node-env file tells them where
        # this node's job directory is.
        return LaunchPlan(
            processes=(ssh.sshd_process(info, runtime, facts, port),),
            files=(
                ssh.node_env_file(runtime, _base_env(info, runtime)),
                *ssh.sshd_files(info, runtime, facts, port),
            ),
            name="horovod",
        )
    peers = [ssh.endpoint(a, port) for a in info.container_addrs[1:]]
    return _horovodrun_plan(
        info,
        runtime,
        args,
        facts,
        opts,
        hosts=list(zip(info.container_addrs, info.container_slot_counts)),
        extra_files=ssh.client_files(info, runtime, facts, port),
        extra_env={"PATH": ssh.client_path(runtime, facts.environ)},
        wait_ssh=list(dict.fromkeys(peers)),
        ssh_port=port,
    )


def rendezvous_argv(info: ClusterInfo, runtime: JobRuntime) -> list[str]:
    hosts = ",".join(f"{h}:{n}" for h, n in zip(host_names(info), info.container_slot_counts))
    return [
        runtime.python,
        "-m",
        "determined_launch.nodeexec.horovod_rendezvous",
        "--addr",
        info.chief_ip,
        "--port",
        str(runtime.master_port),
        "--hosts",
        hosts,
    ]


def _direct_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    args: BackendArgs,
    facts: ssh.HostFacts,
    opts: HorovodOptions,
) -> LaunchPlan:
    """No ssh, no horovodrun: this node's workers with horovodrun's variables."""
    timeout = ssh.connect_timeout(facts.environ)
    env = _base_env(info, runtime)
    env.update(
        {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": info.chief_ip,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(runtime.master_port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_HOSTNAME": host_names(info)[info.container_rank],
            "PYTHONUNBUFFERED": "1",
        }
    )
    # Rendezvous waits for every node: allow as long as the launchers do.
    env.setdefault(
        "HOROVOD_GLOO_TIMEOUT_SECONDS",
        facts.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", f"{timeout:g}"),
    )
    env.update(flags_to_env(opts.horovodrun_args))
    addr = info.container_addrs[info.container_rank]
    gate = ssh.gate_argv(
        runtime,
        wait_tcp=[ssh.endpoint(info.chief_ip, runtime.master_port)],
        timeout=timeout,
        gloo_iface_for=addr,
    )
    procs = []
    if info.is_chief:
        procs.append(
            ProcessSpec(
                argv=tuple(rendezvous_argv(info, runtime)),
                name="horovod rendezvous server",
                role="service",
            )
        )
    for slot in slot_assignments(info.container_slot_counts):
        if slot.node != info.container_rank:
            continue
        procs.append(
            ProcessSpec(
                argv=(*gate, *wrap_rank_argv(runtime, RANK_VARS), *args.script),
                name=f"rank {slot.rank}",
                env={
                    "HOROVOD_RANK": str(slot.rank),
                    "HOROVOD_SIZE": str(slot.size),
                    "HOROVOD_LOCAL_RANK": str(slot.local_rank),
                    "HOROVOD_LOCAL_SIZE": str(slot.local_size),
                    "HOROVOD_CROSS_RANK": str(slot.cross_rank),
                    "HOROVOD_CROSS_SIZE": str(slot.cross_size),
                },
            )
        )
    return LaunchPlan(processes=tuple(procs), env=env, name="horovod")


def build_plan(
    info: ClusterInfo,
    runtime: JobRuntime,
    args: BackendArgs,
    facts: Optional[ssh.HostFacts] = None,
) -> LaunchPlan:
    """The plan for this node. ``facts`` defaults to this machine's."""
    facts = facts or ssh.HostFacts.current()
    opts = parse_options(args.overrides, facts.environ)
    if opts.autohorovod and info.single_node and info.slots_per_node == 1:
        return LaunchPlan(
            processes=(
                ProcessSpec(argv=(*wrap_rank_argv(runtime, "0"), *args.script), name="rank 0"),
            ),
            env=_base_env(info, runtime),
            name="horovod",
        )
    if info.single_node:
        return _horovodrun_plan(
            info, runtime, args, facts, opts, hosts=[("localhost", info.slots_per_node)]
        )
    if opts.use_ssh:
        return _ssh_plan(info, runtime, args, facts, opts)
    return _direct_plan(info, runtime, args, facts, opts)
