"""``python -m determined_launch.nodeexec.horovod_rendezvous --addr A --port P --hosts h:n,...``

Horovod's own rendezvous server (the HTTP key-value store horovodrun runs
for gloo), on a port every node knows in advance, for the ssh-free
multi-node mode. horovodrun starts it on a random port and tells workers
over ssh; here the port is the job's master port, so the other nodes'
launchers can point their workers at it without talking first.

It serves until stopped (it is a "service" of the chief's plan). It binds
to the chief's address when that is one of this machine's, else to all
addresses, as horovodrun does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Optional

from determined_launch.nodeexec.gate import is_local_address


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m determined_launch.nodeexec.horovod_rendezvous")
    p.add_argument("--addr", required=True, help="the chief's address")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hosts", required=True, help="HOST:SLOTS,... in rank order")
    p.add_argument("--verbose", action="store_true")
    ns = p.parse_args(argv)
    try:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except ImportError as e:
        print(f"det-launch: error: Horovod is not installed here: {e}", file=sys.stderr)
        return 2
    hosts = parse_hosts(ns.hosts)
    bind = ns.addr if is_local_address(ns.addr) else ""
    try:
        server = RendezvousHTTPServer((bind, ns.port), RendezvousHandler, ns.verbose)
    except OSError as e:
        print(
            f"det-launch: error: rendezvous server cannot listen on {bind or '*'}:{ns.port}: "
            f"{e.strerror}",
            file=sys.stderr,
        )
        return 1
    # Scope sizes let the server forget a rendezvous once every rank is done.
    server.init(get_host_assignments(hosts, sum(h.slots for h in hosts)))
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
