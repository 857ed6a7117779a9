"""Determined's searchers on Optuna: the study, its samplers and ASHA's pruner.

The study is the one shared truth of an experiment: drivers and ``--worker``
processes on other machines all take trials from it, so everything a later
process needs (a trial's bracket, whether it was stopped by ASHA or raised
``InvalidHP``) is kept in it as trial attributes, never in a process.

Mapping (see docs/search.md):

* ``grid``: Determined's grid points (hparams.grid_values), handed out by
  trial number. Optuna's ``GridSampler`` picks a random unvisited point, which
  two workers asking at once can both pick; numbering cannot collide.
* ``random`` / ``single``: Optuna's ``RandomSampler``, seeded per trial from
  ``reproducibility.experiment_seed`` and the trial number, so workers never
  draw the same sequence and a rerun draws the same hparams.
* ``adaptive_asha`` / ``async_halving``: random sampling plus Optuna's
  ``SuccessiveHalvingPruner`` per bracket, with Determined's brackets (``mode``,
  ``max_rungs``, ``bracket_rungs``), trials per bracket and rungs
  (``max_length / divisor**k``). Its promotion rule is Determined's stop-once
  ASHA: continue while in the top ``max(1, n // divisor)`` of a rung.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from determined_launch import hparams as hp
from determined_launch.errors import LaunchError
from determined_launch.experiment import journal
from determined_launch.experiment.expconf import ExperimentConfig, SearcherConfig

if TYPE_CHECKING:
    import optuna

#: user attributes kept on each Optuna trial
ATTR_BRACKET = "det_bracket"
ATTR_SURPLUS = "det_surplus"  # asked beyond max_trials by a racing worker; never run
ATTR_INVALID = "det_invalid_hp"
ATTR_ERROR = "det_error"
ATTR_RESTARTS = "det_restarts"  # failures restarted from the last checkpoint (max_restarts)
ATTR_HPARAMS = "det_hparams"  # the searched values (dotted paths), for tables and plots
ATTR_NO_METRIC = "det_no_metric"  # completed without reporting searcher.metric (worst value)
_PRIMITIVE = (type(None), bool, int, float, str)


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise LaunchError("det-launch experiment needs Optuna: "
                          "pip install 'determined_launch[search]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def brackets(s: SearcherConfig, max_trials: int) -> list[int]:
    """Rungs per bracket, most early stopping first (Determined's adaptive ASHA)."""
    if s.name not in ("adaptive_asha", "async_halving"):
        return []
    if s.bracket_rungs:
        return sorted(s.bracket_rungs, reverse=True)
    assert s.max_length is not None  # noqa: S101 (expconf requires it for ASHA)
    rungs = s.max_rungs
    if s.name == "adaptive_asha":
        rungs = min(rungs, int(math.log(s.max_length) / math.log(s.divisor)) + 1,
                    int(math.log(max_trials) / math.log(s.divisor)) + 1)
        rungs = max(rungs, 1)
    if s.mode == "aggressive":
        out = [rungs]
    elif s.mode == "standard":
        out = list(range((rungs - 1) // 2 + 1, rungs + 1))
    else:
        out = list(range(1, rungs + 1))
    return sorted(out, reverse=True)


def bracket_trials(max_trials: int, divisor: float, rungs: Sequence[int]) -> list[int]:
    """Trials per bracket, for about equal training budget per bracket."""
    weights = [divisor ** (n - 1) / n for n in rungs]
    total = sum(weights)
    out = [max(int(w / total * max_trials), 1) for w in weights]
    out[0] += max(max_trials - sum(out), 0)
    return out


def bracket_of(slot: int, per_bracket: Sequence[int]) -> int:
    """Which bracket the ``slot``-th trial belongs to: brackets interleaved in
    proportion to their sizes, so early trials already cover every bracket."""
    total = sum(per_bracket)
    slot %= max(total, 1)
    given = [0] * len(per_bracket)
    for i in range(slot + 1):
        # the bracket furthest behind its share of the first i+1 trials
        b = max(range(len(per_bracket)),
                key=lambda k: (per_bracket[k] * (i + 1) / total - given[k], -k))
        given[b] += 1
        if i == slot:
            return b
    return 0


def rung_lengths(num_rungs: int, divisor: float, max_length: int) -> list[int]:
    return [max(int(max_length / divisor ** (num_rungs - i - 1)), 1) for i in range(num_rungs)]


class Search:
    """What one experiment's searcher decides: hparams of a new trial, and
    whether a reported metric stops a trial."""

    def __init__(self, conf: ExperimentConfig) -> None:
        self.conf = conf
        s = conf.searcher
        self.leaves = [(p, spec) for p, spec in hp.leaves(conf.space)
                       if not isinstance(spec, hp.Const)]
        self.grid: list[dict[str, Any]] = []
        if s.name == "grid":
            self.grid = _grid(self.leaves)
        self.max_trials = len(self.grid) if s.name == "grid" else s.max_trials
        self.brackets = brackets(s, self.max_trials)
        self.per_bracket = bracket_trials(self.max_trials, s.divisor, self.brackets) \
            if self.brackets else []
        if self.brackets and s.divisor != int(s.divisor):
            raise LaunchError(f"{conf.path}: searcher.divisor: Optuna's successive halving "
                              f"needs an integer divisor, got {s.divisor}")

    @property
    def direction(self) -> str:
        return "minimize" if self.conf.searcher.smaller_is_better else "maximize"

    def sampler(self) -> Any:
        optuna = require_optuna()
        return _sampler_class(optuna)(self)

    def pruner(self) -> Any:
        optuna = require_optuna()
        if not self.brackets:
            return optuna.pruners.NopPruner()
        return _pruner_class(optuna)(self)

    def distributions(self) -> dict[str, Any]:
        optuna = require_optuna()
        d = optuna.distributions
        out: dict[str, Any] = {}
        for path, spec in self.leaves:
            if self.grid:
                out[path] = d.CategoricalDistribution(list(range(len(self.grid))))
            elif isinstance(spec, hp.Int):
                out[path] = d.IntDistribution(spec.minval, spec.maxval)
            elif isinstance(spec, hp.Double):
                out[path] = d.FloatDistribution(spec.minval, spec.maxval)
            elif isinstance(spec, hp.Log):
                out[path] = d.FloatDistribution(spec.base ** spec.minval,
                                                spec.base ** spec.maxval, log=True)
            elif isinstance(spec, hp.Categorical):
                out[path] = d.CategoricalDistribution(_choices(spec.vals))
        return out

    def hparams(self, params: dict[str, Any]) -> dict[str, Any]:
        """The trial's nested hparams from Optuna's flat params."""
        return hp.build(self.conf.space, self.searched(params))

    def searched(self, params: dict[str, Any]) -> dict[str, Any]:
        """The searched leaves' values by dotted path, from Optuna's params."""
        values: dict[str, Any] = {}
        for path, spec in self.leaves:
            raw = params[path]
            if self.grid:
                values[path] = self.grid[int(raw)][path]
            elif isinstance(spec, hp.Categorical) and _choices(spec.vals) != list(spec.vals):
                values[path] = spec.vals[int(raw)]
            else:
                values[path] = raw
        return values

    def rungs(self, bracket: int) -> list[int]:
        assert self.conf.searcher.max_length is not None  # noqa: S101
        return rung_lengths(self.brackets[bracket], self.conf.searcher.divisor,
                            self.conf.searcher.max_length)


def _choices(vals: Sequence[Any]) -> list[Any]:
    """Optuna stores only None/bool/int/float/str choices; others go by index."""
    if all(isinstance(v, _PRIMITIVE) for v in vals):
        return list(vals)
    return list(range(len(vals)))


def _grid(leaves: Sequence[tuple[str, hp.Spec]]) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = [{}]
    for path, spec in leaves:
        values = hp.grid_values(spec, f"hyperparameters.{path}")
        points = [{**p, path: v} for p in points for v in values]
    return points


def _sampler_class(optuna: Any) -> Any:
    class DeterminedSampler(optuna.samplers.BaseSampler):
        """Grid points by trial number; otherwise Optuna's RandomSampler,
        seeded per trial (see the module doc)."""

        def __init__(self, search: Search) -> None:
            self._search = search

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return {}

        def sample_relative(self, study: Any, trial: Any, space: Any) -> dict[str, Any]:
            return {}

        def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
            if self._search.grid:
                return trial.user_attrs.get("det_slot", trial.number) % len(self._search.grid)
            seed = (self._search.conf.experiment_seed * 1_000_003 + trial.number
                    + zlib.crc32(name.encode())) % 2**32
            rs = optuna.samplers.RandomSampler(seed=seed)
            return rs.sample_independent(study, trial, name, dist)

    return DeterminedSampler


def _pruner_class(optuna: Any) -> Any:
    class BracketView:
        """The study as one bracket sees it: competing values come only from
        trials of the same bracket (each bracket is its own ASHA)."""

        def __init__(self, study: Any, bracket: int) -> None:
            self._study = study
            self._bracket = bracket

        def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
            return [t for t in self._study.get_trials(deepcopy=deepcopy, states=states)
                    if t.user_attrs.get(ATTR_BRACKET) == self._bracket]

        def __getattr__(self, name: str) -> Any:
            return getattr(self._study, name)

    class DeterminedASHA(optuna.pruners.BasePruner):
        def __init__(self, search: Search) -> None:
            self._halving = [
                optuna.pruners.SuccessiveHalvingPruner(
                    min_resource=search.rungs(b)[0], reduction_factor=int(search.conf.searcher
                                                                           .divisor),
                    min_early_stopping_rate=0, bootstrap_count=0)
                for b in range(len(search.brackets))]
            self._top = search.conf.searcher.max_length

        def prune(self, study: Any, trial: Any) -> bool:
            step = trial.last_step
            if step is None or step >= self._top:
                return False  # the top rung ends a trial; it is never "pruned" there
            bracket = int(trial.user_attrs.get(ATTR_BRACKET, 0))
            return bool(self._halving[bracket].prune(BracketView(study, bracket), trial))

    return DeterminedASHA


def storage_label(url: Optional[str]) -> str:
    """The storage for messages and files, without a password."""
    if not url:
        return "journal file"
    if "://" in url and "@" in url.split("://", 1)[1]:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"
    return url


def open_storage(url: Optional[str], default_journal: str) -> Any:
    """Optuna storage: a journal file (a path, default in the experiment
    directory) or an RDB URL (``postgresql://...``, ``sqlite:///...``)."""
    optuna = require_optuna()
    if not url or "://" not in url:
        path = url or default_journal
        try:  # opening replays the whole journal: its errors are the user's too
            return optuna.storages.JournalStorage(journal.backend(optuna, path))
        except OSError as e:
            raise LaunchError(f"study storage {path}: {e.strerror or e}") from None
        except (ValueError, KeyError, TypeError, AssertionError) as e:
            # Optuna asserts on an op code it does not know (a newer Optuna's journal)
            raise LaunchError(f"study storage {path}: not an Optuna {optuna.__version__} "
                              f"journal ({type(e).__name__}: {e})") from None
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url),
                                          heartbeat_interval=None)
    except ImportError:
        raise LaunchError(f"study storage {storage_label(url)}: no database driver for this "
                          "URL (PostgreSQL: pip install 'determined_launch[search]')") from None
    except Exception as e:  # sqlalchemy's errors carry the driver's reason
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()
        raise LaunchError(f"study storage {storage_label(url)} cannot be reached: "
                          f"{reason[0] if reason else type(e).__name__}") from None


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("postgresql"):
        return {"connect_args": {"connect_timeout": 10}}
    return {}


def load_study(storage: Any, name: str, search: Search) -> optuna.Study:
    optuna = require_optuna()
    try:
        return optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                   direction=search.direction, sampler=search.sampler(),
                                   pruner=search.pruner())
    except optuna.exceptions.DuplicatedStudyError:
        # Another worker created it between our lookup and our create: use theirs.
        return optuna.load_study(storage=storage, study_name=name, sampler=search.sampler(),
                                 pruner=search.pruner())


def past_the_end(length: int, searcher: SearcherConfig) -> bool:
    """Whether a report at ``length`` ends the trial.

    0.38's ``time_metric`` + ``max_time``: the reported length *is* the time
    metric, in the unit of ``max_time``, so the searcher ends the trial there.
    With ``max_length`` the script trains its own length (``operations()``)
    and counts its steps in a unit of its own (seed 000's count batches while
    ``max_length`` says epochs): comparing the two could stop a trial early,
    so, as in Determined 0.38, ``max_length`` never stops a trial.
    """
    top = searcher.max_length
    return searcher.time_metric is not None and top is not None and length >= top


def suggest(trial: Any, name: str, dist: Any) -> Any:
    kind = type(dist).__name__
    if kind == "IntDistribution":
        return trial.suggest_int(name, dist.low, dist.high)
    if kind == "FloatDistribution":
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    return trial.suggest_categorical(name, dist.choices)
