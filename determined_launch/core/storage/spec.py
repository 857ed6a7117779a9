"""Where checkpoints go: one parser for every way a user names checkpoint storage.

Accepted forms (``core.init(checkpoint_storage=...)``, ``DET_CHECKPOINT_STORAGE``,
the cluster-info file's ``checkpoint_storage``, ``det-launch checkpoints gc``):

- a directory path, or ``file:///path``;
- a URL: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``
  (``memory://`` too: fsspec's in-process store, for tests);
- Determined's ``checkpoint_storage`` block, as a mapping or a YAML file holding
  one (bare, or under a ``checkpoint_storage:`` key as in an experiment config).

Every mistake is one line naming the field and where it came from.
Credentials are kept in ``options`` (never in ``url``, never in ``repr``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Optional

from determined_launch import values
from determined_launch.errors import LaunchError


class StorageConfigError(LaunchError):
    """Checkpoint storage is misconfigured (bad URL, block, missing extra)."""


@dataclasses.dataclass(frozen=True)
class Retention:
    """Determined's ``save_*`` policy. Only built when the user configured one:
    without it nothing is ever deleted."""

    save_trial_latest: int = 1
    save_trial_best: int = 1
    save_experiment_best: int = 0


@dataclasses.dataclass(frozen=True)
class StorageSpec:
    """A parsed storage location. ``protocol == "file"`` means a directory."""

    protocol: str
    #: For ``file``: an absolute directory; otherwise ``bucket/prefix`` (no scheme).
    root: str
    #: fsspec constructor arguments (may hold credentials).
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    retention: Optional[Retention] = None

    @property
    def url(self) -> str:
        """Printable location, never with credentials."""
        return self.root if self.protocol == "file" else f"{self.protocol}://{self.root}"

    @property
    def is_directory(self) -> bool:
        return self.protocol == "file"


#: URL scheme -> (fsspec protocol, module needed, extra to install).
_SCHEMES: dict[str, tuple[str, Optional[str], Optional[str]]] = {
    "s3": ("s3", "s3fs", "s3"),
    "gs": ("gs", "gcsfs", "gcs"),
    "gcs": ("gs", "gcsfs", "gcs"),
    "az": ("az", "adlfs", "azure"),
    "abfs": ("az", "adlfs", "azure"),
    "memory": ("memory", None, None),
}

_COMMON_KEYS = {"type", "save_experiment_best", "save_trial_best", "save_trial_latest"}
_TYPE_KEYS: dict[str, set[str]] = {
    "shared_fs": {"host_path", "storage_path", "container_path", "propagation"},
    "directory": {"container_path"},
    "s3": {"bucket", "prefix", "endpoint_url", "access_key", "secret_key"},
    "gcs": {"bucket", "prefix"},
    "azure": {"container", "prefix", "connection_string", "account_url", "credential"},
}


def require_extra(protocol: str, url: str) -> None:
    """A missing optional dependency is one line naming the extra to install."""
    for _scheme, (proto, module, extra) in _SCHEMES.items():
        if proto == protocol and module is not None:
            if importlib.util.find_spec(module) is None:
                raise StorageConfigError(
                    f"checkpoint storage {url} needs {module}: "
                    f"pip install 'determined_launch[{extra}]'"
                )
            return


def parse_storage(value: Any, *, where: str) -> StorageSpec:
    """Parse any accepted form; ``where`` names the origin in errors."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, Mapping):
        return _parse_block(value, where)
    if not isinstance(value, str) or not value.strip():
        raise StorageConfigError(
            f"{where}: expected a directory, a URL or a checkpoint_storage block, got {value!r}"
        )
    value = value.strip()
    if "://" not in value and value.endswith((".yaml", ".yml")) and not os.path.isdir(value):
        if not os.path.isfile(value):  # a typo must not become a new directory
            raise StorageConfigError(f"{where}: {value}: no such YAML file")
        return _parse_block(_load_yaml(value), f"{where} ({value})")
    if "://" not in value:
        return StorageSpec("file", str(pathlib.Path(value).expanduser().absolute()))
    return _parse_url(value, where)


def _parse_url(url: str, where: str) -> StorageSpec:
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme == "file":
        if not rest.startswith("/"):
            raise StorageConfigError(f"{where}: {url!r}: a file:// URL needs an absolute path")
        return StorageSpec("file", str(pathlib.Path(rest).absolute()))
    if scheme not in _SCHEMES:
        raise StorageConfigError(
            f"{where}: {url!r}: unsupported scheme {scheme!r} "
            "(use a directory, file://, s3://, gs:// or az://)"
        )
    protocol = _SCHEMES[scheme][0]
    root = rest.strip("/")
    if not root or root.startswith("/"):
        raise StorageConfigError(f"{where}: {url!r}: missing the bucket (or container) name")
    spec = StorageSpec(protocol, root)
    require_extra(protocol, spec.url)
    return spec


def _load_yaml(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise StorageConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}"
                                 ) from None
    try:
        data = values.yaml_document(text, path)
    except ValueError as e:
        raise StorageConfigError(str(e)) from None
    if isinstance(data, Mapping) and "checkpoint_storage" in data:
        data = data["checkpoint_storage"]
    return data


def _field(where: str, name: str, problem: str) -> StorageConfigError:
    return StorageConfigError(f"{where}: checkpoint_storage.{name}: {problem}")


def _string(block: Mapping[str, Any], name: str, where: str, *, required: bool) -> Optional[str]:
    value = block.get(name)
    if value is None:
        if required:
            raise _field(where, name, "missing")
        return None
    if not isinstance(value, str) or not value.strip():
        raise _field(where, name, f"expected a non-empty string, got {type(value).__name__}")
    return value.strip()


def _retention(block: Mapping[str, Any], where: str) -> Optional[Retention]:
    given = {k: block[k] for k in ("save_trial_latest", "save_trial_best",
                                   "save_experiment_best") if block.get(k) is not None}
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _field(where, key, f"expected an integer >= 0, got {value!r}")
    return Retention(**given) if given else None


def _parse_block(block: Any, where: str) -> StorageSpec:
    if not isinstance(block, Mapping):
        raise StorageConfigError(f"{where}: checkpoint_storage: expected a mapping with a 'type'")
    kind = block.get("type")
    if kind not in _TYPE_KEYS:
        raise _field(where, "type", f"unknown type {kind!r} (expected one of {sorted(_TYPE_KEYS)})")
    unknown = sorted(set(block) - _COMMON_KEYS - _TYPE_KEYS[kind])
    if unknown:
        known = sorted(_COMMON_KEYS | _TYPE_KEYS[kind])
        close = difflib.get_close_matches(str(unknown[0]), known, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise _field(where, unknown[0], f"unknown key for type {kind}{hint}")
    retention = _retention(block, where)
    if kind in ("shared_fs", "directory"):
        return StorageSpec("file", _block_directory(block, kind, where), retention=retention)
    if kind == "azure":
        container = _string(block, "container", where, required=True)
        options = {k: block[k] for k in ("connection_string", "account_url", "credential")
                   if block.get(k) is not None}
        if "account_url" in options:
            # adlfs takes the account name, not the URL.
            host = str(options.pop("account_url")).split("://")[-1]
            options["account_name"] = host.split(".")[0]
        prefix = _string(block, "prefix", where, required=False)
        root = "/".join(p.strip("/") for p in (container, prefix) if p)
        spec = StorageSpec("az", root, options, retention)
    else:
        bucket = _string(block, "bucket", where, required=True)
        prefix = _string(block, "prefix", where, required=False)
        root = "/".join(p.strip("/") for p in (bucket, prefix) if p)
        options = {}
        if kind == "s3":
            keys = {"access_key": "key", "secret_key": "secret", "endpoint_url": "endpoint_url"}
            options = {ours: block[theirs] for theirs, ours in keys.items()
                       if block.get(theirs) is not None}
            if ("key" in options) != ("secret" in options):
                raise _field(where, "secret_key" if "key" in options else "access_key",
                             "access_key and secret_key must be given together")
        spec = StorageSpec("s3" if kind == "s3" else "gs", root, options, retention)
    require_extra(spec.protocol, spec.url)
    return spec


def _block_directory(block: Mapping[str, Any], kind: str, where: str) -> str:
    if kind == "directory":
        path = _string(block, "container_path", where, required=True)
        return str(pathlib.Path(str(path)).expanduser().absolute())
    host = _string(block, "host_path", where, required=True)
    sub = _string(block, "storage_path", where, required=False)
    base = pathlib.Path(str(host)).expanduser()
    if sub:
        # Determined: storage_path is relative to host_path, or absolute inside it.
        sub_path = pathlib.Path(sub)
        base = sub_path if sub_path.is_absolute() else base / sub_path
    return str(base.absolute())
