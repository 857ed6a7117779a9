"""``--min-nodes`` claims and presence in an S3, GCS or Azure bucket: nothing shared but it.

Kubernetes pods and spot VMs share no file system: every node has its own
run directory, but they all see the job's checkpoint storage. When that is
S3 (GCS, Azure), the files ``signed_files.SignedDir`` keeps in ``<run_dir>/generations``
live under ``<prefix>/.det-launch/<job>/generations/`` instead, with the
same names, the same signatures and the same rules (``claims``):

* create-if-absent is a conditional put (``If-None-Match: *``; GCS:
  ``ifGenerationMatch=0``; fsspec's ``mode="create"``): of two groups of
  survivors that claim one generation, the store accepts exactly one;
* replace-if-unchanged is ``If-Match: <etag>`` (GCS: ``ifGenerationMatch=<the
  generation read>``, gcsfs has no argument for it: ``_gcs_replace``);
* an alive file is a plain put (only its own node writes it), and its age is
  the bucket's clock (``LastModified``, GCS's ``updated``), as the directory's is the file
  system's: the nodes' clocks may differ.

The client is the checkpoint storage's own (``objectstore.make_filesystem``:
s3fs, gcsfs, adlfs): the same credentials, endpoint and retries. A
request that fails counts as "not there now" (a read) or "not written" (a
write), as an unreadable file does in the directory: a claim that cannot be
made stops the group that needs it, never a second group.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import secrets
import zlib
from typing import Any, Callable, Optional
from urllib.parse import quote

from determined_launch.launch.signed_files import (
    CLAIMS_DIR,
    MAX_BYTES,
    claims_key,
    printable,
    say,
    sign,
)
from determined_launch.launch.signed_files import verify as _verify

#: under the checkpoint storage's prefix; the job's name follows
BUCKET_DIR = ".det-launch"


@dataclasses.dataclass(frozen=True)
class Stamp:
    """What ``stat`` tells of an object (the names of ``os.stat_result``'s fields
    that the claims read): a new object has a new etag or a newer time."""

    st_ino: int
    st_mtime: float
    st_mtime_ns: int
    etag: str


class SignedBucket:
    """The signed files of one job under ``<url>/.det-launch/<job>/generations``."""

    def __init__(self, fs: Any, url: str, job: str, secret: str,
                 say: Callable[[str], None] = say) -> None:
        self.fs = fs
        self.protocol = url.partition("://")[0]
        base = fs._strip_protocol(url).rstrip("/")
        self.bucket = base.partition("/")[0]
        self.root = "/".join((base, BUCKET_DIR, job, CLAIMS_DIR))
        #: printable, never with credentials
        self.path = f"{self.protocol}://{self.root}"
        self.key = claims_key(secret)
        self.say = say
        self._told: set[str] = set()

    # ------------------------------------------------------------------ the store
    def refusal(self) -> Optional[str]:
        return None  # who may write the bucket is its credentials' business, not a mode's

    def unwritable(self) -> Optional[str]:
        """Why objects cannot be made here (one line; ``None``: they can)."""
        probe = f"{self.root}/.probe.{secrets.token_hex(6)}"
        try:
            self.fs.pipe_file(probe, b"-", mode="create")
        except Exception as e:  # any failure: the launcher stops before anything starts
            return f"cannot write in {self.path}: {_line(e)}"
        # Best effort: the chief's reset() may have removed it already (GCS, Azure: 404),
        # which once stopped a starting worker ("cannot write in ...") on fake-gcs-server.
        self.unlink(probe.rsplit("/", 1)[-1])
        return None

    def reset(self) -> None:
        """A new job: every object of an earlier one goes."""
        for name in self.names():
            self.unlink(name)

    def names(self) -> list[str]:
        self.fs.invalidate_cache(self.root)  # other nodes write: never a cached listing
        try:
            return [str(p).rstrip("/").rsplit("/", 1)[-1]
                    for p in self.fs.ls(self.root, detail=False)]
        except Exception:
            return []

    def write(self, name: str, text: str, exclusive: bool = False) -> bool:
        """``name`` holds ``text``, signed. ``exclusive``: only if no ``name``
        exists yet (``If-None-Match: *``; False if one does)."""
        try:
            self.fs.pipe_file(f"{self.root}/{name}", sign(self.key, name, text),
                              mode="create" if exclusive else "overwrite")
            return True
        except Exception:  # 412/409 (FileExistsError) or the request failed
            return False

    def replace(self, name: str, text: str, seen: Stamp) -> bool:
        """``name`` holds ``text`` if it is still the object ``seen`` (``If-Match``)."""
        if self.protocol == "gs":
            try:
                _gcs_replace(self.fs, self.bucket, f"{self.root}/{name}".partition("/")[2],
                             sign(self.key, name, text), seen.etag)
                return True
            except Exception:
                return False
        if self.protocol == "az":
            from azure.core import MatchConditions

            cond: dict[str, Any] = {"etag": seen.etag,
                                    "match_condition": MatchConditions.IfNotModified}
        else:
            cond = {"IfMatch": seen.etag}
        try:
            self.fs.pipe_file(f"{self.root}/{name}", sign(self.key, name, text), **cond)
            return True
        except Exception:
            return False

    def read(self, name: str) -> Optional[str]:
        """The text of ``name`` if this job signed it; ``None`` if absent or not (told once)."""
        try:  # a bounded range: an object planted there may be of any size
            raw = self.fs.cat_file(f"{self.root}/{name}", start=0, end=MAX_BYTES + 1)
        except Exception:
            return None
        text = None if len(raw) > MAX_BYTES else _verify(self.key, name, raw)
        if text is None:
            self.tell(name, f"over {MAX_BYTES // 1024} KiB" if len(raw) > MAX_BYTES else
                      "not signed with this job's key (another job's, or not a launcher's)")
        return text

    def stat(self, name: str) -> Optional[Stamp]:
        path = f"{self.root}/{name}"
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except Exception:
            return None
        # GCS: the object's generation is what a conditional write names (a new object, a new one)
        etag = str(info.get("generation") if self.protocol == "gs" else
                   info.get("ETag") or info.get("etag") or "")
        when = info.get("LastModified") or info.get("last_modified") or info.get("mtime")
        if not etag or not isinstance(when, datetime.datetime):
            return None
        stamp = when.timestamp()
        return Stamp(zlib.crc32(etag.encode()), stamp, int(stamp * 1e9), etag)

    def unlink(self, name: str) -> None:
        try:
            self.fs.rm_file(f"{self.root}/{name}")
        except Exception:
            pass

    def tell(self, name: str, why: str) -> None:
        """Name an object that is ignored, once per name."""
        if name not in self._told:
            self._told.add(name)
            self.say(f"ignoring {self.path}/{printable(name)}: {why}")


def job_name(trial_id: int, experiment_id: Optional[int]) -> str:
    """The job's folder in the bucket: one per trial, as its run directory."""
    return f"trial-{trial_id}" if experiment_id is None else (
        f"experiment-{experiment_id}-trial-{trial_id}")


def _gcs_replace(fs: Any, bucket: str, key: str, data: bytes, generation: str) -> None:
    """Upload ``data`` as ``key`` only if its live generation is ``generation``
    (a JSON API multipart upload, as gcsfs's own small uploads; 412: FileExistsError)."""
    boundary = "det-launch-" + secrets.token_hex(8)
    head = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
            f"{json.dumps({'name': key})}\r\n--{boundary}\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n")
    body = head.encode() + data + f"\r\n--{boundary}--".encode()
    fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
            uploadType="multipart", ifGenerationMatch=generation, data=body,
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'})


def _line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
