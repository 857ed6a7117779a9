"""Names of the environment variables that connect the layers.

One module, so that the launcher that sets a variable and the library that
reads it can never disagree on its spelling. README's "Environment variables"
table documents each for users.
"""

# --- set by the scheduler or the user, read by the launcher -------------------
C10D_PORT = "C10D_PORT"  # torchrun master port on the chief (multi-node default 29400)
PREEMPT_FILE = "DET_PREEMPT_FILE"  # operator touches this file to request preemption

# --- set by our launchers for every worker -----------------------------------
CHIEF_IP = "DET_CHIEF_IP"
CLUSTER_INFO_FILE = "DET_CLUSTER_INFO_FILE"  # the launcher's resolved info, 0600, in the job dir
JOB_DIR = "DET_LAUNCH_JOB_DIR"  # per-job, per-node 0700 directory, removed at exit
USE_TORCH_DISTRIBUTED = "USE_TORCH_DISTRIBUTED"
USE_HOROVOD = "USE_HOROVOD"
USE_DEEPSPEED = "USE_DEEPSPEED"

# DistributedContext transport (core/distributed/).
DIST_SECRET = "DET_DIST_SECRET"  # job secret for HMAC-SHA256; hex or any string >= 16 chars
DIST_PORT = "DET_DIST_PORT"  # chief's TCP port for cross-node traffic
DIST_IPC_DIR = "DET_DIST_IPC_DIR"  # private directory for node-local ipc:// sockets
DIST_TIMEOUT = "DET_DIST_TIMEOUT"  # seconds; overall timeout for one collective
DIST_TRANSPORT = "DET_DIST_TRANSPORT"  # "direct" (default) or "zmq"

# Local Core API (core.init): where metrics and checkpoints go.
RUN_DIR = "DET_RUN_DIR"  # run directory for metrics (default ./det_runs/trial-<id>)
CHECKPOINT_STORAGE = "DET_CHECKPOINT_STORAGE"  # checkpoint storage: directory, URL or block file
ALERT_WEBHOOK = "DET_ALERT_WEBHOOK"  # core_context.alert() also POSTs here (http/https URL)
REPORT_TO = "DET_REPORT_TO"  # experiment trackers the chief reports to: mlflow,wandb,tensorboard
SEARCHER_METRIC = "DET_SEARCHER_METRIC"  # the metric retention keeps the best by (the searcher's)
SMALLER_IS_BETTER = "DET_SMALLER_IS_BETTER"  # true/false for that metric
SEARCHER_UNIT = "DET_SEARCHER_UNIT"  # BATCHES/RECORDS/EPOCHS: get_configured_units()

# Preemption plumbing between a node's launcher and its workers.
PREEMPT_SIGNAL_FILE = "DET_PREEMPT_SIGNAL_FILE"  # launcher creates it when preemption is requested
PREEMPT_ACK_FILE = "DET_PREEMPT_ACK_FILE"  # a worker creates it to acknowledge
# A worker that watches for preemption (core.init) creates it, so the launcher
# gives the workers a grace period; without it a preemption signal stops at once.
PREEMPT_LISTEN_FILE = "DET_PREEMPT_LISTEN_FILE"

# wrap_rank writes "<dir>/rank-<N>.json" when its child exits, so the
# supervisor learns which rank failed first and how. Standard-library side:
# wrap_rank/__init__.py spells the same name.
WRAP_RANK_STATUS_DIR = "WRAP_RANK_STATUS_DIR"
# core.init()'s clean exit writes "<that dir>/rank-<N>.finished" (a file name,
# not a variable): a rank that then dies at interpreter exit is reported as one
# that had finished its work.
RANK_FINISHED_FILE = "rank-{rank}.finished"
# A collective that failed because peers vanished writes "<that dir>/rank-<N>.lost-<P,Q>"
# (an empty file; the name is the note): rank N's failure is a consequence of theirs,
# so the verdict never names N first while one of them failed too.
RANK_LOST_FILE = "rank-{rank}.lost-{peers}"
# While core.init()'s context is open, each rank keeps "<that dir>/rank-<N>.progress" (pid, steps,
# busy seconds, time; rewritten at most once a second) for the launcher's hang watchdog and
# straggler check, and dumps its Python stacks into "rank-<N>.stack" on PROGRESS_STACK_SIGNAL.
RANK_PROGRESS_FILE = "rank-{rank}.progress"
RANK_STACK_FILE = "rank-{rank}.stack"
PROGRESS_STACK_OFFSET = 5  # the signal is SIGRTMIN + this: no one else's
PROGRESS_PERIOD = 1.0  # seconds: at most one rewrite of the line per rank

# --- multi-node modes of the Horovod and DeepSpeed launchers -----------------
SSH_MODE = "DET_LAUNCH_SSH"  # "1": multi-node jobs start over ssh (backends/ssh.py)
SSH_PORT = "DTRAIN_SSH_PORT"  # the job's sshd port on every node (Determined's name)
DETECTOR = "DET_LAUNCH_DETECTOR"  # use only this detector (cluster/detect.py); it must match
DISABLE_DETECTORS = "DET_LAUNCH_DISABLE_DETECTORS"  # comma-separated detectors to skip
CONNECT_TIMEOUT = "DET_LAUNCH_CONNECT_TIMEOUT"  # seconds nodes wait for each other
# node-env.json of the node (nodeexec/gate.py loads it before a worker starts):
SSHD_NODE_ENV = "DET_LAUNCH_SSHD_NODE_ENV"  # set by the job's sshd in its sessions
NODE_ENV_FILE = "DET_LAUNCH_NODE_ENV_FILE"  # set by the launcher for its own workers
