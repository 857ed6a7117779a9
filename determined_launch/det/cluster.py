"""``det e create CONFIG CONTEXT --slurm [SBATCH ARGS]`` and ``--print-k8s``:
the experiment's workers (``det-launch experiment --worker``, docs/search.md)
as a SLURM job array, submitted, or as a Kubernetes indexed Job, printed.

The array has ``searcher.max_concurrent_trials`` tasks unless the SBATCH ARGS
give ``--array``; each runs one worker in the experiment's copy of the context
(so the experiment directory must be on a file system the nodes share). A
worker preempted (the time limit, ``scancel``, ``--signal=B:USR1@SECS``) exits
75 after its trial checkpointed, and its task is requeued: the trial resumes.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from determined_launch import expconf
from determined_launch.det import state
from determined_launch.errors import EXIT_PREEMPTED, LaunchError

SBATCH = """#!/bin/bash
#SBATCH --job-name=det-experiment-{exp_id}
#SBATCH --output={exp_dir}/slurm-%A_%a.out
#SBATCH --chdir={exp_dir}/context
#SBATCH --requeue
#SBATCH --ntasks=1
{array}# det e create --slurm: one `det-launch experiment --worker` per array task, all on
# the experiment's study. A preempted worker (exit {preempted}: its trial checkpointed) is
# requeued, and the trial resumes.
export DET_EXPERIMENTS_DIR={root}
trap 'true' TERM                         # scancel's TERM reaches the worker itself
trap 'kill -USR1 $worker 2>/dev/null' USR1  # --signal=B:USR1@SECS reaches only this shell
{command} &
worker=$!
wait $worker; status=$?
while [ $status -gt 128 ] && kill -0 $worker 2>/dev/null; do wait $worker; status=$?; done
if [ $status -gt 128 ]; then
  wait $worker 2>/dev/null; again=$?; [ $again -ne 127 ] && status=$again
fi
# ...unless det e pause / cancel / kill stopped the experiment
if [ $status -eq {preempted} ] && [ -n "$SLURM_JOB_ID" ] && [ ! -e {exp_dir}/{paused} ] \
    && [ ! -e {exp_dir}/{killed} ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit $status
"""

K8S = """# det e create --print-k8s: experiment {exp_id}'s workers as a Kubernetes indexed Job
# (docs/search.md). Fill in the image (this project installed, the context's needs too)
# and the claim of a ReadWriteMany volume holding {root} at the same path.
apiVersion: batch/v1
kind: Job
metadata:
  name: det-experiment-{exp_id}
spec:
  completionMode: Indexed
  completions: {workers}
  parallelism: {workers}
  backoffLimit: {backoff}
  template:
    spec:
      restartPolicy: OnFailure
      terminationGracePeriodSeconds: 120
      containers:
        - name: worker
          image: IMAGE
          workingDir: {exp_dir}/context
          command: {command}
          env:
            - name: DET_EXPERIMENTS_DIR
              value: "{root}"
            - name: DET_PREEMPT_GRACE
              value: "90"
          volumeMounts:
            - {{name: experiments, mountPath: "{root}"}}
      volumes:
        - name: experiments
          persistentVolumeClaim: {{claimName: CLAIM}}
"""


def worker_command(exp_dir: pathlib.Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "determined_launch.cli", "experiment", str(exp_dir / "config.yaml"),
            "--worker", "--experiment-dir", str(exp_dir)]


def _workers(exp_dir: pathlib.Path) -> int:
    return expconf.load(exp_dir / "config.yaml").searcher.max_concurrent_trials


def sbatch_script(exp_id: int, exp_dir: pathlib.Path, sbatch_args: Sequence[str]) -> str:
    given = any(a == "--array" or a.startswith(("--array=", "-a")) for a in sbatch_args)
    array = "" if given else f"#SBATCH --array=0-{_workers(exp_dir) - 1}\n"
    return SBATCH.format(exp_id=exp_id, exp_dir=exp_dir, array=array, root=exp_dir.parent,
                         preempted=EXIT_PREEMPTED, command=shlex.join(worker_command(exp_dir)),
                         paused=state.PAUSED, killed=state.KILLED)


def k8s_manifest(exp_id: int, exp_dir: pathlib.Path) -> str:
    workers = _workers(exp_dir)
    command = "[" + ", ".join(f'"{w}"' for w in worker_command(exp_dir, "python3")) + "]"
    return K8S.format(exp_id=exp_id, exp_dir=exp_dir, root=exp_dir.parent, workers=workers,
                      backoff=4 * workers, command=command)


def submit(ns: argparse.Namespace, exp_id: int, exp_dir: pathlib.Path) -> int:
    if ns.print_k8s:
        text = k8s_manifest(exp_id, exp_dir)
        (exp_dir / "k8s-job.yaml").write_text(text)
        print(f"Created experiment {exp_id} (not started: apply the manifest below)",
              file=sys.stderr)
        print(text, end="")
        return 0
    script = exp_dir / "workers.sbatch"
    script.write_text(sbatch_script(exp_id, exp_dir, ns.slurm))
    print(f"Created experiment {exp_id}")
    job = sbatch(exp_dir, ns.slurm)
    print(f"Submitted SLURM job {job} ({script})")
    return 0


def sbatch(exp_dir: pathlib.Path, args: Sequence[str]) -> int:
    """Submit the experiment's workers (again, for det e activate); the job's id."""
    if shutil.which("sbatch") is None:
        raise LaunchError("--slurm: sbatch is not on PATH (run det on a SLURM login node)")
    r = subprocess.run(["sbatch", "--parsable", *args, str(exp_dir / "workers.sbatch")],
                       capture_output=True, text=True, check=False, timeout=60)
    job = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job.isdigit():
        raise LaunchError(f"--slurm: sbatch failed: {(r.stderr or r.stdout).strip()[:500]}")
    state.write_json(exp_dir / state.DRIVER, {"slurm_job": int(job), "started": time.time(),
                                              "argv": None, "sbatch_args": list(args)})
    return int(job)
