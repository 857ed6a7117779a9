"""Determined's own rendezvous files, so our launchers run unchanged inside a
real Determined task.

Determined's agent writes ``rendezvous.json`` (addresses, rank, slot counts),
``cluster.json`` (slot ids, latest checkpoint, ...) and, for trials,
``trial.json`` into ``/run/determined/info``. We read only the fields the
launch layer needs and ignore the rest, so newer Determined versions that add
fields keep working.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from determined_launch.cluster.base import Detection, Detector, NoMatch
from determined_launch.cluster.info import ClusterInfo, HugeInteger, parse_json_int
from determined_launch.errors import ClusterInfoError

DEFAULT_INFO_DIR = "/run/determined/info"
#: Overrides the directory; used by tests and by unusual container layouts.
INFO_DIR_ENV = "DET_INFO_DIR"


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_int=parse_json_int)
    except OSError as e:
        raise ClusterInfoError(f"Determined info file {path}: cannot read: {e.strerror}") from None
    except HugeInteger as e:
        raise ClusterInfoError(f"Determined info file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ClusterInfoError(
            f"Determined info file {path}: invalid JSON at line {e.lineno}: {e.msg}"
        ) from None


class DeterminedInfoDir(Detector):
    """``/run/determined/info/{rendezvous,cluster,trial}.json``."""

    name = "determined"

    def detect(self, env: Mapping[str, str]) -> Detection:
        info_dir = env.get(INFO_DIR_ENV, DEFAULT_INFO_DIR)
        rendezvous_path = os.path.join(info_dir, "rendezvous.json")
        if not os.path.exists(rendezvous_path):
            return NoMatch(f"{rendezvous_path} does not exist")

        rendezvous = _read_json(rendezvous_path)
        if not isinstance(rendezvous, dict):
            raise ClusterInfoError(f"Determined info file {rendezvous_path}: expected an object")
        doc: dict[str, Any] = {
            k: rendezvous[k]
            for k in ("container_addrs", "container_rank", "container_slot_counts")
            if k in rendezvous
        }

        cluster_path = os.path.join(info_dir, "cluster.json")
        if os.path.exists(cluster_path):
            cluster = _read_json(cluster_path)
            if isinstance(cluster, dict):
                if cluster.get("slot_ids") is not None:
                    doc["slot_ids"] = cluster["slot_ids"]
                if cluster.get("latest_checkpoint"):
                    doc["latest_checkpoint"] = cluster["latest_checkpoint"]

        trial_path = os.path.join(info_dir, "trial.json")
        if os.path.exists(trial_path):
            trial = _read_json(trial_path)
            if isinstance(trial, dict) and "trial_id" in trial:
                doc["trial"] = {
                    "trial_id": trial["trial_id"],
                    "hparams": trial.get("hparams") or {},
                    "trial_seed": trial.get("trial_seed", 0),
                    "experiment_id": trial.get("experiment_id"),
                }
        return ClusterInfo.from_mapping(doc, source=self.name, where=f"Determined info {info_dir}")
