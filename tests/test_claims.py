"""``--min-nodes``: the generation claims in the run directory, and what a
starting launcher decides from them. Pure rules one interleaving at a time
(each one that the chaos check, benchmarks/chaos_node_loss.py, found going
wrong), and the launcher's generation loop on a real directory with a
stand-in for the supervisor."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from determined_launch.cluster.info import ClusterInfo
from determined_launch.launch import generations, restart_judge
from determined_launch.launch.claims import (
    NEW,
    REJOIN,
    Claim,
    Claims,
    Survey,
    arrival,
    lineage,
    superseded,
)
from determined_launch.supervisor.events import Failure
from determined_launch.supervisor.restarts import Decision, Progress

C4 = Progress("ck-4", 4)
SECRET = "c" * 32


def claims_in(run_dir: Path, num_nodes: int = 3) -> Claims:
    return Claims(run_dir, SECRET, num_nodes)

CHIEF_LOST = Failure(1, "the chief's launcher", 0, "h0", 1.0, how="was lost")


# ------------------------------------------------------------------ pure rules
@pytest.mark.parametrize(("survey", "want"), [
    (Survey(), NEW),  # nothing here
    (Survey(ended=True, newest=4, was_here=True, others_running=True), NEW),  # a rerun
    (Survey(newest=3, was_here=True), NEW),  # a killed job's leftovers: nobody runs it
    (Survey(newest=0, others_running=True), NEW),  # a new job's late member
    # The chaos check's bad runs: a launcher started again while the others still ran
    # generation 0 (they had not noticed its loss) took it for a new job; the chief's
    # relaunch then removed the running job's claims and numbering restarted.
    (Survey(newest=0, was_here=True, others_running=True), REJOIN),
    (Survey(newest=2, was_here=True, others_running=True), REJOIN),
    (Survey(newest=2, others_running=True), REJOIN),  # its alive file went with a new start
    # Every running launcher was killed while others waited to rejoin: the old code's
    # relaunch took it for a new job and waited for a chief that was waiting too.
    (Survey(newest=4, was_here=True, others_waiting=True), REJOIN),
    (Survey(newest=4, others_waiting=True), NEW),
])
def test_a_starting_launcher_rejoins_exactly_a_running_job(survey: Survey, want: str) -> None:
    assert arrival(survey) == want


def test_a_claim_extends_the_lineage_or_is_refused() -> None:
    assert lineage(0, (0, 1, 2), (), None, None) is None
    assert lineage(2, (0, 1), (0, 1), (0, 1), None) is None
    assert lineage(2, (0, 1), (0, 1), (0, 1), (0, 1)) is None  # the same claim again
    assert lineage(2, (0, 1), (0, 1), (0, 1), (1,)) == (
        "generation 2 of this job was already started by node 1")
    assert lineage(2, (1,), (1, 2), (0, 2), None) == (
        "generation 1 of this job ran on nodes 0, 2, not on this group's nodes 1, 2: another "
        "group of nodes continued the job")
    # Generation numbers restarted under a running group (a new job removed the claims):
    # the old code let it claim the next number as if nothing happened.
    assert lineage(2, (1, 2), (1, 2), None, None) == (
        "generation 1 of this job is not in the run directory (a new job started there)")


def test_a_running_generation_stops_when_a_later_one_is_claimed() -> None:
    assert superseded(1, (0, 1), (0, 1), Claim(1, (0, 1))) is None
    assert superseded(1, (0, 1), (0, 1), Claim(2, (0, 1, 2))) == (
        "generation 2 was claimed by nodes 0, 1, 2 while this node ran generation 1")
    assert superseded(3, (1, 2), None, Claim(1, (0, 1, 2))) == (
        "the claim of its generation 3 is gone from the run directory")
    # generation 0 before its chief claimed it (a new job's member came first)
    assert superseded(0, (0, 1, 2), None, Claim(5, (0,))) is None


# ------------------------------------------------------------------ claims on disk
def test_two_groups_of_survivors_cannot_both_continue(tmp_path: Path) -> None:
    """A partition: nodes 0+2 and node 1 each think the others lost. The first
    claim of generation 1 wins; the other group stops, even when it later tries
    generation 2 on its own."""
    claims_in(tmp_path).start((0, 1, 2))
    a, b = claims_in(tmp_path), claims_in(tmp_path)
    assert a.claim(1, (0, 2), previous=(0, 1, 2)) is None
    assert a.claim(1, (0, 2), previous=(0, 1, 2)) is None  # the same group again: fine
    assert b.claim(1, (1, 2), previous=(0, 1, 2)) == (
        "generation 1 of this job was already started by nodes 0, 2")
    assert b.claim(2, (1,), previous=(1, 2)) == (
        "generation 1 of this job ran on nodes 0, 2, not on this group's nodes 1, 2: another "
        "group of nodes continued the job")
    assert a.claim(2, (0,), previous=(0, 2)) is None
    assert sorted(p.name for p in (tmp_path / "generations").glob("*.json")) == [
        "0.json", "1.json", "2.json"]  # whole files only, no temporaries
    assert not list((tmp_path / "generations").glob(".claim-*"))
    claims_in(tmp_path).start((0, 1, 2))  # a new job: the old claims go
    assert b.claim(1, (1, 2), previous=(0, 1, 2)) is None


def test_a_starting_launcher_finds_what_runs_here(tmp_path: Path) -> None:
    import os

    from determined_launch.launch.claims import ALIVE_STALE, JOINING, Survey

    c = claims_in(tmp_path)
    assert c.survey(2) == Survey()  # nothing here: a new job
    c.start((0, 1, 2))  # the chief says it runs generation 0
    assert c.survey(1) == Survey(newest=0, others_running=True)  # a late member of a new job
    assert c.survey(1) == Survey(newest=0, was_here=True, others_running=True)  # its relaunch
    assert c.claim(1, (0, 1), (0, 1, 2), checkpoint="ck-4", steps=4, restarts=1) is None
    c.touch(0, JOINING)  # waiting to rejoin is not running
    assert not c.survey(2).others_running
    c.touch(0, 1)
    old = (tmp_path / "generations" / "alive-0").stat().st_mtime - ALIVE_STALE - 1
    os.utime(tmp_path / "generations" / "alive-0", (old, old))
    assert c.survey(2) == Survey(newest=1, was_here=True)  # stale: a killed job's leftovers
    c.ask_to_join(2)
    assert c.joiners() == (2,)
    claim = c.newest()
    assert claim is not None and (claim.generation, claim.members, claim.checkpoint,
                                  claim.steps, claim.restarts) == (1, (0, 1), "ck-4", 4, 1)
    c.forget_joins((0, 1, 2))
    assert c.joiners() == ()
    c.touch(0, 1)
    c.end()
    assert c.survey(2).ended  # the job ended: nothing to rejoin


def test_a_generation_with_a_missing_predecessor_is_refused_on_disk(tmp_path: Path) -> None:
    c = claims_in(tmp_path)
    c.start((0, 1, 2))
    assert c.claim(1, (1, 2), (0, 1, 2)) is None
    assert c.superseded(1, (1, 2)) is None
    claims_in(tmp_path).start((0, 1, 2))  # a relaunched chief removed the claims (old code)
    assert c.superseded(1, (1, 2)) == "the claim of its generation 1 is gone from the run directory"
    assert c.claim(2, (1,), (1, 2)) == (
        "generation 1 of this job is not in the run directory (a new job started there)")
    assert c.claim(1, (0,), (0, 1, 2)) is None
    assert c.superseded(0, (0, 1, 2)) == (
        "generation 1 was claimed by node 0 while this node ran generation 0")


def test_waiting_nodes_adopt_a_job_that_nobody_runs(tmp_path: Path) -> None:
    import os

    from determined_launch.launch.claims import ALIVE_STALE, JOINING

    reads: list[int] = []

    def ck8() -> tuple[str, int]:
        reads.append(1)
        return "ck-8", 8

    c = claims_in(tmp_path)
    c.start((0, 1, 2))
    assert c.claim(1, (0, 1), (0, 1, 2), restarts=1) is None
    c.touch(0, 1)  # node 0 runs generation 1; nodes 1 and 2 wait to rejoin
    c.touch(2, JOINING)
    c.adopt(1, ck8)
    assert c.newest() == Claim(1, (0, 1), restarts=1)  # a launcher runs it: wait
    old = (tmp_path / "generations" / "alive-0").stat().st_mtime - ALIVE_STALE - 1
    os.utime(tmp_path / "generations" / "alive-0", (old, old))  # it died
    c.adopt(1, ck8)
    # Generation 1 was claimed just now: its members may not have said so yet (a second
    # adoption stopped the first one's nodes in 2 of 17 chaos runs at the suite's pace).
    assert c.newest() == Claim(1, (0, 1), restarts=1)
    os.utime(tmp_path / "generations" / "1.json", (old, old))
    c.adopt(2, ck8)
    assert c.newest() == Claim(1, (0, 1), restarts=1)  # node 1 is the lowest waiting
    c.adopt(1, ck8)
    assert c.newest() == Claim(2, (1, 2), "ck-8", 8, restarts=2)
    assert reads == [1]  # the checkpoint is read (maybe from object storage) only to adopt


# ------------------------------------------------------------------ the generation loop
def info(me: int, n: int = 3) -> ClusterInfo:
    return ClusterInfo(tuple(f"h{i}" for i in range(n)), me, (1,) * n, (0,), "test")


def judge(me: int, n: int = 3, min_nodes: int = 1) -> restart_judge.Restarts:
    return restart_judge.Restarts(3, lambda: C4, Progress(), tuple(range(n)), me, min_nodes)


def test_a_relaunched_chief_rejoins_instead_of_starting_over(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The chief's launcher is killed and started again while nodes 1 and 2
    still run generation 0: it must not remove the job's claims and start a
    generation 0 of its own (the old code did: two memberships on one run
    directory), but ask to rejoin."""
    claims = claims_in(tmp_path)
    claims.start((0, 1, 2))  # the first chief, since killed
    claims.touch(1, 0)
    claims.touch(2, 0)
    claims.ask_to_join(5)  # anything in the directory that a new start would remove
    calls: list[int] = []

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        calls.append(gen.number)
        return 0, Decision(False), frozenset()

    status, _ = generations.run_generations(info(0), judge(0), one, claims, join_timeout=0.3)
    assert calls == [] and status == 1
    assert (tmp_path / "generations" / "join-5").exists()
    err = capsys.readouterr().err
    assert "the job runs here (generation 0, nodes 0, 1, 2) without this launcher of node 0: " \
           "asking to rejoin" in err
    assert "node 0 did not rejoin the running job: no generation took it within 0.3s" in err


def test_every_member_checks_the_claim_before_it_starts_a_generation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After the chief's loss node 2 decides alone to continue on nodes 1, 2;
    generation 1 was claimed by nodes 0, 2 meanwhile. The old code let node 2
    (not the claimer) start it anyway."""
    claims = claims_in(tmp_path)
    claims.start((0, 1, 2))
    assert claims.claim(1, (0, 2), (0, 1, 2)) is None
    # nobody runs it: node 2 is no newcomer
    (tmp_path / "generations" / "alive-0").unlink(missing_ok=True)
    j, calls = judge(2), []

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        calls.append(gen.number)
        return 1, j.decide(1, CHIEF_LOST, frozenset({0})), frozenset()

    status, _ = generations.run_generations(info(2), j, one, claims, join_timeout=0.3)
    assert calls == [0] and status == 1
    assert "not restarting: generation 1 of this job was already started by nodes 0, 2" in (
        capsys.readouterr().err)


def test_the_last_survivors_of_a_lost_chief_end_the_job(tmp_path: Path) -> None:
    """Below --min-nodes after the chief's loss, the lowest survivor writes
    end.json (the old code left it to the chief, which was gone), so a node
    started again later is told the job ended instead of waiting for it."""
    claims = claims_in(tmp_path)
    claims.start((0, 1))
    (tmp_path / "generations" / "alive-0").unlink(missing_ok=True)
    j = judge(1, n=2, min_nodes=2)

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        return 1, j.decide(1, CHIEF_LOST, frozenset({0})), frozenset()

    assert generations.run_generations(info(1, n=2), j, one, claims)[0] == 1
    assert claims.ended()


def test_a_rejoin_survives_the_loss_of_the_chief_that_preempted_for_it() -> None:
    """Generation 12 (nodes 0, 2) was preempted for node 1 to rejoin, and
    the chief's launcher was killed before it decided. Node 2 decides alone:
    the old code saw a plain preemption and ended the job (exit 75, no
    final weight); it continues with the rejoining node, without the chief."""
    from determined_launch.errors import EXIT_PREEMPTED
    from determined_launch.supervisor import handoff

    j = restart_judge.Restarts(50, lambda: C4, Progress(), (0, 2), 2, 1)
    d = handoff.node_decides(None, j, EXIT_PREEMPTED, None, True, None,  # type: ignore[arg-type]
                             1.0, lambda: (1,))
    assert d.restart and d.members == (1, 2) and d.generation == 1
    assert d.why == ("node 1 rejoins: continuing on nodes 1, 2 without node 0 (generation 1); "
                     "resuming from no checkpoint")  # (none committed since this node started)
    alone = restart_judge.Restarts(50, lambda: C4, Progress(), (0, 2), 2, 1)
    assert not handoff.node_decides(None, alone, EXIT_PREEMPTED, None, True, None,  # type: ignore[arg-type]
                                    1.0, lambda: ()).restart  # a plain preemption ends it


def test_a_superseded_generation_stops_its_workers_without_a_checkpoint() -> None:
    """Node 2 still runs generation 3 when generation 4 is claimed without
    it: its workers are stopped at once (no preemption, so no checkpoint of
    an old membership), the chief is told, and nobody restarts for it."""
    from determined_launch.supervisor import verdict as v

    verdict = v.Verdict(v.Settings(
        role=v.Role.NODE, node=1, hosts=("h0", "h2"), roles=("worker",), names=("rank 1",),
        preempt_signals=(), preempt_grace=30.0, kill_after=5.0, connect_timeout=300.0,
        ids=(0, 2)), now=0.0)
    verdict.handle(v.PreemptListening(), 1.0, 1001.0)
    why = "generation 4 was claimed by nodes 0, 1 while this node ran generation 3"
    out = verdict.handle(v.Superseded(why), 1.0, 1001.0)
    assert v.SignalAll(signal.SIGTERM) in out
    assert not any(isinstance(a, v.WritePreemptSignal) for a in out)
    assert any(isinstance(a, v.SendToChief) and a.msg["type"] == v.Kind.FAILED for a in out)
    cause = v.pick_cause(verdict.candidates)
    assert cause is not None and cause.interrupt
    assert cause.describe() == f"the launcher on node 2 (h2) stopped its generation: {why}"
    j = restart_judge.Restarts(50, lambda: C4, Progress(), (0, 2), 2, 1)
    assert not j.decide(143, cause).restart


def test_a_node_superseded_by_a_generation_that_takes_it_in_goes_on_there(
        tmp_path: Path) -> None:
    """Node 1 ran generation 0 when generation 1 was claimed with it (nodes
    waiting to rejoin adopted the job they thought nobody ran): its
    generation stops, and it goes on in generation 1 instead of ending (the
    old code ended: the job was left without its nodes)."""
    claims = claims_in(tmp_path)
    claims.start((0, 1, 2))
    j, calls = judge(1), []

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        calls.append(gen.number)
        if gen.number == 0:
            assert claims.claim(1, (0, 1, 2), (0, 1, 2), checkpoint="ck-4", steps=4) is None
            assert gen.superseded is not None and gen.superseded() is not None
            return 143, Decision(False, "not restarted: the job was stopped on request"), \
                frozenset()
        return 0, Decision(False), frozenset()

    assert generations.run_generations(info(1), j, one, claims, join_timeout=0.3)[0] == 0
    assert calls == [0, 1]


def test_a_node_whose_job_succeeded_takes_no_later_generation(tmp_path: Path) -> None:
    """Issue 35 §0.5: the job succeeded (the chief's word: exit 0) while
    nodes waiting to rejoin claimed generation 1 with this node; the old code
    took it, resumed an older checkpoint and ended with exit status 1 while its
    peers reported success."""
    claims = claims_in(tmp_path)
    claims.start((0, 1, 2))
    j, calls = judge(1), []

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        calls.append(gen.number)
        if gen.number == 0:
            assert claims.claim(1, (0, 1, 2), (0, 1, 2), checkpoint="ck-4", steps=4) is None
            return 0, Decision(False), frozenset()
        return 1, Decision(False), frozenset()

    assert generations.run_generations(info(1), j, one, claims, join_timeout=0.3)[0] == 0
    assert calls == [0]


# ------------------------------------------------------------ untrusted files (issue 34 §8, §9)
def test_a_claim_must_fit_the_job_to_count() -> None:
    from determined_launch.launch.claims import parse_claim

    assert parse_claim(1, '{"generation": 1, "members": [0, 2], "restarts": 1}', 3) == Claim(
        1, (0, 2), restarts=1)
    assert parse_claim(1, '{"generation": 2, "members": [0]}', 3) == (
        "it claims generation 2, not 1")
    for members in ("[7]", "[]", "[1, 0]", "[0, 0]", "[-1]", '["0"]', "[true]", "0"):
        assert parse_claim(1, f'{{"generation": 1, "members": {members}}}', 3) == (
            f"its members {json.loads(members)!r} are not nodes of this 3-node job")
    assert parse_claim(1, '{"generation": 1, "members": [0], "restarts": -1}', 3) == (
        "its checkpoint, steps or restarts are malformed")
    assert parse_claim(1, '{"generation": 1, "members": [0], "evil": 1}', 3) == "not a claim"
    assert parse_claim(1, "[" * 100_000, 3) == "not JSON"


def test_presence_files_name_nodes_of_the_job() -> None:
    from determined_launch.launch.presence import rank_of

    assert rank_of("join-1", "join-", 2) == 1
    assert [rank_of(n, "join-", 2) for n in ("join-7", "join-01", "join-", "join-١", "alive-1")] \
        == [None] * 5


def test_unsigned_or_foreign_claim_files_are_ignored_and_named_once(tmp_path: Path) -> None:
    """Issue 34 §9: in a 2-node job, ``touch generations/join-7`` made the chief
    preempt and both launchers die with an IndexError; an injected ``1.json``
    with members [0] stopped node 1 while node 0 went on alone."""
    told: list[str] = []
    c = Claims(tmp_path, SECRET, 2, say=told.append)
    c.start((0, 1))
    c.touch(1, 0)
    gens = tmp_path / "generations"
    (gens / "join-7").touch()
    (gens / "join-1").touch()  # a rank of the job, unsigned
    (gens / "1.json").write_text('{"generation": 1, "members": [0]}')
    (gens / "alive-0").write_text("join")  # node 0 does not wait to rejoin
    other = Claims(tmp_path, "another job's secret!" * 2, 2, say=lambda _: None)
    other.files.write("2.json", '{"generation": 2, "members": [0]}')  # another job's key
    for _ in range(3):
        assert c.joiners() == ()
        assert c.superseded(0, (0, 1)) is None
        assert c.newest() == Claim(0, (0, 1))
        assert c.census(1) == (set(), set())
    assert c.claim(1, (0, 1), (0, 1)) == (  # denied (a writer can always delete), not misled
        f"generation 1 of this job cannot be claimed: {gens}/1.json is not its claim")
    assert sorted(told) == sorted(f"ignoring {gens}/{name}: {why}" for name, why in (
        ("join-7", "names no node of this 2-node job"),
        ("join-1", "not signed with this job's key (another job's, or not a launcher's)"),
        ("1.json", "not signed with this job's key (another job's, or not a launcher's)"),
        ("2.json", "not signed with this job's key (another job's, or not a launcher's)"),
        ("alive-0", "not signed with this job's key (another job's, or not a launcher's)")))


OTHER_USER = "det-launch-other"


@pytest.fixture(scope="module")
def other_user() -> tuple[int, int]:
    """A real second uid (and its own group): the other writer of a shared run directory."""
    import pwd
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to make a second user")
    try:
        pw = pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                        "--shell", "/usr/sbin/nologin", OTHER_USER], capture_output=True)
        pw = pwd.getpwnam(OTHER_USER)  # made here, or by a test beside this one
    return pw.pw_uid, pw.pw_gid


def as_user(uid_gid: tuple[int, int], script: str) -> None:
    """``script`` as that user (sh: root's Python may be out of the user's reach)."""
    import subprocess

    subprocess.run(["/bin/sh", "-ec", script], user=uid_gid[0], group=uid_gid[1],
                   extra_groups=[], check=True, timeout=30)


def test_a_second_user_cannot_make_the_launcher_write_through_links(
        other_user: tuple[int, int]) -> None:
    """Issue 34 §8: a user who can write the (group-shared) run directory
    swaps ``generations`` for a directory of links to root's files, or for a
    link to root's directory; the root-run launcher's alive, join and end
    writes overwrote ``/victim/file`` and created files anywhere. A run
    directory writable by a group that is not the job's is refused."""
    import shutil
    import stat
    import tempfile

    from determined_launch.errors import LaunchError

    base = Path(tempfile.mkdtemp(prefix="det-claims-"))  # outside root's 0700 pytest dir
    try:
        base.chmod(0o755)
        victims = base / "victim"
        victims.mkdir(mode=0o755)
        precious = victims / "file"
        precious.write_text("precious")
        run = base / "run"
        run.mkdir()
        os.chown(run, 0, other_user[1])
        run.chmod(0o2770)  # writable by the other user's group
        with pytest.raises(LaunchError, match=rf"^run directory {run} is writable by group "
                                              rf"{other_user[1]}, which this job's user is "
                                              r"not in \(mode 2770\): --min-nodes"):
            Claims.open(run, SECRET, 2)
        c = Claims(run, SECRET, 2)  # as if the group were the job's
        c.start((0, 1))
        as_user(other_user, f"""cd {run}
            mv generations old && mkdir -m 777 generations
            for name in alive-0 join-0 end.json; do ln -s {precious} generations/$name; done""")
        c.touch(0, 1)
        c.ask_to_join(0)
        c.end()
        assert precious.read_text() == "precious"
        for name in ("alive-0", "join-0", "end.json"):
            assert stat.S_ISREG(os.lstat(run / "generations" / name).st_mode)
        assert c.ended() and c.joiners() == (0,)
        as_user(other_user, f"cd {run} && rm -r generations && ln -s {victims} generations")
        c.touch(0, 1)
        c.ask_to_join(1)
        assert c.claim(1, (0, 1), (0, 1)) is not None
        assert sorted(os.listdir(victims)) == ["file"] and precious.read_text() == "precious"
        c.start((0, 1))  # a new job removes the link, not what it points to
        assert not (run / "generations").is_symlink() and c.newest() == Claim(0, (0, 1))
        assert sorted(os.listdir(victims)) == ["file"]
    finally:
        shutil.rmtree(base)


def test_survivors_on_node_local_run_directories_say_it_is_not_shared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 35 §0.4: each node has its own run directory. The chief (node 0)
    claimed generation 0 in its own; node 1 ran generation 0 with it and,
    after node 2's loss, must continue on nodes 0, 1. The old code said
    'generation 0 of this job is not in the run directory (a new job started
    there)'; the directory is not shared, and it says so."""
    chiefs = claims_in(tmp_path / "node0")
    chiefs.start((0, 1, 2))
    mine = claims_in(tmp_path / "node1")  # node 1's node-local run directory
    j = judge(1)
    lost2 = Failure(1, "the launcher", 2, "h2", 1.0, how="was lost")

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        return 1, j.decide(1, lost2, frozenset({2})), frozenset()

    status, _ = generations.run_generations(info(1), j, one, mine, claim_wait=0.2)
    err = capsys.readouterr().err
    assert status == 1
    assert "not restarting: the run directory is not shared: this node ran generation 0 with " \
           "the chief's launcher (node 0) connected, but never saw its claim in " \
           f"{tmp_path / 'node1' / 'generations'}" in err
    assert "a new job started there" not in err


def test_an_unwritable_run_directory_is_one_line(other_user: tuple[int, int]) -> None:
    """Issue 35 §0.4: a run directory the launcher's user cannot write gave a
    traceback at its first claim (mkstemp: PermissionError) or, later, claims
    that silently never land; now Claims.open (the launcher's start: exit 2)
    says so in one line."""
    import shutil
    import tempfile

    from determined_launch.errors import LaunchError

    base = Path(tempfile.mkdtemp(prefix="det-claims-"))
    try:
        base.chmod(0o755)
        run = base / "run"
        run.mkdir(mode=0o755)  # root's: the other user may read it, not write it
        os.setegid(other_user[1])
        os.seteuid(other_user[0])
        try:
            with pytest.raises(LaunchError) as e:
                Claims.open(run, SECRET, 2)
        finally:
            os.seteuid(0)
            os.setegid(0)
        assert str(e.value) == (f"run directory {run}: cannot create {run}/generations: "
                                f"Permission denied; --min-nodes keeps its nodes' claims there "
                                f"(set DET_RUN_DIR to a directory this user can write)")
        (run / "generations").mkdir(mode=0o755)  # there, and still not writable
        os.setegid(other_user[1])
        os.seteuid(other_user[0])
        try:
            with pytest.raises(LaunchError, match=r"cannot write in .*/generations: Permission "
                                                  r"denied; --min-nodes"):
                Claims.open(run, SECRET, 2)
        finally:
            os.seteuid(0)
            os.setegid(0)
        Claims.open(run, SECRET, 2)  # its owner may
    finally:
        shutil.rmtree(base)
