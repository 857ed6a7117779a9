"""Host lists as schedulers write them, and turning host names into addresses.

SLURM (and tools that copied it: pdsh, Flux, some PBS sites) compresses node
lists: ``gpu[001-003,010],cpu7`` means ``gpu001 gpu002 gpu003 gpu010 cpu7``.
Peers often take only the first host with a regular expression; the launcher
needs every host, in order, because a node's position in the list is its
rank. Several bracket groups in one name form a product, leftmost slowest
(``r[1-2]n[1-2]`` is ``r1n1 r1n2 r2n1 r2n2``), as ``scontrol show hostnames``
prints them.

Task counts use SLURM's run-length form: ``2(x3),1`` is ``[2, 2, 2, 1]``.

The end of the module holds what the scheduler detectors share: integer
variables, this node's place in a host list, and the slots rule.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Optional

from determined_launch.cluster.info import ClusterInfo
from determined_launch.cluster.local import SLOTS_ENV, LocalMachine, count_visible_gpus
from determined_launch.errors import ClusterInfoError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_NUMBERED = re.compile(r"(.*?)(\d+)")


def _split_top_level(text: str, where: str) -> list[str]:
    """Split on commas that are outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ClusterInfoError(f"{where}: nested '[' in host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ClusterInfoError(f"{where}: unmatched ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ClusterInfoError(f"{where}: unmatched '[' in host list {text!r}")
    parts.append(text[start:])
    return parts


def _expand_range_list(body: str, text: str, where: str) -> list[str]:
    """``001-003,010`` -> ``["001", "002", "003", "010"]`` (padding kept)."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise ClusterInfoError(f"{where}: bad range {item!r} in host list {text!r}")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ClusterInfoError(f"{where}: descending range {item!r} in host list {text!r}")
        # SLURM pads to the width of the lower bound: [08-10] -> 08 09 10.
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(part: str, text: str, where: str) -> list[str]:
    """One comma-free element, possibly with several bracket groups."""
    pieces: list[list[str]] = []
    rest = part
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            pieces.append([rest])
            break
        close_at = rest.index("]", open_at)  # balanced: checked by _split_top_level
        if open_at:
            pieces.append([rest[:open_at]])
        pieces.append(_expand_range_list(rest[open_at + 1 : close_at], text, where))
        rest = rest[close_at + 1 :]
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand_hostlist(text: str, where: str = "host list") -> list[str]:
    """Every host named by a SLURM-style host list, in order.

    Raises ``ClusterInfoError`` naming ``where`` (usually the environment
    variable) for malformed lists, so a typo never becomes a wrong world size.
    """
    text = text.strip()
    if not text:
        raise ClusterInfoError(f"{where}: empty host list")
    hosts: list[str] = []
    for part in _split_top_level(text, where):
        part = part.strip()
        if not part:
            raise ClusterInfoError(f"{where}: empty element in host list {text!r}")
        hosts.extend(_expand_one(part, text, where))
    return hosts


def compress_hostlist(hosts: Sequence[str]) -> str:
    """The inverse of ``expand_hostlist`` for names with one numeric suffix.

    Adjacent names with the same prefix and suffix width fold into one
    bracket group; order is preserved, so ``expand_hostlist`` gives back
    exactly ``hosts``. Used to print long node lists readably.
    """
    groups: list[tuple[str, list[str]]] = []  # (prefix, numbers) or (name, [])
    for host in hosts:
        m = _NUMBERED.fullmatch(host)
        if m and groups and groups[-1][1]:
            prefix, numbers = groups[-1]
            last = numbers[-1]
            if prefix == m.group(1) and _same_width(last, m.group(2)):
                numbers.append(m.group(2))
                continue
        if m:
            groups.append((m.group(1), [m.group(2)]))
        else:
            groups.append((host, []))
    return ",".join(_render_group(prefix, numbers) for prefix, numbers in groups)


def _same_width(a: str, b: str) -> bool:
    """Whether two suffixes can share one bracket group without changing
    their spelling: zero-padded numbers only with the same width."""
    padded_a = a.startswith("0") and len(a) > 1
    padded_b = b.startswith("0") and len(b) > 1
    if padded_a or padded_b:
        return len(a) == len(b)
    return True


def _render_group(prefix: str, numbers: list[str]) -> str:
    if not numbers:
        return prefix
    if len(numbers) == 1:
        return prefix + numbers[0]
    items: list[str] = []
    run = [numbers[0]]
    for n in numbers[1:]:
        if int(n) == int(run[-1]) + 1 and len(n) == len(run[-1]):
            run.append(n)
        else:
            items.append(_render_run(run))
            run = [n]
    items.append(_render_run(run))
    return f"{prefix}[{','.join(items)}]"


def _render_run(run: list[str]) -> str:
    return run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_task_counts(text: str, where: str) -> list[int]:
    """SLURM's ``2(x3),1`` -> ``[2, 2, 2, 1]`` (``SLURM_TASKS_PER_NODE``,
    ``SLURM_JOB_CPUS_PER_NODE``)."""
    counts: list[int] = []
    for item in text.strip().split(","):
        m = _COUNT.fullmatch(item.strip())
        if not m:
            raise ClusterInfoError(
                f"{where}: cannot parse {item!r} in {text!r} (expected N or N(xM))"
            )
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _addresses(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    # IPv4 first: gloo, NCCL's bootstrap and most cluster networks expect it.
    v4 = [str(i[4][0]) for i in infos if i[0] == socket.AF_INET]
    v6 = [str(i[4][0]) for i in infos if i[0] == socket.AF_INET6]
    return v4 + v6


def lookup_address(host: str) -> Optional[str]:
    """The host's address from the system resolver, or ``None``."""
    try:
        found = _addresses(host)
    except (socket.gaierror, UnicodeError):
        return None
    return found[0] if found else None


def resolve_hosts(hosts: Sequence[str], where: str, *, wait_s: float = 0.0) -> list[str]:
    """Addresses for ``hosts`` (same order); names the resolver does not
    know yet are retried for ``wait_s`` seconds (Kubernetes creates a pod's
    DNS record only when the pod exists).

    The launcher resolves names once, up front, so a host that no node can
    reach fails here with its name instead of as a rendezvous timeout later.
    """
    found: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    while True:
        missing = [h for h in dict.fromkeys(hosts) if h not in found]
        for host in missing:
            addr = lookup_address(host)
            if addr is not None:
                found[host] = addr
        missing = [h for h in missing if h not in found]
        if not missing:
            break
        if time.monotonic() >= deadline:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ClusterInfoError(
                f"{where}: cannot resolve host {missing[0]!r}{more} to an address "
                "(not in DNS or /etc/hosts)"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    addrs = [found[h] for h in hosts]
    _check_loopback_mix(hosts, addrs, where)
    return addrs


def _check_loopback_mix(hosts: Sequence[str], addrs: Sequence[str], where: str) -> None:
    """Refuse a host list where some names resolve to loopback and others
    do not: typically ``/etc/hosts`` maps a node's own name to 127.0.1.1, so
    this node would advertise an address the other nodes cannot reach."""
    loop = [i for i, a in enumerate(addrs) if ipaddress.ip_address(a).is_loopback]
    if loop and len(loop) < len(addrs):
        i = loop[0]
        raise ClusterInfoError(
            f"{where}: host {hosts[i]!r} resolves to the loopback address {addrs[i]} on "
            "this node, but other hosts of the job resolve to network addresses; other nodes "
            f"cannot reach {addrs[i]} (fix /etc/hosts or DNS for {hosts[i]!r})"
        )


# --- Shared by the scheduler detectors -----------------------------------------


def env_int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    """An integer environment variable that a scheduler promised to set."""
    raw = env.get(name)
    if raw is None:
        raise ClusterInfoError(f"environment variable {name} is not set")
    try:
        value = int(raw.strip())
    except ValueError:
        raise ClusterInfoError(
            f"environment variable {name}: expected an integer, got {raw!r}"
        ) from None
    if value < minimum:
        raise ClusterInfoError(f"environment variable {name}: must be >= {minimum}, got {value}")
    return value


def this_host_index(hosts: Sequence[str], hostname: str, where: str) -> int:
    """This machine's position in a scheduler's host list.

    LSF and PBS give every node the same list but no per-node index, so the
    node finds itself by name. Names are compared in full and then in their
    short form, because node files mix ``node1`` and ``node1.cluster``.
    """
    for key in (lambda h: h, lambda h: h.split(".")[0]):
        found = [i for i, h in enumerate(hosts) if key(h) == key(hostname)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ClusterInfoError(f"{where}: this host {hostname!r} appears more than once")
    raise ClusterInfoError(
        f"{where}: this host {hostname!r} is not in the job's host list "
        f"({compress_hostlist(list(hosts))}); start the launcher on the job's nodes"
    )


def group_hosts(per_slot: Sequence[str]) -> tuple[list[str], list[int]]:
    """Node files list a host once per slot: ``a a b b`` -> ``([a, b], [2, 2])``.
    Order of first appearance is rank order."""
    hosts: list[str] = []
    counts: dict[str, int] = {}
    for h in per_slot:
        if h not in counts:
            hosts.append(h)
            counts[h] = 0
        counts[h] += 1
    return hosts, [counts[h] for h in hosts]


def node_slots(
    env: Mapping[str, str],
    default: int,
    scheduler_gpus: Optional[int] = None,
    *,
    count_devices: bool = True,
) -> int:
    """Worker slots on this node, the same rule for every scheduler:
    ``DET_LAUNCH_SLOTS`` (the user said so); the scheduler's GPU count for
    this node; the GPUs this process can see (unless ``count_devices`` is
    false: a scheduler that allocates GPUs itself is the authority, and
    device files of GPUs it did not allocate say nothing); else ``default``
    (the scheduler's task or slot count for the node)."""
    if env.get(SLOTS_ENV, "").strip():
        local = LocalMachine().detect(env)  # validates DET_LAUNCH_SLOTS
        if isinstance(local, ClusterInfo):
            return local.slots_per_node
    if scheduler_gpus:
        return scheduler_gpus
    if count_devices:
        return count_visible_gpus(env) or default
    return default


def read_node_file(path: str, var: str) -> list[str]:
    """A scheduler's node file: one host per line (per slot), ``#`` comments."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except OSError as e:
        raise ClusterInfoError(f"{var}={path}: cannot read: {e.strerror}") from None
    hosts = [line.split()[0] for line in lines if line]
    if not hosts:
        raise ClusterInfoError(f"{var}={path}: names no hosts")
    return hosts


def host_list_info(
    env: Mapping[str, str],
    per_slot_hosts: Sequence[str],
    hostname: str,
    *,
    where: str,
    source: str,
) -> ClusterInfo:
    """``ClusterInfo`` for schedulers that hand every node the same per-slot
    host list (LSF, PBS): nodes in order of first appearance, this node found
    by name, the list's slots per host unless ``DET_LAUNCH_SLOTS`` or GPUs
    say otherwise (then the same count on every node)."""
    hosts, counts = group_hosts(per_slot_hosts)
    rank = this_host_index(hosts, hostname, where)
    explicit = node_slots(env, 0)
    slots = [explicit] * len(hosts) if explicit else counts
    return ClusterInfo.from_mapping(
        {
            "container_addrs": resolve_hosts(hosts, where),
            "container_rank": rank,
            "container_slot_counts": slots,
        },
        source=source,
        where=where,
    )
