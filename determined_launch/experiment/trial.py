"""One trial: an ordinary launcher job, watched through its run directory.

The launcher is not changed for trials. The driver gives each trial:

* a cluster info file (0600): the cluster the driver detected, plus the
  ``trial`` block (``trial_id``, ``experiment_id``, ``hparams``, ``trial_seed``,
  ``max_length``) and ``latest_checkpoint`` when the trial ran before, so a
  resumed or restarted trial continues from its last checkpoint;
* ``DET_RUN_DIR`` (its own run directory, where the chief writes metrics),
  ``DET_CHECKPOINT_STORAGE`` (the experiment's storage), and
  ``DET_PREEMPT_FILE``: creating that file is how the searcher stops a trial
  (synchronized preemption: every rank stops on the same step, checkpoints,
  and the launcher exits 75).

The driver follows ``validation.jsonl`` and ``searcher.jsonl`` as the chief
appends them; each line is one report, so the files are read incrementally.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, Optional

from determined_launch import envvars, rundir
from determined_launch.cluster.info import ClusterInfo, TrialInfo
from determined_launch.core._rundir import STOP_REASON, write_atomically
from determined_launch.errors import LaunchError
from determined_launch.experiment.expconf import SearcherConfig

#: the experiment's options' variables (experiment/cli.py), never passed to trials
EXPERIMENT_ENV = ("DET_EXPERIMENT_DIR", "DET_STUDY_STORAGE", "DET_EXPERIMENT_WORKER",
                  "DET_EXPERIMENT_CONCURRENCY")
#: the chief's early-exit record (``core_context.train.report_early_exit``)
EARLY_EXIT_FILE = "early_exit.json"
INVALID_HP_REASONS = ("EXITED_REASON_INVALID_HP", "INVALID_HP")


class MetricError(LaunchError):
    """A trial reported validation metrics that the searcher cannot use."""


@dataclasses.dataclass(frozen=True)
class Report:
    """One searcher observation: the metric at a length."""

    length: int
    value: float


def private_dir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_private(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` atomically with a 0600 file (workers may write at once)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def latest_checkpoint(run_dir: pathlib.Path,
                      checkpoint_storage: Optional[str] = None) -> Optional[str]:
    """The newest checkpoint this trial's run directory committed, if any, by
    the run directory's one rule (``rundir.newest_committed``; the commit
    marker is looked for where ``checkpoint_storage`` says)."""
    from determined_launch.core.storage import commit_check

    trust = rundir.trusting(run_dir)
    check = trust
    if checkpoint_storage and os.path.isdir(checkpoint_storage):
        check = rundir.directory_committed(pathlib.Path(checkpoint_storage))
    elif checkpoint_storage:
        check = commit_check(os.environ, checkpoint_storage)
    try:
        return rundir.newest_committed(run_dir, rundir.Identity(), check).storage_id
    except Exception:  # storage unreachable here: the trial's own launcher reports it
        return rundir.newest_committed(run_dir, rundir.Identity(), trust).storage_id


def trial_metric(values: Iterable[float], smaller_is_better: bool) -> Optional[float]:
    """A trial's searcher metric, Determined's definition: the best of its
    validation values by ``smaller_is_better`` (NaN never counts). The table,
    the completion lines, ``best_trial.json`` and the study all use this."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return None
    return min(finite) if smaller_is_better else max(finite)


class _Follower:
    """New complete lines of a JSON-lines file, from where the last read ended."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._offset = 0

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for its newline
        self._offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


@dataclasses.dataclass
class TrialSpec:
    number: int  # Optuna's trial number
    hparams: Mapping[str, Any]
    seed: int
    experiment_id: int
    max_length: Optional[int]
    #: the root-wide trial id (experiment/root.py); None: number + 1 (trials from before)
    global_id: Optional[int] = None

    @property
    def trial_id(self) -> int:
        return self.global_id or self.number + 1


#: ``TrialProcess.start``'s default: resume from what the trial's run directory committed
FROM_RUN_DIR = "<the run directory's latest checkpoint>"


class TrialProcess:
    """A running trial's launcher and what it reported so far.

    ``node`` > 0: that node's launcher of a multi-node trial (experiment/gang.py),
    in a directory of its own below the trial's, so that nothing it writes (its
    cluster info, output, stale-file cleanup) touches the chief's files on a
    shared file system."""

    def __init__(self, spec: TrialSpec, exp_dir: pathlib.Path, metric: str,
                 time_metric: Optional[str], node: int = 0) -> None:
        self.spec = spec
        self.dir = private_dir(private_dir(exp_dir / "trials") / str(spec.trial_id))
        if node:
            self.dir = private_dir(self.dir / f"node{node}")
        self.run_dir = self.dir  # the chief's run directory is the trial's directory
        self.preempt_file = self.dir / "preempt"
        self.log_path = self.dir / rundir.OUTPUT_FILE
        self._metric = metric
        self._time_metric = time_metric
        self._followers = [_Follower(self.dir / "validation.jsonl"),
                           _Follower(self.dir / "searcher.jsonl")]
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None
        self.stop_reason: Optional[str] = None
        #: the report at which the searcher stopped it (ASHA)
        self.stopped_at: Optional[Report] = None
        self.reports: list[Report] = []
        #: length -> value of every observation already told to the study
        self.seen: dict[int, float] = {}
        self.started = 0.0
        #: the checkpoint this run resumed from
        self.resumed_from: Optional[str] = None
        self._log_start = 0

    def start(self, info: ClusterInfo, argv: Sequence[str], env: Mapping[str, str],
              checkpoint_storage: str, resume: Optional[str] = FROM_RUN_DIR) -> None:
        """Write the cluster info file and start the launcher (``resume``: the
        checkpoint to continue from, which a multi-node trial's chief names)."""
        for stale in (self.preempt_file, self.dir / f"{STOP_REASON}.json"):
            try:
                stale.unlink()  # a stop request of an earlier run is not for this one
            except FileNotFoundError:
                pass
        trial = TrialInfo(trial_id=self.spec.trial_id, hparams=dict(self.spec.hparams),
                          trial_seed=self.spec.seed, experiment_id=self.spec.experiment_id,
                          max_length=self.spec.max_length)
        resumed = self.resumed_from = (latest_checkpoint(self.run_dir, checkpoint_storage)
                                       if resume == FROM_RUN_DIR
                                       else resume)
        info = dataclasses.replace(info, trial=trial, latest_checkpoint=resumed)
        info_file = self.dir / "cluster_info.json"
        write_private(info_file, json.dumps(info.to_file_dict(), indent=1) + "\n")
        child_env = dict(env)
        child_env.update({
            envvars.CLUSTER_INFO_FILE: str(info_file),
            envvars.RUN_DIR: str(self.run_dir),
            envvars.CHECKPOINT_STORAGE: checkpoint_storage,
            envvars.PREEMPT_FILE: str(self.preempt_file),
        })
        if info.job_secret:
            child_env.setdefault(envvars.DIST_SECRET, info.job_secret)
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()  # this run's output starts here (restarts append)
        self.started = time.monotonic()
        # Its own session: a Ctrl-C or scheduler signal reaches the driver, which
        # stops every trial through preemption instead of each trial dying alone.
        self.proc = subprocess.Popen(list(argv), env=child_env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_term_with_parent)

    def new_reports(self) -> list[Report]:
        """Searcher observations appended since the last call."""
        out: list[Report] = []
        validation, searcher = self._followers
        for record in validation.new_records():
            out.append(self._from_validation(record))
        for record in searcher.new_records():
            value = record.get("searcher_metric")
            length = record.get("length")
            if isinstance(value, (int, float)) and isinstance(length, int):
                out.append(Report(length, float(value)))
        self.reports.extend(out)
        return out

    def _from_validation(self, record: Mapping[str, Any]) -> Report:
        metrics = record.get("metrics")
        metrics = metrics if isinstance(metrics, dict) else {}
        where = f"trial {self.spec.trial_id} ({self.dir / 'validation.jsonl'})"
        if self._metric not in metrics:
            names = ", ".join(sorted(map(str, metrics))) or "none"
            raise MetricError(f"{where}: searcher.metric {self._metric!r} is not among the "
                              f"reported validation metrics ({names})")
        value = metrics[self._metric]
        if not _is_number(value):
            raise MetricError(f"{where}: searcher.metric {self._metric!r} is {value!r}, "
                              "not a number")
        if self._time_metric is not None:
            length = metrics.get(self._time_metric)
            if not _is_number(length):
                raise MetricError(f"{where}: searcher.time_metric {self._time_metric!r} is "
                                  "not among the reported validation metrics")
        else:
            length = record.get("steps_completed")
            if not _is_number(length):
                raise MetricError(f"{where}: a validation report without steps_completed")
        return Report(int(length), float(value))  # type: ignore[arg-type]

    def request_stop(self, reason: str) -> None:
        """Preempt the trial (idempotent): all ranks stop on one step and checkpoint.
        The reason goes first (its trackers end the run as "stopped (ASHA)", not
        "preempted")."""
        if self.stop_reason is None:
            self.stop_reason = reason
            write_atomically(self.dir / f"{STOP_REASON}.json", json.dumps({"reason": reason}))
        self.preempt_file.touch()

    def poll(self) -> Optional[int]:
        assert self.proc is not None  # noqa: S101 (start() comes first)
        code = self.proc.poll()
        if code is not None and self._log is not None:
            self._log.close()
            self._log = None
        return code

    def terminate(self) -> None:
        """Second Ctrl-C: TERM the launcher's session (it stops its workers)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def invalid_hp(self) -> bool:
        try:
            data = json.loads((self.run_dir / EARLY_EXIT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("reason") in INVALID_HP_REASONS

    def tail(self, lines: int = 5) -> str:
        """How this run's output ended (not the runs before a restart): from the
        genuine first failure when the launcher named one (``failure_tail``)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_start, f.seek(0, 2) - TAIL_BYTES))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return failure_tail(text, lines)

    def failure_key(self, code: int) -> Optional[tuple[int, str]]:
        """What identifies this run's failure when it made no progress (no new
        report, no new checkpoint): its exit status and how its output ended,
        numbers masked (process ids, times, addresses). ``None`` after progress:
        a restart may then get further."""
        if self.reports or latest_checkpoint(self.run_dir) != self.resumed_from:
            return None
        return code, re.sub(r"\d+", "#", self.tail())


#: how much of a run's output is read for its tail (a log may be gigabytes)
TAIL_BYTES = 1 << 20
#: the launcher's summary of a failed job names the rank that failed first
_FIRST_FAILURE = re.compile(r"det-launch: job failed: rank (\d+) on node \d+ ")


def failure_tail(text: str, lines: int) -> str:
    """The last ``lines`` of a run's output, from its genuine first failure: when
    the launcher's summary names the rank that failed first, that rank's last
    lines and the summary, not the other ranks' teardown that followed ("lost the
    connection to rank 0"). Its lines are the ``[rank=N] `` ones of this log (a
    rank of another node of a multi-node trial writes elsewhere: then the last
    lines, as without a summary)."""
    all_lines = text.rstrip().splitlines()
    for summary in reversed(all_lines[-50:]):  # the summary is among the launcher's last lines
        m = _FIRST_FAILURE.match(summary)
        if m is None:
            continue
        own = [line for line in all_lines if line.startswith(f"[rank={m.group(1)}] ")]
        if own:
            return "\n".join([*own[-(lines - 1):], summary] if lines > 1 else [summary])
        break
    return "\n".join(all_lines[-lines:])


def _term_with_parent() -> None:
    """In the child before exec: TERM when the driver dies (Linux), so a
    killed worker's trial is preempted (checkpoint, exit 75) rather than left
    running beside the worker that will resume it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def launcher_argv(flags: Sequence[str], command: str, args: Sequence[str]) -> list[str]:
    """``python -m determined_launch.cli [FLAGS] --detector file COMMAND ARGS``:
    the trial's cluster comes from the file the driver wrote, never from a
    second detection that could disagree with it."""
    return [sys.executable, "-m", "determined_launch.cli", *flags, "--detector", "file",
            command, *args]


def trial_env(searcher: SearcherConfig) -> dict[str, str]:
    """Every trial launcher's environment (on each node of a multi-node trial)."""
    # The experiment's own variables stay here: the study URL may carry a password.
    env = {k: v for k, v in os.environ.items() if k not in EXPERIMENT_ENV}
    env.pop(envvars.SEARCHER_UNIT, None)
    if searcher.unit is not None:
        env[envvars.SEARCHER_UNIT] = searcher.unit.upper()
    # save_trial_best / save_experiment_best retention keeps the best by the searcher's metric
    env[envvars.SEARCHER_METRIC] = searcher.metric
    env[envvars.SMALLER_IS_BETTER] = "true" if searcher.smaller_is_better else "false"
    return env
