"""Helper programs that plans run on the nodes, each ``python -m
determined_launch.nodeexec.<name>``: ``gate`` (check, then exec the command),
``sshd`` (the job's OpenSSH server, bound to this node's address),
``horovod_rendezvous`` (Horovod's rendezvous server for ssh-free jobs) and
``horovodrun`` (horovodrun with output threads that cannot splice lines).

They start in front of every worker, so they stay light: standard library,
``envvars`` and ``wrap_rank`` only (and the tool they wrap), never the
launcher, the supervisor or ``core``.
"""
