"""Multi-node MPI jobs launched from a session ("launch Horovod job").

The session runs as the user inside its own Slurm job. It validates a request against the
*launch policy* the hub handed it at spawn (the profiles, images and limits this user may
use: the same rules as the spawn form), renders ``templates/mpi_job.sbatch.j2`` and submits
it with ``sbatch`` as itself. Each rank writes its own ``rank-N.out`` / ``rank-N.err`` in the
job's folder (``~/.dsportal/jobs/<stamp>/``, linked as ``~/.dsportal/jobs/<job id>``);
:class:`LogFollower` turns those files into (rank, stream, line) events for the notebook
magic and the server extension's websocket.

Everything here is the user's own business: the policy is the portal's rules shown early and
clearly, not a security boundary (Slurm enforces partitions and limits, and the user could run
``sbatch`` in a terminal anyway). What *is* guarded: nothing a user types reaches a shell
unquoted or an ``#SBATCH`` line unchecked.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spawner import form

from ..cluster.images import image_status
from ..cluster.slurm import UNREACHABLE_HINTS, job_gpus, parse_sinfo_json, partition_resources
from ..launchpolicy import POLICY_ENV, JobRequestError, LaunchPolicy
from ..settings import Image, Profile, described, parse_walltime, shown, whole_number
from ..templating import render
from .containers import Bind, Launch, runtime

JOBS_DIR = ".dsportal/jobs"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"}
REQUEST_FIELDS = ("script", "code", "args", "nodes", "gpus_per_node", "tasks_per_node", "image", "walltime",
                  "profile", "env", "name", "launcher")
LAUNCHERS = ("mpi", "torchrun")  # mpi: the profile's MPI launcher (srun --mpi=... or mpirun)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NODE_TMPDIR_ENV = "DSPORTAL_NODE_TMPDIR"  # the TMPDIR Slurm gave the session job (session.sbatch.j2)
_RESERVED_ENV = re.compile(r"^(SLURM_|SBATCH_|SRUN_|OMPI_|PMIX_|PMI_|TORCHELASTIC_)")
# Set by torchrun for each process of a torchrun job (and RANK names each rank's log file).
_TORCHRUN_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
MAX_CODE = 1_000_000


class JobNotFound(LookupError):
    pass


# ------------------------------------------------------------------------------ policy
_limits_cache: dict[str, tuple[float, dict]] = {}


def with_cluster_limits(policy: LaunchPolicy, max_age: float = 10.0) -> LaunchPolicy:
    """The policy plus, per partition, its usable nodes and the most GPUs one node has, from the
    session's own ``sinfo --json`` (cached briefly). Without an answer the limits stay unknown
    and Slurm itself refuses impossible jobs at sbatch."""
    taken, limits = _limits_cache.get("sinfo", (0.0, {}))
    if time.monotonic() - taken > max_age:
        try:
            resources = partition_resources(parse_sinfo_json(_run(["sinfo", "--json"], timeout=10)))
        except (JobRequestError, SchedulerUnavailable, ValueError):
            return policy
        limits = {"node_gpus": {name: r.most_gpus_on_a_node for name, r in resources.items()},
                  "node_count": {name: r.nodes for name, r in resources.items()}}
        _limits_cache["sinfo"] = (time.monotonic(), limits)
    return policy.model_copy(update=limits)


# ------------------------------------------------------------------------------ request
@dataclass(frozen=True)
class JobPlan:
    profile: Profile
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    mem_mb_per_node: int
    walltime: str
    image: Image | None
    script: str | None  # a file of the user's; None when ``code`` is given
    code: str | None
    args: list[str]
    env: dict[str, str]
    name: str
    launcher: str = "srun"  # srun | mpirun | torchrun

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else ""
        where = f"image {self.image.name}" if self.image else "the session's Python"
        return (f"{self.nodes} node(s) x {self.tasks_per_node} rank(s){gpus} on {self.profile.partition}, "
                f"{where}, {self.launcher}, walltime {self.walltime}")


def _whole(request: dict, name: str, default: int) -> int:
    """A whole-number field (a number, or digits as text from a form); ``default`` when left out."""
    if name not in request or request[name] == "":
        return default
    value = request[name]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = whole_number(value)  # digits 0-9 only: '²' and '٢' are refused in words
    if number is None:
        raise JobRequestError(f"{name} must be a whole number (digits 0-9), not {described(value)}")
    return number


def _text(request: dict, name: str) -> str | None:
    """A text field; None when left out or empty. Anything but text (null included) is refused."""
    if name not in request:
        return None
    value = request[name]
    if not isinstance(value, str):
        raise JobRequestError(f"{name} must be text, not {described(value)}")
    return value or None


def plan_job(request: dict, policy: LaunchPolicy, base_dir: str | os.PathLike) -> JobPlan:
    """Check a request (REST body, magic options, Python API) and return the job to submit."""
    if not isinstance(request, dict):
        raise JobRequestError("a job request is an object like {'script': 'train.py', 'nodes': 2}")
    unknown = sorted(str(k) for k in request if k not in REQUEST_FIELDS)
    if unknown:
        raise JobRequestError(f"unknown field(s) {', '.join(map(shown, unknown))}: allowed are "
                              f"{', '.join(REQUEST_FIELDS)}")
    profile = policy.profile(_text(request, "profile"))
    launcher = request.get("launcher", "")
    launcher = "mpi" if launcher == "" else launcher  # left out: the profile's MPI launcher
    if not isinstance(launcher, str) or launcher not in LAUNCHERS:
        raise JobRequestError(f"launcher must be one of {', '.join(LAUNCHERS)}, not {described(launcher)}")
    if launcher == "torchrun" and not profile.jobs.torchrun:
        raise JobRequestError(f"{profile.display_name} does not offer torchrun jobs")
    launcher = profile.jobs.launcher if launcher == "mpi" else launcher

    nodes = _whole(request, "nodes", 1)
    if nodes < 1:
        raise JobRequestError(f"a job needs at least 1 node, not {nodes}")
    most_nodes = profile.jobs.max_nodes or policy.node_count.get(profile.partition)
    if most_nodes and nodes > most_nodes:
        raise JobRequestError(f"{nodes} nodes is more than {profile.display_name} allows for one job ({most_nodes})")

    gpus = _whole(request, "gpus_per_node", profile.default_gpus)
    node_gpus = policy.node_gpus.get(profile.partition)
    if gpus < 0:
        raise JobRequestError(f"gpus_per_node cannot be negative ({gpus})")
    if node_gpus is not None and gpus > node_gpus:
        raise JobRequestError(f"{gpus} GPUs per node is more than a node of partition {profile.partition} has "
                              f"({node_gpus})")
    walltime = _text(request, "walltime") or profile.jobs.default_walltime
    try:
        chosen = form.session_slice(profile, gpus, walltime)
    except form.RequestError as error:
        raise JobRequestError(str(error).replace("GPUs is not offered", "GPUs per node is not offered")) from None

    tasks = _whole(request, "tasks_per_node", gpus or 1)
    if not 1 <= tasks <= chosen.cpus:
        raise JobRequestError(f"tasks_per_node must be between 1 and the {chosen.cpus} CPUs of the slice, not {tasks}")

    image = None
    image_name = _text(request, "image")
    if image_name:
        allowed = {i.name: i for i in policy.images_for(profile)}
        if image_name not in allowed:
            offered = ", ".join(allowed) or "none"
            raise JobRequestError(f"unknown image {shown(image_name)} for {profile.display_name}: choose one of "
                                  f"{offered}")
        image = allowed[image_name]
        status, detail = image_status(image)
        if status != "built":
            raise JobRequestError(f"image {image.name} is unavailable ({status}: {detail}); ask your admin to build it")

    script, code = _text(request, "script"), _text(request, "code")
    if (script is None) == (code is None):
        raise JobRequestError("give either 'script' (a Python file) or 'code' (Python source), not both or neither")
    if code is not None:
        if len(code) > MAX_CODE:
            raise JobRequestError("code must be Python source text of at most 1 MB")
        script = None
    else:
        if "\0" in script or "\n" in script:
            raise JobRequestError(f"script must be a file name, not {shown(script)}")
        path = Path(os.path.expanduser(script))
        path = path if path.is_absolute() else Path(base_dir) / path
        if not path.is_file():
            raise JobRequestError(f"no such script: {path}")
        if not os.access(path, os.R_OK):
            raise JobRequestError(f"script {path} is not readable")
        script, code = str(path.resolve()), None

    args = request.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        raise JobRequestError(f"args must be a list of text, not {described(args)}")

    overrides = request.get("env", {})
    if not isinstance(overrides, dict):
        raise JobRequestError(f"env must be an object of NAME: value, not {described(overrides)}")
    for key, value in overrides.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise JobRequestError(f"environment variable name {shown(key)} is not valid (letters, digits, _)")
        if _RESERVED_ENV.match(key) or key in _TORCHRUN_ENV:
            raise JobRequestError(f"{key} is set by Slurm/MPI/torchrun for each rank and cannot be overridden")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or "\n" in str(value) or "\0" in str(value):
            raise JobRequestError(f"the value of {key} must be one line of text")
    env = {**profile.jobs.env, **{k: str(v) for k, v in overrides.items()}}

    name = _text(request, "name")
    if name is None:
        stem = Path(script).stem if script else "cell"
        prefix = "ddp-" if launcher == "torchrun" else "hvd-"
        name = prefix + (re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:40] or "job")
    elif not _NAME.match(name):
        raise JobRequestError(f"job name {shown(name)} may hold only letters, digits, '_', '.', '-' (at most 64)")

    return JobPlan(
        profile=profile, nodes=nodes, gpus_per_node=gpus, tasks_per_node=tasks,
        cpus_per_task=max(1, chosen.cpus // tasks), mem_mb_per_node=chosen.mem_mb, walltime=chosen.walltime,
        image=image, script=script, code=code, args=list(args), env=env, name=name, launcher=launcher,
    )


# ------------------------------------------------------------------------------ submitting
def _rank_argv(plan: JobPlan, script: str, policy: LaunchPolicy, home: str) -> list[str]:
    """What each rank runs: the script, inside the image when one is chosen (outside-in launch)."""
    if plan.image is None:
        return [f"{policy.environment.rstrip('/')}/bin/python", "-u", script, *plan.args]
    backend = runtime(plan.image.runtime, plan.image.runtime_binary)
    binds = ([Bind(home, home)] + [Bind(str(m.source), m.target, m.read_only) for m in policy.data_mounts]
             + [Bind(path, path) for path in plan.profile.jobs.container_binds])
    launch = Launch(image=str(plan.image.path), binds=binds, command=[plan.image.python, "-u", script, *plan.args])
    return backend.argv(launch)


def render_script(plan: JobPlan, policy: LaunchPolicy, job_dir: str, script: str, home: str) -> str:
    env = dict(plan.env)
    if plan.image is not None:
        env.update(runtime(plan.image.runtime).environment({}))
    return render(
        "mpi_job.sbatch.j2",
        plan=plan, profile=plan.profile.model_dump(), job_dir=job_dir, env=env,
        argv=_rank_argv(plan, script, policy, home), workdir=home,
        torchrun=f"{policy.environment.rstrip('/')}/bin/torchrun",
    )


def _submit_env() -> dict[str, str]:
    """The session's environment minus what would leak the session's own job into the new one."""
    drop = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "JUPYTER", "JPY_", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
            "ROCR_VISIBLE_DEVICES", POLICY_ENV)
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    # The session's TMPDIR is a private folder on its own node that ends with it: a job gets the
    # TMPDIR the session job itself was given (none: the node's /tmp, private to the job where
    # Slurm's job_container/tmpfs is on).
    node_tmpdir = env.pop(NODE_TMPDIR_ENV, "")
    env.pop("TMPDIR", None)
    if node_tmpdir:
        env["TMPDIR"] = node_tmpdir
    return env


def _run(argv: list[str], input: str | None = None, timeout: float = 30) -> str:
    try:
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout,
                                env=_submit_env())
    except FileNotFoundError:
        raise JobRequestError(f"{argv[0]} is not installed on this node") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailable(f"{Path(argv[0]).name} did not answer within {timeout:.0f} s") from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
        if any(hint in message for hint in UNREACHABLE_HINTS):
            raise SchedulerUnavailable(message)
        raise SlurmRefused(message)
    return result.stdout


class SlurmRefused(JobRequestError):
    """sbatch/scancel said no; the message is Slurm's own."""


class SchedulerUnavailable(RuntimeError):
    """slurmctld did not answer."""


def jobs_root(home: str | None = None) -> Path:
    return Path(home or os.path.expanduser("~")) / JOBS_DIR


def submit(plan: JobPlan, policy: LaunchPolicy, home: str | None = None) -> "JobInfo":
    """sbatch the plan as the calling user; returns the job with its log folder."""
    home = home or os.path.expanduser("~")
    root = jobs_root(home)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_dir = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    job_dir.mkdir(mode=0o700)
    script = plan.script
    if plan.code is not None:
        script = str(job_dir / "cell.py")
        Path(script).write_text(plan.code)
    text = render_script(plan, policy, str(job_dir), script, home)
    (job_dir / "job.sbatch").write_text(text)
    out = _run(["sbatch", "--parsable", str(job_dir / "job.sbatch")])
    try:
        job_id = int(out.strip().splitlines()[-1].split(";")[0])
    except (ValueError, IndexError):
        raise SlurmRefused(f"sbatch gave no job id: {out.strip()!r}") from None
    info = JobInfo(job_id=job_id, name=plan.name, folder=str(job_dir), submitted=time.time(),
                   nodes=plan.nodes, ranks=plan.ranks, gpus_per_node=plan.gpus_per_node,
                   partition=plan.profile.partition, image=plan.image.name if plan.image else None,
                   script=script, description=plan.describe())
    (job_dir / "job.json").write_text(json.dumps(asdict(info), indent=1))
    link = root / str(job_id)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(job_dir.name)
    return info


# ------------------------------------------------------------------------------ state
@dataclass
class JobInfo:
    job_id: int
    name: str
    folder: str
    submitted: float
    nodes: int
    ranks: int
    gpus_per_node: int
    partition: str
    image: str | None
    script: str | None
    description: str = ""
    state: str = "PENDING"
    reason: str = ""
    exit_code: str = ""
    node_list: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED or self.state == "UNKNOWN"

    def as_dict(self) -> dict:
        return {**asdict(self), "finished": self.finished}


def _scontrol_jobs(job_id: int | None = None) -> dict[int, dict[str, str]]:
    argv = ["scontrol", "show", "job", "-o"] + ([str(int(job_id))] if job_id is not None else [])
    try:
        out = _run(argv)
    except SlurmRefused as error:
        if "Invalid job id" in str(error):
            return {}
        raise
    jobs = {}
    for line in out.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "JobId" in fields:
            jobs[int(fields["JobId"])] = fields
    return jobs


def session_slice(environ=os.environ) -> dict:
    """What this session's own job holds (the JupyterLab status bar): GPUs, CPUs, memory, and the
    walltime left as Slurm counts it (TimeLimit - RunTime, so no clock or time zone is involved)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    cpus = environ.get("SLURM_CPUS_PER_TASK") or environ.get("SLURM_CPUS_ON_NODE") or "0"
    mem = environ.get("SLURM_MEM_PER_NODE") or "0"
    found = {"job_id": whole_number(job_id), "partition": environ.get("SLURM_JOB_PARTITION", ""),
             "gpus": len(job_gpus(environ)), "cpus": whole_number(cpus) or 0,
             "memory_mb": whole_number(mem) or 0, "time_limit_s": None, "time_left_s": None, "node": ""}
    if found["job_id"] is None:
        return found
    fields = _scontrol_jobs(found["job_id"]).get(found["job_id"], {})
    try:
        limit, ran = parse_walltime(fields["TimeLimit"]), parse_walltime(fields["RunTime"])
    except (KeyError, ValueError):  # UNLIMITED, or slurmctld forgot the job
        return found
    found.update(time_limit_s=limit, time_left_s=max(0, limit - ran), node=fields.get("NodeList", ""))
    return found


ACCOUNTING_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Submit")


def parse_sacct(text: str, fields=ACCOUNTING_FIELDS) -> dict[int, dict[str, str]]:
    """`sacct -X -n -P -o <fields>` lines -> {job id: {field: value}}; 'CANCELLED by 5101' -> 'CANCELLED'.
    Where an id comes round again (a reset cluster), the newest submission wins."""
    jobs = {}
    for line in text.splitlines():
        values = line.split("|")
        if len(values) != len(fields) or not values[0].isdigit():
            continue
        record = dict(zip(fields, values))
        if "State" in record:
            record["State"] = record["State"].split()[0] if record["State"] else "UNKNOWN"
        earlier = jobs.get(int(values[0]))
        if earlier is None or record.get("Submit", "") >= earlier.get("Submit", ""):
            jobs[int(values[0])] = record
    return jobs


def _sacct_jobs(job_ids: list[int]) -> dict[int, dict[str, str]]:
    """Final states from Slurm accounting, for jobs slurmctld no longer remembers; {} without it."""
    if not job_ids:
        return {}
    try:
        out = _run(["sacct", "-X", "-n", "-P", "-j", ",".join(str(int(j)) for j in job_ids),
                    "-o", ",".join(ACCOUNTING_FIELDS)], timeout=15)
    except (JobRequestError, SchedulerUnavailable):
        return {}  # no slurmdbd on this cluster, or it does not answer
    return parse_sacct(out)


def load(job_id: int, home: str | None = None, slurm: dict[int, dict[str, str]] | None = None,
         accounting: dict[int, dict[str, str]] | None = None) -> JobInfo:
    """The job as recorded in its folder, with its current state from Slurm (or its last known one)."""
    root = jobs_root(home)
    link = root / str(int(job_id))
    try:
        folder = root / os.readlink(link)
        data = json.loads((folder / "job.json").read_text())
    except (OSError, ValueError):
        raise JobNotFound(f"job {job_id} was not launched from your sessions") from None
    info = JobInfo(**{k: v for k, v in data.items() if k in JobInfo.__dataclass_fields__})
    info.folder = str(folder)
    final = folder / "state.json"
    if final.exists():
        info.__dict__.update(json.loads(final.read_text()))
        return info
    fields = (slurm if slurm is not None else _scontrol_jobs(job_id)).get(int(job_id))
    if fields is None:
        # Forgotten by slurmctld (MinJobAge) before anyone saw it end: accounting remembers.
        record = (accounting if accounting is not None else _sacct_jobs([job_id])).get(int(job_id))
        if record is None:
            info.state, info.reason = "UNKNOWN", "Slurm no longer knows this job"
        else:
            info.state, info.reason = record["State"], "from Slurm accounting"
            info.exit_code = record.get("ExitCode", "")
            info.node_list = "" if record.get("NodeList") in (None, "", "None assigned") else record["NodeList"]
    else:
        info.state = fields.get("JobState", "UNKNOWN")
        info.reason = fields.get("Reason", "")
        info.exit_code = fields.get("ExitCode", "")
        info.node_list = "" if fields.get("NodeList") in (None, "(null)") else fields["NodeList"]
    if info.finished:
        final.write_text(json.dumps({k: getattr(info, k) for k in ("state", "reason", "exit_code", "node_list")}))
    return info


def list_jobs(home: str | None = None, limit: int = 50) -> list[JobInfo]:
    root = jobs_root(home)
    if not root.is_dir():
        return []
    # Newest first by submission (the folders are named by time): job ids restart when a
    # cluster's Slurm state is reset, so the highest id is not the latest job.
    links = [(os.readlink(p), int(p.name)) for p in root.iterdir() if p.name.isdigit() and p.is_symlink()]
    ids = [job_id for _, job_id in sorted(links, reverse=True)[:limit]]
    slurm = _scontrol_jobs() if ids else {}
    # One sacct for all the jobs slurmctld forgot whose end nobody recorded yet.
    forgotten = [j for j in ids if j not in slurm and not (root / str(j) / "state.json").exists()]
    accounting = _sacct_jobs(forgotten)
    jobs = []
    for job_id in ids:
        try:
            jobs.append(load(job_id, home, slurm, accounting))
        except JobNotFound:
            continue
    return jobs


def cancel(job_id: int, home: str | None = None) -> JobInfo:
    info = load(job_id, home)  # only jobs launched from the user's sessions
    if not info.finished:
        _run(["scancel", str(int(job_id))])
    return info


# ------------------------------------------------------------------------------ logs
_RANK_FILE = re.compile(r"^rank-(\d+)\.(out|err)$")


@dataclass
class LogFollower:
    """Reads each rank's new complete lines since the last call: events for the magic and the websocket."""

    folder: Path
    offsets: dict[str, int] = field(default_factory=dict)
    partial: dict[str, str] = field(default_factory=dict)

    def _files(self) -> list[tuple[Path, int | None, str]]:
        files = []
        try:
            entries = sorted(os.listdir(self.folder))
        except OSError:
            return files
        for entry in entries:
            match = _RANK_FILE.match(entry)
            if match:
                stream = "stdout" if match.group(2) == "out" else "stderr"
                files.append((self.folder / entry, int(match.group(1)), stream))
            elif entry == "batch.log":
                files.append((self.folder / entry, None, "batch"))
        return files

    def poll(self, final: bool = False) -> list[dict]:
        events = []
        for path, rank, stream in self._files():
            key = path.name
            try:
                with open(path, "rb") as handle:
                    handle.seek(self.offsets.get(key, 0))
                    data = handle.read(4 * 2**20)
                    self.offsets[key] = handle.tell()
            except OSError:
                continue
            text = self.partial.pop(key, "") + data.decode(errors="replace")
            lines = text.split("\n")
            rest = lines.pop()
            if rest and final:
                lines.append(rest)
            elif rest:
                self.partial[key] = rest
            events += [{"rank": rank, "stream": stream, "line": line.rstrip("\r")} for line in lines]
        return events


def format_event(event: dict) -> str:
    who = "batch" if event["rank"] is None else f"rank {event['rank']}"
    return f"[{who}] {event['line']}"
