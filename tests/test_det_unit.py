"""The pure parts of `det` and the experiments root: id allocation (also by
concurrent processes), lookup by id or name, adoption of directories from
before ids, table rendering, argument parsing and abbreviations, --config
overrides, .detignore rules."""

from __future__ import annotations

import json
import multiprocessing
import pathlib
import types
from typing import Any

import pytest

from determined_launch import exproot
from determined_launch.det import main as det_main
from determined_launch.det.create import apply_overrides, small_config
from determined_launch.det.snapshot import DEFAULT_IGNORE, Ignore, snapshot
from determined_launch.det.table import csv_text, format_time, presto
from determined_launch.errors import LaunchError
from determined_launch.exproot import LookupFailed, Root, trial_id_of


def _allocate(path: str, n: int, out: multiprocessing.Queue[list[int]]) -> None:
    root = Root(path)
    exp = pathlib.Path(path, "shared")
    out.put([root.new_trial_id(exp, i) for i in range(n)])


def test_two_processes_allocating_at_once_never_share_an_id(tmp_path: pathlib.Path) -> None:
    ctx = multiprocessing.get_context("fork")
    q: multiprocessing.Queue[list[int]] = ctx.Queue()
    procs = [ctx.Process(target=_allocate, args=(str(tmp_path), 40, q)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [i for _ in procs for i in q.get(timeout=60)]
    for p in procs:
        p.join(30)
    assert sorted(got) == list(range(1, 161))  # unique, and none skipped


def test_experiments_and_trials_are_numbered_across_the_root(tmp_path: pathlib.Path) -> None:
    root = Root(tmp_path)
    a_id, a = root.new_experiment_dir("mnist")
    b_id, b = root.new_experiment_dir("mnist")  # equal names are allowed, as in Determined
    assert (a_id, a.name, b_id, b.name) == (1, "mnist", 2, "mnist-2")
    for d in (a, b):
        (d / "experiment.json").write_text("{}")
    assert [root.new_trial_id(a, 0), root.new_trial_id(b, 0), root.new_trial_id(a, 1)] == [1, 2, 3]
    assert root.ensure_experiment(a) == 1  # stable
    assert [e.id for e in root.experiments()] == [1, 2]
    assert root.experiment("2").dir == b and root.experiment("mnist-2").id == 2
    for tid, d in ((1, a), (2, b), (3, a)):
        (d / "trials" / str(tid)).mkdir(parents=True)
    ref = root.trial(2)
    assert (ref.id, ref.experiment.id, ref.dir) == (2, 2, b / "trials" / "2")
    assert root.trial("mnist/3").dir == a / "trials" / "3"
    with pytest.raises(LookupFailed, match="no experiment 'nope'"):
        root.experiment("nope")
    with pytest.raises(LookupFailed, match="no trial '9'"):
        root.trial(9)


def test_a_directory_from_before_ids_is_adopted_with_its_trials(tmp_path: pathlib.Path) -> None:
    old = tmp_path / "old"
    for n in (1, 2):
        (old / "trials" / str(n)).mkdir(parents=True)
    (old / "experiment.json").write_text(json.dumps({"name": "old"}))
    root = Root(tmp_path)
    assert [(e.id, e.name) for e in root.experiments()] == [(1, "old")]
    assert root.trial(2).dir == old / "trials" / "2"
    _, new = root.new_experiment_dir("new")
    assert root.new_trial_id(new, 0) == 3  # the adopted trials' numbers are taken


def test_trial_id_of_reads_the_study_attribute_else_number_plus_one() -> None:
    assert trial_id_of(types.SimpleNamespace(number=4, user_attrs={"det_trial_id": 17})) == 17
    assert trial_id_of(types.SimpleNamespace(number=4, user_attrs={})) == 5


def test_the_root_is_the_flag_else_the_variable_else_det_experiments(
        tmp_path: pathlib.Path) -> None:
    assert exproot.root_dir("x", {exproot.ENV: "y"}).name == "x"
    assert exproot.root_dir(None, {exproot.ENV: str(tmp_path)}) == tmp_path
    assert exproot.root_dir(None, {}) == pathlib.Path("det_experiments").absolute()


def test_trial_checkpoints_lists_the_committed_ones(tmp_path: pathlib.Path) -> None:
    root = Root(tmp_path)
    _, exp = root.new_experiment_dir("e")
    tid = root.new_trial_id(exp, 0)
    trial = exp / "trials" / str(tid)
    trial.mkdir(parents=True)
    lines = [{"storage_id": s, "steps_completed": n, "time": 1.0} for s, n in
             (("a", 1), ("b", 2), ("c", 3))] + [{"deleted": "a"}]
    (trial / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (exp / "checkpoints" / "b").mkdir(parents=True)
    (exp / "checkpoints" / "b" / "metadata.json").write_text('{"steps_completed": 2}')
    (exp / "checkpoints" / "c").mkdir()  # no commit marker
    got = exproot.trial_checkpoints(tid, tmp_path)
    assert [(c["uuid"], c["steps_completed"], c["metadata"]) for c in got] == [
        ("b", 2, {"steps_completed": 2})]
    assert got[0]["storage"] == str(exp / "checkpoints")


def test_presto_tables_are_tabulates() -> None:
    # Expected strings: tabulate 0.10's `presto` output for the same rows.
    h = ["Trial ID", "State", "H-Params", "# of Batches"]
    rows = [[3, "COMPLETED", json.dumps({"x": 1, "y": 0.5}, indent=4), 8], [4, "ERROR", "{}", None]]
    assert presto(h, rows) == (
        "   Trial ID | State     | H-Params     |   # of Batches\n"
        "------------+-----------+--------------+----------------\n"
        "          3 | COMPLETED | {            |              8\n"
        '            |           |     "x": 1,  |\n'
        '            |           |     "y": 0.5 |\n'
        "            |           | }            |\n"
        "          4 | ERROR     | {}           |")
    assert presto(["v", "s"], [[0.5, "a"], [12.25, "b"]]) == (
        "     v | s\n-------+-----\n  0.5  | a\n 12.25 | b")
    assert csv_text(["ID", "Name"], [[1, "a,b"], [2, None]]) == 'ID,Name\r\n1,"a,b"\r\n2,'
    assert format_time(0) == "1970-01-01 00:00:00+0000"


@pytest.mark.parametrize("argv,handler", [
    (["e", "create", "c.yaml", ".", "-f"], "create"),
    (["experiment", "list"], "list_experiments"),
    (["e", "ls", "--csv"], "list_experiments"),
    (["e"], "list_experiments"),
    (["e", "lt", "3"], "list_trials"),
    (["e", "lc", "3", "--best", "1"], "list_checkpoints"),
    (["e", "unpause", "3"], "activate"),
    (["t", "logs", "7", "-f", "--tail", "5"], "trial_logs"),
    (["trial", "describe", "7", "--json"], "trial_describe"),
    (["c", "download", "u-u-i-d", "-o", "out"], "download_checkpoint"),
    (["checkpoint", "list", "1"], "list_checkpoints"),
    (["j", "run", "job.yaml", "."], "job_run"),
    (["version"], "version"),
])
def test_determined_nouns_verbs_and_abbreviations(argv: list[str], handler: str) -> None:
    ns = det_main.parser().parse_args(argv)
    assert ns.handler.__name__ == handler


def test_create_flags_are_determineds() -> None:
    p = det_main.parser()
    ns = p.parse_args(["e", "create", "c.yaml", ".", "--follow", "--config", "a.b=1",
                       "--config", "x=y", "--slurm", "--time=5", "-N1"])
    assert ns.follow_first_trial and ns.config == ["a.b=1", "x=y"]
    assert ns.slurm == ["--time=5", "-N1"]
    assert p.parse_args(["e", "create", "c.yaml", "--test"]).test_mode  # --test-mode's prefix


def test_usage_errors_exit_2_and_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert det_main.main(["e", "frobnicate"]) == 2
    assert det_main.main(["--help"]) == 0
    assert det_main.main(["t", "logs", "--help"]) == 0
    assert "--follow" in capsys.readouterr().out


def test_an_unknown_id_is_one_line_exit_1(tmp_path: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert det_main.main(["--experiments-dir", str(tmp_path), "e", "describe", "4"]) == 1
    err = capsys.readouterr().err
    assert err == f"det: error: no experiment '4' in {tmp_path}\n"


def test_det_master_set_is_one_line(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DET_MASTER", "http://master:8080")
    assert det_main.main(["--experiments-dir", str(tmp_path), "e", "list"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "runs without a master" in err[0]


def test_config_overrides_as_determined_applies_them() -> None:
    conf: dict[str, Any] = {"searcher": {"name": "random", "max_trials": 4}, "slurm": None}
    out = apply_overrides(conf, ["searcher.max_trials=2", "hyperparameters.lr=0.1",
                                 "labels=a,b", "slurm.sbatch_args=[--mem=1g]",
                                 'data={"k": 1}'])
    assert out == {"searcher": {"name": "random", "max_trials": 2},
                   "hyperparameters": {"lr": 0.1}, "labels": ["a", "b"],
                   "slurm": {"sbatch_args": ["--mem=1g"]}, "data": {"k": 1}}
    assert conf["searcher"]["max_trials"] == 4  # the caller's copy is untouched
    with pytest.raises(LaunchError, match="expected KEY=VALUE"):
        apply_overrides(conf, ["novalue"])


def test_test_mode_is_one_short_trial_without_restarts() -> None:
    t = small_config({"searcher": {"name": "adaptive_asha", "metric": "loss",
                                  "max_trials": 16}, "max_restarts": 5})
    assert t["searcher"] == {"name": "single", "metric": "loss", "max_length": {"batches": 1}}
    assert t["max_restarts"] == 0


def test_detignore_rules() -> None:
    rules = Ignore([*DEFAULT_IGNORE, "data/", "*.ckpt", "!keep.ckpt", "/top.txt", "a/**/z"])
    assert rules.ignored("__pycache__", True) and rules.ignored("x/y.pyc", False)
    assert rules.ignored("data", True) and not rules.ignored("data", False)
    assert rules.ignored("m/w.ckpt", False) and not rules.ignored("m/keep.ckpt", False)
    assert rules.ignored("top.txt", False) and not rules.ignored("sub/top.txt", False)
    assert rules.ignored("a/b/c/z", False) and rules.ignored("a/z", False)
    assert not rules.ignored("train.py", False)


def test_snapshot_copies_inside_only_and_is_bounded(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print(1)")
    (src / "pkg" / "m.py").write_text("")
    (src / "big.bin").write_bytes(b"0" * 2048)
    (src / ".detignore").write_text("*.bin\n")
    (src / "det_experiments" / "old").mkdir(parents=True)
    (tmp_path / "secret").write_text("no")
    (src / "out").symlink_to(tmp_path / "secret")
    (src / "in").symlink_to("train.py")
    files, size = snapshot(src, tmp_path / "dst", skip=(src / "det_experiments",))
    dst = tmp_path / "dst"
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == [
        "in", "pkg", "pkg/m.py", "train.py"]
    assert (files, size) == (2, 8) and (dst / "in").is_symlink()
    with pytest.raises(LaunchError, match="exceed the maximum allowed size"):
        snapshot(src, tmp_path / "dst2", limit=4)
    assert not (tmp_path / "dst2").exists()


def test_the_slurm_array_script_and_the_k8s_job(tmp_path: pathlib.Path) -> None:
    yaml = pytest.importorskip("yaml")
    import subprocess

    from determined_launch.det.cluster import k8s_manifest, sbatch_script

    exp = tmp_path / "root" / "e"
    exp.mkdir(parents=True)
    (exp / "config.yaml").write_text(json.dumps({
        "name": "e", "entrypoint": "python3 train.py", "hyperparameters": {"x": 1},
        "searcher": {"name": "random", "metric": "loss", "max_trials": 8,
                     "max_concurrent_trials": 3}}))
    script = sbatch_script(4, exp, [])
    assert "#SBATCH --array=0-2\n" in script and "--worker" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and f"{exp}/det_paused" in script
    assert "--array" not in sbatch_script(4, exp, ["--array=0-7"])
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    job = yaml.safe_load(k8s_manifest(4, exp))
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 3
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-3:] == ["--worker", "--experiment-dir", str(exp)]


def test_det_launch_ui_and_experiment_default_to_the_same_root(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from determined_launch.ui.cli import _paths

    monkeypatch.setenv(exproot.ENV, str(tmp_path))
    assert _paths([], [])[0] == str(tmp_path)
    assert exproot.root_dir() == tmp_path  # det-launch experiment's default <root>/<name>
