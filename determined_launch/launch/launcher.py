"""Entry plumbing shared by every launcher: detect, then build, then supervise.

``main_for_backend`` is the whole life of a ``python -m determined_launch.X``
process. Everything impure that a plan depends on (the private job
directory, ports, the job secret) is decided here, once, into a
``JobRuntime``; the backend's builder stays a pure function of it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from determined_launch import envvars, expconf, rundir
from determined_launch.backends.per_slot import per_slot_plan
from determined_launch.backends.plan import BackendArgs, JobRuntime, LaunchPlan
from determined_launch.cluster.detect import detect
from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local import SLOTS_ENV
from determined_launch.cluster.local_trial import (
    CONFIG_ENV,
    LocalTrialOptions,
    complete,
    run_dir_for,
    searcher_env,
)
from determined_launch.cluster.torchrun_env import refuse_nested_launch
from determined_launch.core.storage import check_storage, commit_check, configured_storage
from determined_launch.core.trackers import check_trackers
from determined_launch.errors import EXIT_PREEMPTED, LaunchError
from determined_launch.launch import config, run_lease, usage
from determined_launch.launch.bucket_claims import job_name
from determined_launch.launch.claims import Claims
from determined_launch.launch.generations import Generation, run_generations
from determined_launch.launch.output_record import OutputRecord
from determined_launch.launch.restart_judge import check_min_nodes, restart_judge
from determined_launch.launch.runtime import (  # noqa: F401  (re-exported: tests and older imports)
    DEFAULT_C10D_PORT,
    _ports,
    check_ports_free,
    job_secret,
    make_runtime,
)
from determined_launch.supervisor import Supervisor, SupervisorConfig
from determined_launch.supervisor.restarts import Decision

__all__ = [
    "BackendArgs",
    "BuildPlan",
    "LauncherOptions",
    "launch_per_slot",
    "main_for_backend",
    "make_runtime",
    "split_overrides",
]

BuildPlan = Callable[[ClusterInfo, JobRuntime, BackendArgs], LaunchPlan]
#: the script of ``launch_per_slot`` (its command is the process's own)
PER_SLOT = ("<per-slot>",)


@dataclasses.dataclass(frozen=True)
class LauncherOptions:
    """Options of the launcher itself (not of torchrun & co.).

    Declared once in ``config.OPTIONS``: ``python -m determined_launch.X``
    reads them from the environment only, because its own arguments belong
    to the backend; ``det-launch`` also has flags for them.
    """

    detector: Optional[str] = None
    disabled_detectors: tuple[str, ...] = ()
    supervisor: SupervisorConfig = SupervisorConfig()
    dry_run: bool = False
    #: After an acknowledged preemption, ask SLURM to requeue the job.
    requeue: bool = False
    #: Slots on this node (``--slots``/``DET_LAUNCH_SLOTS``), for the detectors.
    slots: Optional[int] = None
    #: Map ``python3 -m determined.launch.X`` in workers to ours (``compat.py``).
    determined_compat: bool = True
    #: ``--hparams``, ``--config``, ``--fresh``: the local trial and resuming it.
    local_trial: LocalTrialOptions = LocalTrialOptions()
    #: ``--max-restarts``: restart every node's workers after a failure, this many times.
    max_restarts: int = 0
    #: ``--min-nodes``: after a node is lost, continue on the others while this many remain
    #: (``None``: every node, i.e. a lost node ends the job).
    min_nodes: Optional[int] = None
    #: ``--report-to``: the trackers the chief's ``core.init`` reports to (core/trackers/).
    report_to: tuple[str, ...] = ()
    #: ``--checkpoint-storage``: what every rank's ``core.init`` saves to (core/storage/).
    checkpoint_storage: Optional[str] = None
    #: The chief keeps what the job prints in ``<run_dir>/output.log`` (``--no-output-log``: not).
    output_log: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LauncherOptions:
        return cls.from_values(config.resolve(env))

    @classmethod
    def from_values(cls, v: Mapping[str, Any], **extra: Any) -> LauncherOptions:
        """From ``config.resolve``'s result (which has checked every value)."""
        return cls(
            supervisor=SupervisorConfig(
                preempt_grace=v["preempt_grace"],
                kill_after=v["kill_after"],
                preempt_signals=v["preempt_signals"],
                preempt_file=v["preempt_file"] or None,
                connect_timeout=v["connect_timeout"],
                verbose=v["verbose"],
                hang_timeout=v["hang_timeout"],
            ),
            detector=v["detector"],
            disabled_detectors=v["disabled_detectors"],
            dry_run=v["dry_run"],
            requeue=v["requeue"],
            slots=v["slots"],
            determined_compat=not v["no_determined_compat"],
            max_restarts=v["max_restarts"],
            min_nodes=v["min_nodes"],
            local_trial=LocalTrialOptions(
                hparams=v["hparams"] or None, config=v["config"] or None, fresh=v["fresh"]),
            report_to=v["report_to"],
            checkpoint_storage=v["checkpoint_storage"] or None,
            output_log=not v["no_output_log"],
            **extra,
        )


def split_overrides(argv: Sequence[str], usage: str) -> BackendArgs:
    """``[OVERRIDES... --] SCRIPT...``, as Determined's launchers take it."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        overrides, script = argv[:i], argv[i + 1 :]
    else:
        overrides, script = [], argv
    if not script:
        raise LaunchError(f"no command to run; usage: {usage}")
    return BackendArgs(overrides=tuple(overrides), script=tuple(script))


def detection_env(options: LauncherOptions, env: Mapping[str, str]) -> Mapping[str, str]:
    """What the detectors read: ``env`` plus ``--slots``. Only the detectors
    see the flag: launcher options never reach workers through ``os.environ``."""
    if options.slots is None:
        return env
    return {**env, SLOTS_ENV: str(options.slots)}


def config_slots(options: LauncherOptions) -> Optional[int]:
    """``--config``'s ``resources.slots_per_trial`` where ``--slots`` (or its
    variable) does not say; the config is checked here, before anything starts."""
    path = options.local_trial.config
    if options.slots is not None or not path:
        return None
    try:
        return expconf.load(path, trial=True).slots_per_trial
    except expconf.ConfigError as e:
        raise LaunchError(f"--config / {CONFIG_ENV}: {e}") from None


def detect_with_config_slots(options: LauncherOptions, env: Mapping[str, str]) -> ClusterInfo:
    """Detection, with ``--config``'s ``slots_per_trial`` as this node's slots on
    a single node. It counts the whole trial, so on several nodes the scheduler's
    slots per node stand (and the launcher says so)."""
    def found(o: LauncherOptions) -> ClusterInfo:
        return detect(detection_env(o, env), force=o.detector,
                      disable=o.disabled_detectors).info

    slots = config_slots(options)
    if slots is None:
        return found(options)
    info = found(dataclasses.replace(options, slots=slots))
    if info.single_node:
        return info
    info = found(options)
    _say(f"{options.local_trial.config}: resources.slots_per_trial {slots} not applied: this "
         f"job has {info.num_nodes} nodes, whose slots the scheduler decides "
         f"({sum(info.container_slot_counts)} in all)")
    return info


def run(
    build: BuildPlan,
    args: BackendArgs,
    options: LauncherOptions,
    env: Optional[Mapping[str, str]] = None,
) -> int:
    """Detect, build, supervise; return the exit status. Raises LaunchError."""
    env = os.environ if env is None else env
    if options.checkpoint_storage:  # the flag, for every reader here and (below) the workers
        env = {**env, envvars.CHECKPOINT_STORAGE: options.checkpoint_storage}
    info = detect_with_config_slots(options, env)
    refuse_nested_launch(info, env)
    command = sys.argv if args.script == PER_SLOT else args.script
    info = complete(info, env, options.local_trial, say=_say,
                    is_committed=commit_check(env, info.checkpoint_storage), command=command)
    # The run directory is decided once, here (rundir.py), for every rank and generation.
    run_dir = run_dir_for(info.trial, env, command) if info.trial is not None else None
    if run_dir is not None:
        env = {**env, envvars.RUN_DIR: str(run_dir)}
    # A storage mistake (missing extra, bad block, no such bucket) is one line here,
    # before any worker starts, not a traceback from every rank; the chief probes.
    check_storage(configured_storage(env, info.checkpoint_storage), probe=info.is_chief)
    # --config's searcher metric and unit, as det-launch experiment hands them to trials
    extra_env = searcher_env(options.local_trial, env)
    if options.local_trial.config:  # the workers' pytorch context.config_data reads its data:
        extra_env.setdefault(CONFIG_ENV, os.path.abspath(options.local_trial.config))
    if run_dir is not None:
        extra_env[envvars.RUN_DIR] = str(run_dir)
    if options.checkpoint_storage:
        extra_env[envvars.CHECKPOINT_STORAGE] = options.checkpoint_storage
    if options.report_to:  # a missing package is one line here, before any worker starts
        check_trackers(options.report_to)
        extra_env[envvars.REPORT_TO] = ",".join(options.report_to)
    check_min_nodes(options.min_nodes, options.max_restarts, info)
    judge = None if options.dry_run else restart_judge(
        options.max_restarts, info, env, commit_check(env, info.checkpoint_storage),
        options.min_nodes)

    def one(gen: Generation) -> tuple[int, Decision, frozenset[int]]:
        return _generation(build, args, env, options, extra_env, gen)

    # --min-nodes: nodes may continue without others; claims (signed with the job's key)
    # keep that to one group. One node has no others (and its secret is its own process's).
    # With S3 checkpoint storage they live in its bucket: node-local run directories suffice.
    claims = Claims.open(
        run_dir_for(info.trial, env), job_secret(info, env), info.num_nodes,
        configured_storage(env, info.checkpoint_storage),
        job_name(info.trial.trial_id, info.trial.experiment_id)) if (
        judge is not None and options.min_nodes is not None and info.trial is not None
        and info.num_nodes > 1) else None
    sup = options.supervisor  # a rejoining node waits for the job's next checkpoint
    join_timeout = sup.connect_timeout + sup.preempt_grace + sup.kill_after
    lease = None if options.dry_run or run_dir is None else run_lease.Lease(
        run_dir, run_lease.job_key(env.get(envvars.DIST_SECRET) or info.job_secret, env,
                                (info.container_addrs, info.container_slot_counts),
                                info.single_node), rundir.show(command))
    try:
        if lease is not None:  # one live job per run directory; its nodes share it
            lease.acquire()
            if info.is_chief:
                rundir.record_command(lease.run_dir, rundir.command_of(command))
                rundir.record_exit(lease.run_dir, None, time.time())
    except run_lease.LeaseHeld as e:
        raise LaunchError(str(e)) from None
    # The chief keeps the run's output beside its records: a crash's own traceback.
    record = OutputRecord.start(lease.run_dir) if (
        lease is not None and info.is_chief and options.output_log) else None
    try:
        status, info = run_generations(info, judge, one, claims, join_timeout)
        if lease is not None and info.is_chief:  # the WebUI tells a crashed run from an idle one
            rundir.record_exit(lease.run_dir, status, time.time())
    finally:
        if record is not None:
            record.stop()
        if lease is not None:
            lease.release(remove=info.is_chief)
    if status == EXIT_PREEMPTED and options.requeue and info.is_chief:
        requeue_slurm_job(env)
    return status


def _generation(
    build: BuildPlan, args: BackendArgs, env: Mapping[str, str], options: LauncherOptions,
    extra_env: Mapping[str, str], gen: Generation,
) -> tuple[int, Decision, frozenset[int]]:
    """One start of this node's workers, in its own job directory with its own
    secret: (exit status, whether the job restarts, the signals it kept
    pending for the next generation)."""
    info = gen.info
    runtime = make_runtime(info, env, options.determined_compat, gen.number, gen.members)
    try:
        plan = build(info, runtime, args)
        if extra_env:
            plan = dataclasses.replace(plan, env={**extra_env, **plan.env})
        if options.dry_run:
            print(plan.render())
            return 0, Decision(False), gen.deferred
        if gen.number == 0 and (env.get(envvars.C10D_PORT) or not info.single_node):
            check_ports_free(info, runtime)
        supervisor = Supervisor(plan, info, runtime, options.supervisor, restarts=gen.judge,
                                deferred=gen.deferred, members=gen.members,
                                joining=gen.joining, superseded=gen.superseded)
        return supervisor.run(), supervisor.decision, supervisor.deferred
    finally:
        shutil.rmtree(runtime.job_dir, ignore_errors=True)


def _say(message: str) -> None:
    print(f"det-launch: {message}", file=sys.stderr, flush=True)


def requeue_slurm_job(env: Mapping[str, str]) -> bool:
    """``scontrol requeue $SLURM_JOB_ID``, once, from the chief, as the very
    last action: requeueing ends the job's remaining steps, and the rerun
    resumes from the checkpoint the workers saved before acknowledging."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        print("det-launch: --requeue: not in a SLURM job (SLURM_JOB_ID unset); not requeued",
              file=sys.stderr)
        return False
    # Said first: the requeue ends this step, and SLURM may stop us before
    # scontrol even returns.
    print(f"det-launch: requeueing SLURM job {job_id}", file=sys.stderr, flush=True)
    try:
        result = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"det-launch: --requeue: scontrol requeue {job_id} failed: {e}", file=sys.stderr)
        return False
    if result.returncode != 0:
        why = (result.stderr or result.stdout).strip().splitlines()
        print(f"det-launch: --requeue: scontrol requeue {job_id} failed: "
              f"{why[-1] if why else result.returncode}", file=sys.stderr)
        return False
    return True


def report_errors(fn: Callable[[], int]) -> int:
    """Turn ``LaunchError`` into one line on stderr and its exit status."""
    try:
        return fn()
    except LaunchError as e:
        print(f"det-launch: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    except KeyboardInterrupt:
        return 130


def main_for_backend(
    backend: str,
    build: BuildPlan,
    argv: Optional[Sequence[str]] = None,
    options: Optional[LauncherOptions] = None,
) -> int:
    """The whole life of ``python -m determined_launch.<backend>``."""
    argv = sys.argv[1:] if argv is None else argv
    if usage.wants_help(argv):  # before anything is detected or started
        print(usage.backend_help(backend), end="")
        return 0

    def go() -> int:
        misplaced = usage.misplaced_option(backend, argv)
        if misplaced:
            raise LaunchError(misplaced)
        args = split_overrides(argv, usage.backend_help(backend).splitlines()[0][7:])
        return run(build, args, options or LauncherOptions.from_env(os.environ))

    return report_errors(go)


def launch_per_slot(
    worker_argv: Callable[[int, int], Sequence[str]],
    *,
    options: Optional[LauncherOptions] = None,
) -> int:
    """Start one worker per slot on this node, wrapped in wrap_rank, and
    supervise them; return the job's exit status.

    This is the seed tutorial's hand-written ``launcher_main()`` with the
    parts that are easy to get wrong done for you: the first failure stops
    the other workers (TERM, then KILL), failures on other nodes stop this
    one, and the summary names the rank that failed first::

        def launcher_main():
            return det.launch_per_slot(
                lambda rank, local_rank: [sys.executable, __file__, "worker"]
            )

    ``worker_argv(rank, local_rank)`` gives each worker's command; workers
    also find ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``CROSS_RANK`` and ``CROSS_SIZE`` in their environment.
    """

    def build(info: ClusterInfo, runtime: JobRuntime, _args: BackendArgs) -> LaunchPlan:
        return per_slot_plan(info, runtime, worker_argv)

    opts = options or LauncherOptions.from_env(os.environ)
    return report_errors(lambda: run(build, BackendArgs((), PER_SLOT), opts))
