"""``ClusterInfo``: where this node sits in the job, validated once.

Every detector produces the same frozen ``ClusterInfo`` through
``ClusterInfo.from_mapping``, so validation lives in exactly one place and
every source reports mistakes the same way: one line naming the source and
the field.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from determined_launch import values
from determined_launch.errors import ClusterInfoError

#: Larger than any real cluster info file; bounds what a typo can cost.
_MAX_FILE_BYTES = 16 * 1024 * 1024
#: Integers in the file fit in 64 bits (ids, seeds, lengths).
_MAX_INT = 2**63 - 1
#: Digits of the longest integer literal a file may hold: Python refuses to
#: convert over 4300 (a ValueError, not a JSON error), and nothing here needs 1000.
_MAX_INT_DIGITS = 1000
_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def is_host_address(text: str) -> bool:
    """An IPv4/IPv6 address or an RFC 1123 host name (underscores tolerated,
    as some schedulers use them)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    if len(text) > 253:
        return False
    return all(_HOST_LABEL.fullmatch(label) for label in text.rstrip(".").split("."))


class HugeInteger(ValueError):
    """An integer literal too long to be anything but a mistake."""


def parse_json_int(text: str) -> int:
    """``parse_int`` for ``json.load``: a one-line error for a huge literal."""
    digits = len(text.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise HugeInteger(f"an integer with {digits} digits ({text[:12]}...); "
                          f"at most {_MAX_INT_DIGITS}")
    return int(text)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


_TOP_LEVEL_KEYS = {
    "container_addrs",
    "container_rank",
    "container_slot_counts",
    "slot_ids",
    "trial",
    "latest_checkpoint",
    "job_secret",
    "resolved",  # a launcher already decided trial and latest_checkpoint (local_trial.py)
    "checkpoint_storage",
    "source",  # informational: which detector produced a file the launcher wrote
}


_SECRET_STORAGE_KEYS = {"access_key", "secret_key", "connection_string", "credential"}


class MissingHParamError(KeyError):
    """A hyperparameter looked up in a trial that nothing gave any: a
    ``KeyError`` (code catching one still works) whose message says the fix."""

    def __str__(self) -> str:  # KeyError's own quotes its argument
        return str(self.args[0]) if self.args else ""


class NoHParams(dict[str, Any]):
    """The empty hyperparameters of a local trial nothing gave any (no
    ``--hparams``, no ``--config``): a missing key names the fix in one line."""

    def __missing__(self, key: Any) -> Any:
        raise MissingHParamError(
            f"hyperparameter {key!r}: this trial has no hyperparameters (nothing gave any); "
            "give them with det-launch --config const.yaml (its hyperparameters block) "
            "or --hparams JSON|FILE")


@dataclasses.dataclass(frozen=True)
class TrialInfo:
    """The seed's ``info.trial``: identity and hyperparameters of this run."""

    trial_id: int
    hparams: Mapping[str, Any]
    trial_seed: int = 0
    experiment_id: Optional[int] = None
    # The searcher's target length; ``core.init``'s searcher uses it when set.
    max_length: Optional[int] = None
    # The local trial (cluster/local_trial.py): no scheduler named one.
    local: bool = False

    def __post_init__(self) -> None:
        if self.local and not self.hparams and not isinstance(self.hparams, NoHParams):
            object.__setattr__(self, "hparams", NoHParams())


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """Rendezvous information for one node (one "container") of a job.

    Attributes mirror Determined's ``det.get_cluster_info()`` so that seed
    code reading ``info.container_addrs`` or ``info.trial.hparams`` runs as is.
    """

    container_addrs: tuple[str, ...]
    container_rank: int
    container_slot_counts: tuple[int, ...]
    slot_ids: tuple[int, ...]
    source: str
    trial: Optional[TrialInfo] = None
    latest_checkpoint: Optional[str] = None
    #: trial and latest_checkpoint are final (a launcher decided them for its workers)
    resolved: bool = False
    # Shared secret for authenticating launcher and DistributedContext
    # traffic; never printed (see ``to_dict``).
    job_secret: Optional[str] = dataclasses.field(default=None, repr=False)
    # A directory, a URL or a Determined storage block (core.init parses it);
    # hidden from repr: a block may carry credentials.
    checkpoint_storage: Optional[Any] = dataclasses.field(default=None, repr=False)

    @property
    def chief_ip(self) -> str:
        return self.container_addrs[0]

    @property
    def num_nodes(self) -> int:
        return len(self.container_addrs)

    @property
    def slots_per_node(self) -> int:
        """This node's slot count."""
        return self.container_slot_counts[self.container_rank]

    @property
    def total_slots(self) -> int:
        return sum(self.container_slot_counts)

    @property
    def is_chief(self) -> bool:
        return self.container_rank == 0

    @property
    def single_node(self) -> bool:
        return self.num_nodes == 1

    def to_file_dict(self) -> dict[str, Any]:
        """The cluster-info file schema; what launchers hand their workers.

        The secret is left out: workers receive it in ``DET_DIST_SECRET``.
        """
        return {
            "source": self.source,
            "container_addrs": list(self.container_addrs),
            "container_rank": self.container_rank,
            "container_slot_counts": list(self.container_slot_counts),
            "slot_ids": list(self.slot_ids),
            "latest_checkpoint": self.latest_checkpoint,
            "trial": dataclasses.asdict(self.trial) if self.trial else None,
            "resolved": self.resolved,
            **({"checkpoint_storage": self.checkpoint_storage}
               if self.checkpoint_storage is not None else {}),
        }

    def to_dict(self, *, include_secret: bool = False) -> dict[str, Any]:
        """JSON-ready form, in the cluster-info file schema plus derived fields."""
        out = self.to_file_dict()
        out.update(chief_ip=self.chief_ip, num_nodes=self.num_nodes)
        if isinstance(self.checkpoint_storage, Mapping):
            # Printed by `det-launch info`: never show credentials.
            out["checkpoint_storage"] = {
                k: ("<set>" if k in _SECRET_STORAGE_KEYS and v else v)
                for k, v in self.checkpoint_storage.items()
            }
        if include_secret:
            out["job_secret"] = self.job_secret
        else:
            out["job_secret"] = "<set>" if self.job_secret else None
        return out

    @classmethod
    def from_mapping(cls, data: Any, *, source: str, where: str) -> ClusterInfo:
        """Validate ``data`` (a decoded cluster-info document).

        ``where`` names the origin in error messages (a file path or an
        environment variable), ``source`` names the detector.
        """
        return _Validator(where).cluster_info(data, source)

    @classmethod
    def from_json_file(cls, path: str, *, source: str) -> ClusterInfo:
        where = f"cluster info file {path}"
        try:
            with open(path, "rb") as f:
                raw = f.read(_MAX_FILE_BYTES + 1)
        except OSError as e:
            raise ClusterInfoError(f"{where}: cannot read: {e.strerror}") from None
        if len(raw) > _MAX_FILE_BYTES:
            raise ClusterInfoError(f"{where}: larger than {_MAX_FILE_BYTES} bytes; not a "
                                   "cluster info file?")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ClusterInfoError(
                f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                "write it as UTF-8 JSON"
            ) from None
        try:
            data = json.loads(text, parse_int=parse_json_int)
        except HugeInteger as e:
            raise ClusterInfoError(f"{where}: {e}") from None
        except json.JSONDecodeError as e:
            raise ClusterInfoError(
                f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
            ) from None
        except RecursionError:
            raise ClusterInfoError(f"{where}: JSON nested too deeply") from None
        return cls.from_mapping(data, source=source, where=where)


class _Validator:
    """Type checks that name the offending field; bool is never an int here."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, problem: str) -> ClusterInfoError:
        return ClusterInfoError(f"{self.where}: field '{field}': {problem}")

    def integer(
        self, value: Any, field: str, *, minimum: Optional[int] = None, maximum: int = _MAX_INT
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"expected an integer, got {_short(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(field, f"must be >= {minimum}, got {_short(value)}")
        if value > maximum:
            raise self.fail(field, f"must be <= {maximum}, got {_short(value)}")
        return value

    def int_list(
        self, value: Any, field: str, *, minimum: int, maximum: int = _MAX_INT
    ) -> tuple[int, ...]:
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            raise self.fail(field, f"expected a list of integers, got {_short(value)}")
        return tuple(
            self.integer(v, f"{field}[{i}]", minimum=minimum, maximum=maximum)
            for i, v in enumerate(value)
        )

    def required(self, data: Mapping[str, Any], field: str) -> Any:
        if field not in data:
            raise self.fail(field, "missing")
        return data[field]

    def cluster_info(self, data: Any, source: str) -> ClusterInfo:
        if not isinstance(data, Mapping):
            raise ClusterInfoError(f"{self.where}: expected a JSON object at the top level")
        unknown = sorted(set(data) - _TOP_LEVEL_KEYS)
        if unknown:
            raise self.fail(unknown[0], f"unknown key (expected one of {sorted(_TOP_LEVEL_KEYS)})")

        addrs_raw = self.required(data, "container_addrs")
        if not isinstance(addrs_raw, Sequence) or isinstance(addrs_raw, (str, bytes)):
            raise self.fail("container_addrs", "expected a list of host addresses")
        if not addrs_raw:
            raise self.fail("container_addrs", "must name at least one node")
        for i, a in enumerate(addrs_raw):
            if not isinstance(a, str) or not a.strip():
                raise self.fail(f"container_addrs[{i}]", f"expected a host, got {json.dumps(a)}")
        addrs = tuple(a.strip() for a in addrs_raw)
        if len(addrs) > values.MAX_NODES:
            raise self.fail("container_addrs", f"{len(addrs)} nodes; at most {values.MAX_NODES}")
        for i, a in enumerate(addrs):
            if not is_host_address(a):
                raise self.fail(
                    f"container_addrs[{i}]",
                    f"{json.dumps(a)} is not an IP address or host name",
                )

        rank = self.integer(self.required(data, "container_rank"), "container_rank", minimum=0)
        if rank >= len(addrs):
            raise self.fail(
                "container_rank", f"{rank} is out of range for {len(addrs)} container_addrs"
            )

        counts = self.int_list(
            self.required(data, "container_slot_counts"), "container_slot_counts", minimum=1,
            maximum=values.MAX_SLOTS_PER_NODE,
        )
        if len(counts) != len(addrs):
            raise self.fail(
                "container_slot_counts",
                f"has {len(counts)} entries but container_addrs has {len(addrs)}",
            )

        if data.get("slot_ids") is None:
            slot_ids = tuple(range(counts[rank]))
        else:
            slot_ids = self.int_list(data["slot_ids"], "slot_ids", minimum=0)
            if len(slot_ids) != counts[rank]:
                raise self.fail(
                    "slot_ids",
                    f"has {len(slot_ids)} entries but this node's slot count "
                    f"(container_slot_counts[{rank}]) is {counts[rank]}",
                )

        latest = data.get("latest_checkpoint")
        if latest is not None and not isinstance(latest, str):
            raise self.fail("latest_checkpoint", "expected a string (a checkpoint storage id)")

        origin = data.get("source")
        if origin is not None and not isinstance(origin, str):
            raise self.fail("source", "expected a string")
        resolved = data.get("resolved", False)
        if not isinstance(resolved, bool):
            raise self.fail("resolved", "expected true or false")
        storage = data.get("checkpoint_storage")
        if storage is not None and not (
            (isinstance(storage, str) and storage.strip()) or isinstance(storage, Mapping)
        ):
            raise self.fail("checkpoint_storage",
                            "expected a directory, a URL or a storage block (an object)")
        secret = data.get("job_secret")
        if secret is not None and (not isinstance(secret, str) or len(secret) < 16):
            raise self.fail("job_secret", "expected a string of at least 16 characters")

        return ClusterInfo(
            container_addrs=addrs,
            container_rank=rank,
            container_slot_counts=counts,
            slot_ids=slot_ids,
            source=origin or source,
            trial=self.trial(data.get("trial")),
            latest_checkpoint=latest,
            resolved=resolved,
            job_secret=secret,
            checkpoint_storage=dict(storage) if isinstance(storage, Mapping) else storage,
        )

    def trial(self, data: Any) -> Optional[TrialInfo]:
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise self.fail("trial", "expected an object")
        if "trial_id" not in data:
            raise self.fail("trial.trial_id", "missing")
        trial_id = self.integer(data["trial_id"], "trial.trial_id")
        hparams = data.get("hparams", {})
        if not isinstance(hparams, Mapping):
            raise self.fail("trial.hparams", "expected an object")
        seed = self.integer(data.get("trial_seed", 0), "trial.trial_seed", minimum=0,
                            maximum=2**32 - 1)
        exp = data.get("experiment_id")
        if exp is not None:
            exp = self.integer(exp, "trial.experiment_id")
        max_length = data.get("max_length")
        if max_length is not None:
            max_length = self.integer(max_length, "trial.max_length", minimum=1)
        local = data.get("local", False)
        if not isinstance(local, bool):
            raise self.fail("trial.local", "expected true or false")
        return TrialInfo(
            trial_id=trial_id,
            hparams=dict(hparams),
            trial_seed=seed,
            experiment_id=exp,
            max_length=max_length,
            local=local,
        )
