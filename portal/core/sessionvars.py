"""Every variable dsportal puts in a session job's environment, named here and nowhere else.

The hub sets most of them (spawner/gpuspawner.py's get_env; templates/session.sbatch.j2 gets the
names through portal/core/templating.py as ``vars``); the session reads them (portal/session/).
No imports: every side, the session's start included, may read this module for nothing.
"""

# Set by the hub for the session's Jupyter server: everything it tells the session, as one JSON spec
# (portal.core.sessionspec.SessionSpec: activity interval, idle limit, walltime's warning, port report's wait,
# dsportal's service, tools, job launch policy, sharing groups, template sources).
SESSION = "DSPORTAL_SESSION"

# Set by the session's batch script (templates/session.sbatch.j2).
KERNEL_CATALOG = "DSPORTAL_KERNEL_CATALOG"  # JSON: the profile's images and data mounts, for kernelspecs
GPU_SHARE = "DSPORTAL_GPU_SHARE"  # "1/4": the session holds one share of a GPU (Slurm's shard GRES), not whole GPUs
SESSION_DIR = "DSPORTAL_SESSION_DIR"  # the session's private folder (on JUPYTER_PATH)
NODE_TMPDIR = "DSPORTAL_NODE_TMPDIR"  # the TMPDIR Slurm gave the session job: what its launched jobs get

# Set inside the session.
REPORT_PORT = "DSPORTAL_REPORT_PORT"  # set by singleuser: this server is a session job's and reports its port

# Not a variable: the line a session writes to its log (the user's) when its walltime ends, naming the
# files JupyterLab saved; the hub quotes it on the page that says the walltime ended.
WALLTIME_SAVED = "dsportal: saved before the walltime ended:"
# Nor this: the line it writes as Slurm preempts it (a requeued job's page says it was preempted by it).
PREEMPTED = "dsportal: Slurm preempts this session"

# Set by `dsportal templates check` for the notebooks it runs.
TEMPLATE_CHECK = "DSPORTAL_TEMPLATE_CHECK"  # "1": notebooks pick their short settings (fewer epochs)
TEMPLATE_RUN = "DSPORTAL_TEMPLATE_RUN"  # marks the check's own processes, to find what they leave behind
