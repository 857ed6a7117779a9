"""Issue 35 §2 on the bucket alone: the chief lost, then back.

Three simulated nodes, each with its own run directory, checkpoints, claims
and presence in an S3 bucket of moto's server (tests/test_claims_bucket.py
loses a worker node the same way; the random kills are
tests/test_chaos_node_loss.py's and ``benchmarks/chaos_node_loss.py --bucket
s3``)."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from determined_launch.cluster.info import ClusterInfo
from determined_launch.core.storage.spec import parse_storage
from determined_launch.launch import generations, restart_judge
from determined_launch.launch.claims import Claims
from determined_launch.supervisor.restarts import Decision, Progress
from tests.conftest import Launch, free_port_block
from tests.storage_servers import S3Server
from tests.test_min_nodes import kill_when_paused, node_command, reference

SECRET = "c" * 32


def test_a_new_jobs_nodes_start_from_the_checkpoint_of_the_chiefs_claim(
        s3_server: S3Server, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Found by the chaos check on the bucket (``--bucket s3 --seed 303``): with
    every launcher killed and started again (a new job), node 0 resumed from
    its own run directory's checkpoint (step 16) and nodes 1 and 2 from none
    (theirs had none): workers at different steps, a collective that failed
    (it could as well have mixed the steps' data). Each node takes the
    checkpoint of the chief's claim of generation 0."""
    spec = parse_storage(s3_server.block(s3_server.new_bucket()), where="test")
    started: dict[int, Optional[str]] = {}
    both = threading.Barrier(2, timeout=30)

    def node(me: int, local: Progress) -> None:
        claims = Claims.open(tmp_path / f"run{me}", SECRET, 3, spec, "trial-1")
        judge = restart_judge.Restarts(3, lambda: local, local, (0, 1, 2), me, 1)
        info = ClusterInfo(("h0", "h1", "h2"), me, (1, 1, 1), (0,), "test",
                           latest_checkpoint=local.checkpoint)

        def one(gen: generations.Generation) -> tuple[int, Decision, frozenset[int]]:
            started[me] = gen.info.latest_checkpoint
            both.wait()  # a generation: its nodes meet
            return 0, Decision(False), frozenset()

        generations.run_generations(info, judge, one, claims, join_timeout=5, claim_wait=5)

    worker = threading.Thread(target=node, args=(1, Progress()))  # its run directory: none
    worker.start()
    time.sleep(1.0)  # it looks at the bucket first (a STARTING node)
    node(0, Progress("ck-16", 16))
    worker.join(30)
    assert started == {0: "ck-16", 1: "ck-16"}
    # node 1's run directory said "start fresh" a moment ago: a line corrects it; the chief's
    # own checkpoint is the claim's, so it says nothing more
    said = [line for line in capfd.readouterr().err.splitlines() if "starts from" in line]
    assert said == ["det-launch: node 1 starts from checkpoint ck-16, the one the chief's claim "
                    "names, not a fresh start as its own run directory said"], said


def wait_for_object(s3: S3Server, bucket: str, name: str, timeout: float) -> None:
    """Until the job's ``generations/<name>`` is an object of the bucket."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = s3.client().list_objects_v2(Bucket=bucket, Prefix="exp/.det-launch/")
        if any(o["Key"].endswith(f"/generations/{name}") for o in listed.get("Contents", [])):
            return
        time.sleep(0.1)
    raise AssertionError(f"no generations/{name} in the bucket within {timeout}s")


@pytest.mark.slow
def test_a_lost_chief_on_node_local_run_directories_comes_back_and_rejoins_exactly(
        tmp_path: Path, launches: list[Launch], s3_server: S3Server) -> None:
    """--min-nodes 2: the chief's launcher is killed at step 6 (checkpoint at
    4, published in the bucket); nodes 1 and 2 continue from step 4, agreeing
    through the bucket alone;
    node 0 is started again with the same command, finds the job there (its
    own run directory knows nothing newer), rejoins at the next checkpoint
    (step 10), and the job ends with the uninterrupted run's weight."""
    bucket = s3_server.new_bucket()
    storage = tmp_path / "storage.yaml"  # the environment names a block by its file
    storage.write_text(json.dumps(s3_server.block(bucket)))  # (JSON is YAML)
    steps = 16
    flags = ("--max-restarts", "2", "--min-nodes", "2")
    port = free_port_block(12)

    def node(rank: int) -> Launch:
        launch = Launch(*node_command(
            tmp_path, rank, 3, port, flags, PAUSE_NODE="0", STEPS=str(steps), HOLD_AT="10",
            DET_RUN_DIR=str(tmp_path / f"run{rank}"), DET_CHECKPOINT_STORAGE=str(storage)))
        launches.append(launch)
        return launch

    nodes = [node(rank) for rank in range(3)]
    # the chief's launcher publishes its workers' checkpoint within a second; killed
    # before that, the survivors would resume from the start (exact, but the work is lost)
    wait_for_object(s3_server, bucket, "progress.json", 60)
    kill_when_paused(tmp_path, nodes[0])
    wait_for_object(s3_server, bucket, "1.json", 60)
    again = node(0)  # the same command on the same host: a requeued chief
    for launch in (nodes[1], nodes[2], again):
        assert launch.wait(90) == 0, launch.stdout + launch.stderr
    out = "".join(n.stdout for n in (nodes[1], nodes[2], again))
    finals = re.findall(r"final w=(\S+)", out)
    assert len(finals) == 1 and math.isclose(float(finals[0]), reference(steps=steps),
                                             abs_tol=1e-9), out
    assert "node=1 rank=0 size=2 start=4" in nodes[1].stdout, nodes[1].stdout
    assert re.search(r"node=0 rank=\d size=3 start=10", again.stdout), again.stdout
    assert "asking to rejoin at its next checkpoint" in again.stderr, again.stderr
    for launch in (*nodes, again):
        assert launch.leftovers() == []
