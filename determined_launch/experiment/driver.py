"""The search loop: take trials from the study, run them, tell the study.

A plain ``det-launch experiment`` and each ``--worker`` run this same loop;
they differ only in how many trials they run at once. Everything is decided
through the study, so any number of processes on any machines can share one
experiment: a trial number is handed out once by the storage, and a trial
is claimed by writing its owner into the study.

Resume: a trial left RUNNING by a process that died (same host and its pid
gone, or no heartbeat for ``LEASE`` seconds) is claimed again and rerun
with ``latest_checkpoint`` set, so it continues from its last checkpoint.
A failed trial is retried the same way by the next run of the experiment
(owners.py). Finished trials (complete, stopped by ASHA, invalid) are never rerun.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import signal
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, Callable, Optional

from determined_launch import exproot
from determined_launch.cluster.info import ClusterInfo
from determined_launch.core.trackers import end_abandoned
from determined_launch.errors import EXIT_PREEMPTED, LaunchError
from determined_launch.experiment import searchers as se
from determined_launch.experiment.expconf import ExperimentConfig
from determined_launch.experiment.owners import (  # noqa: F401  (ATTR_*, owner_alive: re-exported)
    ATTR_BEAT,
    ATTR_FAILED,
    ATTR_OWNER,
    ATTR_SLOT,
    HEARTBEAT,
    LEASE,
    claim,
    is_failed,
    mark_failed,
    owner_alive,
    owner_id,
    to_retry,
)
from determined_launch.experiment.report import stopped_line
from determined_launch.experiment.searchers import past_the_end  # noqa: F401  (re-exported)
from determined_launch.experiment.trial import (
    EXPERIMENT_ENV,  # noqa: F401  (re-exported: where the experiment's variables are kept)
    MetricError,
    TrialProcess,
    TrialSpec,
    launcher_argv,
    trial_env,
    trial_metric,
    write_private,
)
from determined_launch.values import plain

#: seconds between looks at the running trials (a stat of two files each)
POLL = 0.02


@dataclasses.dataclass
class DriverSetup:
    conf: ExperimentConfig
    exp_dir: pathlib.Path
    storage_url: Optional[str]
    info: ClusterInfo
    flags: Sequence[str]  # launcher flags for every trial
    command: str
    args: Sequence[str]
    concurrency: int
    checkpoint_storage: str
    #: CUDA_VISIBLE_DEVICES of each GPU group for trials at once (concurrency.py); [] none
    gpu_groups: Sequence[str] = ()
    on_event: Callable[[str], None] = print
    #: signals that preempt the experiment (the launcher's --preempt-signals; SIGINT too)
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)
    #: called before each start of a trial's launcher; its variables go to that launcher
    before_start: Optional[Callable[[TrialProcess], dict[str, str]]] = None



class Driver:
    def __init__(self, setup: DriverSetup) -> None:
        self.s = setup
        self.search = se.Search(setup.conf)
        storage = se.open_storage(setup.storage_url, str(setup.exp_dir / "study.journal"))
        try:
            self.study = se.load_study(storage, setup.conf.name, self.search)
        except LaunchError:
            raise
        except Exception as e:  # the storage answered but refused (permissions, schema)
            raise LaunchError(f"study storage {se.storage_label(setup.storage_url)}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                              ) from None
        self.optuna = se.require_optuna()
        self.owner = owner_id()
        self.root = exproot.Root.of(setup.exp_dir)
        self.experiment_id = self.root.ensure_experiment(setup.exp_dir)
        self.running: dict[int, tuple[Any, TrialProcess]] = {}
        self.restarts: dict[int, int] = {}
        #: how each trial's last run failed, when it failed without progress
        self._failed_as: dict[int, Optional[tuple[int, str]]] = {}
        self.stopping = 0  # number of stop signals received
        self.error: Optional[LaunchError] = None
        self._beat = time.monotonic()
        #: failed trials of an earlier run, retried before new ones (_claim_retry)
        self._retry = to_retry(self._trials(), time.time())
        self._retrying: dict[int, str] = {}  # number -> how it had failed
        self._gpus: dict[int, str] = {}  # number -> its GPU group (gpu_groups)

    # -- choosing the next trial -------------------------------------------------

    def _trials(self) -> list[Any]:
        return list(self.study.get_trials(deepcopy=False))

    def _excluded(self, t: Any) -> bool:
        # Surplus trials never run; invalid ones are replaced (except grid points).
        if t.user_attrs.get(se.ATTR_SURPLUS):
            return True
        return bool(t.user_attrs.get(se.ATTR_INVALID)) and not self.search.grid

    def _claim_abandoned(self) -> Optional[Any]:
        now = time.time()
        mine = set(self.running)
        for t in self._trials():
            if t.state.name != "RUNNING" or t.number in mine or t.user_attrs.get(se.ATTR_SURPLUS):
                continue
            if ATTR_SLOT not in t.user_attrs:
                self._drop_unborn(t, now)
                continue
            owner = str(t.user_attrs.get(ATTR_OWNER, ""))
            if t.user_attrs.get(ATTR_FAILED) or (
                    owner and owner_alive(owner, float(t.user_attrs.get(ATTR_BEAT, 0)), now)):
                continue  # a failed trial waits for a rerun (_claim_retry)
            trial = claim(self.study, self.optuna, t, self.owner)
            if trial is not None:
                self.s.on_event(f"trial {exproot.trial_id_of(t)}: resuming "
                                "(its last owner stopped)")
                return trial
        return None

    def _claim_retry(self) -> Optional[Any]:
        """A failed trial of an earlier run of the experiment (``owners.to_retry``),
        retried from its latest checkpoint with its ``max_restarts`` anew."""
        while self._retry:
            t = self.study._storage.get_trial(
                self.study._storage.get_trial_id_from_study_id_trial_number(
                    self.study._study_id, self._retry.pop(0)))
            if t.state.name != "RUNNING" or not t.user_attrs.get(ATTR_FAILED):
                continue
            trial = claim(self.study, self.optuna, t, self.owner)
            if trial is None:
                continue  # another rerun took it
            trial.set_user_attr(ATTR_FAILED, False)
            trial.set_user_attr(se.ATTR_RESTARTS, 0)
            self._retrying[t.number] = str(t.user_attrs.get(se.ATTR_ERROR) or "failed")
            return trial
        return None

    def _drop_unborn(self, t: Any, now: float) -> None:
        """A trial whose asker died before giving it a slot never ran: free its
        place (after ``LEASE``, so a live asker's new trial is left alone)."""
        started = t.datetime_start.timestamp() if t.datetime_start else now
        if now - started > LEASE:
            self.study._storage.set_trial_user_attr(t._trial_id, se.ATTR_SURPLUS, True)
            self.study.tell(t.number, state=self.optuna.trial.TrialState.FAIL)

    def _ask(self) -> Optional[Any]:
        trials = self._trials()
        slot_base = [t for t in trials if not self._excluded(t)]
        if len(slot_base) >= self.search.max_trials:
            return None
        trial = self.study.ask()
        before = [t for t in self._trials() if t.number < trial.number and not self._excluded(t)]
        slot = len(before)
        if slot >= self.search.max_trials:
            trial.set_user_attr(se.ATTR_SURPLUS, True)  # lost a race with another worker
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            return None
        # Owner first: a RUNNING trial with a slot and no owner reads as abandoned to the
        # other workers, so the slot (the "born" mark) is written last.
        trial.set_user_attr(ATTR_OWNER, self.owner)
        trial.set_user_attr(ATTR_BEAT, time.time())
        trial.set_user_attr(exproot.ATTR_TRIAL_ID,  # root-wide, as Determined numbers trials
                            self.root.new_trial_id(self.s.exp_dir, trial.number))
        trial.set_user_attr(ATTR_SLOT, slot)
        if self.search.brackets:
            trial.set_user_attr(se.ATTR_BRACKET, se.bracket_of(slot, self.search.per_bracket))
        for name, dist in self.search.distributions().items():
            se.suggest(trial, name, dist)
        searched = self.search.searched(trial.params)
        try:
            json.dumps(searched)
            trial.set_user_attr(se.ATTR_HPARAMS, searched)
        except (TypeError, ValueError):
            pass  # shown as Optuna's params instead
        return trial

    def next_trial(self) -> Optional[Any]:
        return self._claim_abandoned() or self._claim_retry() or self._ask()

    # -- running -----------------------------------------------------------------

    def _spec(self, trial: Any) -> TrialSpec:
        frozen = self.study._storage.get_trial(trial._trial_id)
        params = frozen.params
        seed = (self.s.conf.experiment_seed * 1_000_003 + trial.number) % 2**31
        return TrialSpec(number=trial.number, hparams=self.search.hparams(params), seed=seed,
                         experiment_id=self.experiment_id, global_id=exproot.trial_id_of(frozen),
                         max_length=self.s.conf.searcher.max_length)

    def _start(self, trial: Any) -> None:
        searcher = self.s.conf.searcher
        proc = TrialProcess(self._spec(trial), self.s.exp_dir, searcher.metric,
                            searcher.time_metric)
        proc.seen = dict(self.study._storage.get_trial(trial._trial_id).intermediate_values)
        env = trial_env(searcher)
        if self.s.gpu_groups:  # trials at once train on GPUs of their own
            used = [self._gpus.get(n) for n in self.running]
            group = min(self.s.gpu_groups, key=used.count)
            self._gpus[trial.number] = env["CUDA_VISIBLE_DEVICES"] = group
        if self.s.before_start is not None:  # a multi-node trial: its other nodes start too
            env.update(self.s.before_start(proc))
        proc.start(self.s.info, launcher_argv(self.s.flags, self.s.command, self.s.args),
                   env, self.s.checkpoint_storage)
        self.running[trial.number] = (trial, proc)
        failed = self._retrying.pop(trial.number, None)
        if failed is not None:
            self.s.on_event(f"trial {proc.spec.trial_id}: retrying (it failed: {failed}) "
                            + (f"from its latest checkpoint {proc.resumed_from}"
                               if proc.resumed_from else "from the start (no checkpoint)"))
        self.s.on_event(f"trial {proc.spec.trial_id}: started, hparams "
                        f"{json.dumps(proc.spec.hparams, sort_keys=True)}")

    def _observe(self, trial: Any, proc: TrialProcess) -> None:
        try:
            reports = proc.new_reports()
        except MetricError as e:
            if self.error is None:
                self.error = e
            proc.request_stop("error")
            return
        done = proc.seen  # steps already in the study (a resumed trial re-reads its files)
        for r in reports:
            if r.length in done or proc.stop_reason is not None:
                continue
            trial.report(r.value, r.length)
            done[r.length] = r.value
            if self._past_the_end(r.length):
                proc.request_stop("done")
            elif self.search.brackets and trial.should_prune():
                proc.request_stop("pruned")  # said when it has stopped (_finish)
                proc.stopped_at = r

    def _past_the_end(self, length: int) -> bool:
        return past_the_end(length, self.s.conf.searcher)

    def _finish(self, number: int, code: int) -> None:
        trial, proc = self.running.pop(number)
        self._observe(trial, proc)
        states = self.optuna.trial.TrialState
        tid = proc.spec.trial_id
        latest = self.study._storage.get_trial(trial._trial_id)
        if latest.state.name != "RUNNING" or latest.user_attrs.get(ATTR_OWNER) not in (
                self.owner, ""):
            # Another worker took the trial over (we missed heartbeats): its run counts.
            self.s.on_event(f"trial {tid}: taken over by another worker; this run is dropped")
            return
        # Determined's searcher metric of a trial: its best validation value
        value = trial_metric(proc.seen.values(), self.s.conf.searcher.smaller_is_better)
        reason = proc.stop_reason
        if reason == "pruned":
            self.study.tell(trial, state=states.PRUNED)
            self.s.on_event(stopped_line(proc, self.s.conf.searcher.metric))
            return
        if reason == "error":
            mark_failed(trial, str(self.error))
            return
        if reason == "driver" or (code == EXIT_PREEMPTED and reason is None):
            trial.set_user_attr(ATTR_OWNER, "")  # any worker may resume it now
            self.s.on_event(f"trial {tid}: preempted; resumable (rerun the same command)")
            if self.stopping == 0:
                self.stopping = 1  # someone preempted the trial's launcher: stop everything
            return
        if code == 0 and proc.invalid_hp():
            trial.set_user_attr(se.ATTR_INVALID, True)
            self.study.tell(trial, state=states.FAIL)
            self.s.on_event(f"trial {tid}: invalid hyperparameters (det.InvalidHP)")
            return
        if code in (0, EXIT_PREEMPTED) and reason in (None, "done"):
            if value is None:  # completed, as in Determined; nothing to rank it by
                trial.set_user_attr(se.ATTR_NO_METRIC, True)
                self.study.tell(trial, math.inf if self.s.conf.searcher.smaller_is_better
                                else -math.inf)
                self.s.on_event(f"trial {tid}: completed; warning: it reported no validation "
                                f"metric {self.s.conf.searcher.metric!r} (searcher.metric), so "
                                "the searcher cannot rank it")
                return
            self.study.tell(trial, value)
            self.s.on_event(f"trial {tid}: completed, {self.s.conf.searcher.metric}="
                            f"{plain(value)}")
            return
        # Counted in the study, as Determined counts them: a rerun of the experiment
        # continues the count instead of granting max_restarts again (and the WebUI shows it).
        restarts = self.restarts.get(number, int(trial.user_attrs.get(se.ATTR_RESTARTS, 0)))
        # The same failure again with no progress between (no report, no checkpoint): a
        # restart would fail the same way, so it is said once and the trial fails now.
        key = proc.failure_key(code)
        again = key is not None and self._failed_as.get(number) == key
        self._failed_as[number] = key
        ended = "\n".join(f"  | {line}" for line in proc.tail(8).splitlines())
        if again:
            self.s.on_event(f"trial {tid}: exit status {code} again, at the same point as before "
                            f"its restart (no report or checkpoint since): not restarting it; "
                            f"its output ({proc.log_path}) ended:\n{ended}")
        elif restarts < self.s.conf.max_restarts and self.stopping == 0:
            self.restarts[number] = restarts + 1
            trial.set_user_attr(se.ATTR_RESTARTS, restarts + 1)
            self.s.on_event(f"trial {tid}: exit status {code}; restart {restarts + 1} of "
                            f"{self.s.conf.max_restarts} from its last checkpoint; its output "
                            f"({proc.log_path}) ended:\n{ended}")
            self._start(trial)
            return
        else:
            self.s.on_event(f"trial {tid}: failed with exit status {code}; see {proc.log_path}"
                            f"\n{ended}")
        mark_failed(trial, f"exit status {code}" + (
            " (the same failure after a restart)" if again else ""))
        ended_run = end_abandoned(proc.run_dir)  # a killed trial's MLflow run says RUNNING
        if ended_run:
            self.s.on_event(f"trial {tid}: {ended_run}")

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._beat < HEARTBEAT:
            return
        self._beat = now
        for trial, _ in self.running.values():
            trial.set_user_attr(ATTR_BEAT, time.time())

    def _on_signal(self, signum: int, _frame: Optional[FrameType]) -> None:
        self.stopping += 1

    def run(self, tick: Callable[[], None] = lambda: None) -> int:
        """Run trials until the search is done; the experiment's exit status."""
        previous = {s: signal.signal(s, self._on_signal)
                    for s in {signal.SIGINT, *self.s.signals}}
        stopped_trials = False
        try:
            while True:
                if (self.stopping or self.error is not None) and not stopped_trials:
                    # Stopping, or an error that ends the experiment: the other running
                    # trials checkpoint and stay resumable, rather than run on unwatched.
                    stopped_trials = True
                    for _, proc in self.running.values():
                        if proc.stop_reason is None:
                            proc.request_stop("driver")
                if self.stopping > 1:
                    for _, proc in self.running.values():
                        proc.terminate()
                while (not self.stopping and self.error is None
                       and len(self.running) < self.s.concurrency):
                    trial = self.next_trial()
                    if trial is None:
                        break
                    self._start(trial)
                if not self.running:
                    break
                for number, (trial, proc) in list(self.running.items()):
                    code = proc.poll()
                    if code is None:
                        self._observe(trial, proc)
                    else:
                        self._finish(number, code)
                self._heartbeat()
                tick()
                time.sleep(POLL)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self.error is not None:
            raise self.error
        if self.stopping:
            return EXIT_PREEMPTED
        return 1 if self._failed() else 0

    def _failed(self) -> bool:
        """The experiment failed: a trial failed and none completed (the study's
        view, so a rerun that ran nothing new still says how the experiment ended)."""
        trials = self._trials()
        return (any(is_failed(t) for t in trials)
                and not any(t.state.name in ("COMPLETE", "PRUNED") for t in trials))


def write_experiment_file(exp_dir: pathlib.Path, conf: ExperimentConfig,
                          storage_url: Optional[str]) -> None:
    """What ``--status DIR`` needs to find the study (the storage without its password)."""
    record = {"name": conf.name, "config": str(conf.path.absolute()),
              "storage": se.storage_label(storage_url) if storage_url else None,
              "storage_has_password": se.storage_label(storage_url) != (storage_url or
                                                                        se.storage_label(None)),
              "searcher": dataclasses.asdict(conf.searcher)}
    write_private(exp_dir / "experiment.json", json.dumps(record, indent=1) + "\n")
