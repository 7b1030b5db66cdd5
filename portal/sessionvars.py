"""Every variable dsportal puts in a session job's environment, named here and nowhere else.

The hub sets most of them (spawner/gpuspawner.py's get_env; templates/session.sbatch.j2 gets the
names through portal/templating.py as ``vars``); the session reads them (portal/session/).
No imports: every side, the session's start included, may read this module for nothing.
"""

# Set by the hub for the session's Jupyter server.
ACTIVITY_INTERVAL = "DSPORTAL_ACTIVITY_INTERVAL"  # seconds between the session's activity reports
GPU_BUSY_PERCENT = "DSPORTAL_GPU_BUSY_PERCENT"  # GPU utilisation from which the slice's GPUs count as in use
IDLE_LIMIT = "DSPORTAL_IDLE_LIMIT"  # seconds: the profile's idle limit for this slice
SAVE_AHEAD = "DSPORTAL_SAVE_AHEAD"  # seconds: Slurm signals the walltime's end this long before it (--signal)
LAUNCH_POLICY = "DSPORTAL_LAUNCH_POLICY"  # JSON: the profiles, images, mounts the job launcher may use (rules.LaunchPolicy)
TOOLS = "DSPORTAL_TOOLS"  # JSON: what the profile offers besides notebooks (portal.session.tools.Tools)
TEMPLATES = "DSPORTAL_TEMPLATES"  # JSON: the template sources this user sees (templatesources.Spec)
SHARING = "DSPORTAL_SHARING"  # JSON: the sharing groups of the session's owner (portal.session.sharing); absent: not shareable
REPORT_WAIT = "DSPORTAL_REPORT_WAIT"  # seconds: the hub's limit for this start; its port report waits as long
SERVICE_URL = "DSPORTAL_SERVICE_URL"  # dsportal's JupyterHub service (more walltime: portal.hub.extend)

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

# Set by `dsportal templates check` for the notebooks it runs.
TEMPLATE_CHECK = "DSPORTAL_TEMPLATE_CHECK"  # "1": notebooks pick their short settings (fewer epochs)
TEMPLATE_RUN = "DSPORTAL_TEMPLATE_RUN"  # marks the check's own processes, to find what they leave behind
