"""Helper programs that plans run on the nodes, each ``python -m
determined_launch.nodeexec.<name>``: ``gate`` (check, then exec the command),
``sshd`` (the job's OpenSSH server, bound to this node's address) and
``horovod_rendezvous`` (Horovod's rendezvous server for ssh-free jobs).

They start in front of every worker, so they stay light: standard library
and ``envvars`` only, never the launcher, the supervisor or ``core``.
"""
