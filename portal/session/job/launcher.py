"""Multi-node MPI jobs launched from a session ("launch Horovod job").

The session runs as the user inside its own Slurm job. It checks a request against the
*launch policy* the hub handed it at spawn (the profiles, images and limits this user may
use: portal/core/rules.py, the same rules as the spawn form), renders ``templates/mpi_job.sbatch.j2``
and submits it as itself, through the Slurm adapter's blocking client (portal/slurm/slurmclient.py).
Each rank writes its own ``rank-N.out`` / ``rank-N.err`` in the job's folder (``~/.dsportal/jobs/<stamp>/``,
linked as ``~/.dsportal/jobs/<job id>``);
:class:`LogFollower` turns those files into (rank, stream, line) events for the notebook
magic and the server extension's websocket.

Everything here is the user's own business: the policy is the portal's rules shown early and
clearly, not a security boundary (Slurm enforces partitions and limits, and the user could run
``sbatch`` in a terminal anyway). What *is* guarded: nothing a user types reaches a shell
unquoted or an ``#SBATCH`` line unchecked.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from portal.core import sessionvars
from portal.core.images import image_status
from portal.core.rules import RESULT_COLUMNS, JobPlan, JobRequest, LaunchPolicy, RequestError, plan_job, share_name
from portal.core.settings import parse_walltime, whole_number
from portal.core.templating import render
from portal.core.wholefile import write_whole
from portal.session.kernel.containers import Bind, Launch, runtime
from portal.session.notebookjob import INPUT, SPEC, output_name, record_name
from portal.session.usage.sliceusage import share_per_gpu
from portal.slurm.slurmclient import SlurmCommands, SlurmError, job_gpus, partition_resources
from portal.slurm.slurmparse import array_task_ids

JOBS_DIR = ".dsportal/jobs"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"}


class JobNotFound(LookupError):
    pass


# ------------------------------------------------------------------------------ policy
_limits_cache: dict[str, tuple[float, dict]] = {}


def with_cluster_limits(policy: LaunchPolicy, max_age: float = 10.0) -> LaunchPolicy:
    """The policy plus, per partition, its usable nodes and the most GPUs one node has, from the
    session's own listing of the nodes (slurmparse.nodes_argv; cached briefly). Without an answer the limits
    stay unknown and Slurm itself refuses impossible jobs at sbatch."""
    taken, limits = _limits_cache.get("sinfo", (0.0, {}))
    if time.monotonic() - taken > max_age:
        try:
            resources = partition_resources(slurm().nodes(timeout=10))
        except (SlurmError, ValueError):
            return policy
        limits = {"node_gpus": {name: r.most_gpus_on_a_node for name, r in resources.items()},
                  "node_count": {name: r.nodes for name, r in resources.items()}}
        _limits_cache["sinfo"] = (time.monotonic(), limits)
    offered = {profile.partition for profile in policy.profiles}  # her profiles' partitions, not the cluster's
    return policy.model_copy(update={key: {name: n for name, n in values.items() if name in offered}
                                     for key, values in limits.items()})


def plan(request: dict, policy: LaunchPolicy, base_dir: str | os.PathLike) -> JobPlan:
    """A request (REST body, magic options, Python API) checked against the rules, its image
    built on this cluster: the job to submit."""
    return plan_job(JobRequest.parse(request), policy, base_dir, image_status)


# ------------------------------------------------------------------------------ submitting
def _rank_argv(plan: JobPlan, script: str, policy: LaunchPolicy, home: str) -> list[str]:
    """What each rank runs: the script, inside the image when one is chosen (outside-in launch)."""
    if plan.image is None:
        return [f"{policy.environment.rstrip('/')}/bin/python", "-u", script, *plan.args]
    backend = runtime(plan.image.runtime, plan.image.runtime_binary)
    binds = ([Bind(home, home)] + [Bind(str(m.source), m.target, m.read_only) for m in policy.data_mounts]
             + [Bind(path, path) for path in plan.profile.jobs.container_binds])
    launch = Launch(image=str(plan.image.path), binds=binds, command=[plan.image.python, "-u", script, *plan.args],
                    gpus=plan.gpus_per_node > 0, ranks=True)
    return backend.argv(launch)


def launching_session(environ=os.environ) -> tuple[str, int | None]:
    """The session a job is launched from: its name (JupyterHub's server name, '' for the default
    session) and its own Slurm job id (None outside a session job)."""
    return environ.get("JUPYTERHUB_SERVER_NAME", ""), whole_number(environ.get("SLURM_JOB_ID", ""))


def render_script(plan: JobPlan, policy: LaunchPolicy, job_dir: str, script: str, home: str) -> str:
    env = dict(plan.env)
    if plan.image is not None:
        env.update(runtime(plan.image.runtime).environment({}))
    return render(
        "mpi_job.sbatch.j2",
        plan=plan, profile=plan.profile.model_dump(), job_dir=job_dir, env=env,
        argv=_rank_argv(plan, script, policy, home), workdir=home,
        torchrun=f"{policy.environment.rstrip('/')}/bin/torchrun",
        session_job=launching_session()[1],
    )


def render_notebook_script(plan: JobPlan, policy: LaunchPolicy, job_dir: str, home: str) -> str:
    return render(
        "notebook_job.sbatch.j2",
        plan=plan, profile=plan.profile.model_dump(), job_dir=job_dir, env=dict(plan.env), workdir=home,
        python=f"{policy.environment.rstrip('/')}/bin/python", session_job=launching_session()[1],
    )


def _notebook_spec(plan: JobPlan, policy: LaunchPolicy, home: str, shown_as: str | None = None) -> dict:
    """What each run reads in its job (portal/session/notebookjob.py): its parameters, its kernel's image.
    ``shown_as``: the notebook the user named, where the job runs a copy kept elsewhere (a schedule's)."""
    return {"notebook": shown_as or plan.notebook, "cwd": str(Path(shown_as or plan.notebook).parent),
            "parameters": plan.parameters,
            "points": list(plan.points),
            "image": plan.image.model_dump(mode="json") if plan.image else None,
            "mounts": [m.model_dump(mode="json") for m in policy.data_mounts] if plan.image else [],
            "home": home, "gpus": plan.gpus_per_node}


def _submit_env() -> dict[str, str]:
    """The session's environment minus what would leak the session's own job into the new one."""
    drop = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "JUPYTER", "JPY_", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
            "ROCR_VISIBLE_DEVICES", sessionvars.SESSION, "DSPORTAL_LAUNCH_POLICY")  # (0.3's name of the policy)
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env["SLURM_BITSTR_LEN"] = "0"  # an array's task ids in full in scontrol's answers, never cut short with "..."
    # The session's TMPDIR is a private folder on its own node that ends with it: a job gets the
    # TMPDIR the session job itself was given (none: the node's /tmp, private to the job where
    # Slurm's job_container/tmpfs is on).
    node_tmpdir = env.pop(sessionvars.NODE_TMPDIR, "")
    env.pop("TMPDIR", None)
    if node_tmpdir:
        env["TMPDIR"] = node_tmpdir
    return env


def slurm() -> SlurmCommands:
    """The session's Slurm commands, run as its user with the environment a new job should get."""
    return SlurmCommands(env=_submit_env())


def jobs_root(home: str | None = None) -> Path:
    return Path(home or os.path.expanduser("~")) / JOBS_DIR


def _read_notebook(path: str) -> bytes:
    """The notebook's bytes, judged and read through one open file: a file someone else can replace
    (a shared folder's) cannot become a FIFO or /dev/zero between the check and the copy."""
    too_big = RequestError(f"{path} is over {MAX_NOTEBOOK_BYTES // 2**20} MB: clear its outputs first "
                           "(Edit > Clear Outputs of All Cells)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise RequestError(f"notebook {path} cannot be read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"notebook {path} is not a regular file")
        if st.st_size > MAX_NOTEBOOK_BYTES:
            raise too_big
        data = file.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise too_big
    why = not_a_notebook(data)
    if why:
        raise RequestError(f"{path} is not a Jupyter notebook: {why}. Nothing was submitted.")
    return data


def not_a_notebook(data: bytes) -> str | None:
    """Why ``data`` is not a notebook the job's runner can execute (nbformat's reader, as nbclient reads
    it in the job), in words; None when it is one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "it is not text (a notebook is JSON in UTF-8)"
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return "its content is not JSON (a file renamed to .ipynb?)"
    if not isinstance(found, dict) or "nbformat" not in found:  # nbformat's reader would take it as version 1
        return "its JSON is not a notebook's (it names no nbformat version)"
    if found.get("nbformat") == 4 and not isinstance(found.get("cells"), list):
        return "its JSON is not a notebook's (no list of cells)"
    if len(data) > FULLY_READ_BYTES:  # nbformat's reader parses again and validates: seconds and GBs at 50 MB
        return None
    import nbformat  # here: a session's start does not load it

    try:
        nbformat.reads(text, as_version=4)
    except Exception as error:  # noqa: BLE001 - JSON, but not of a notebook: nbformat's own reason
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        return f"its JSON is not a notebook's ({reason})"
    return None


def submit(plan: JobPlan, policy: LaunchPolicy, home: str | None = None, shown_as: str | None = None,
           schedule: str = "") -> JobInfo:
    """sbatch the plan as the calling user; returns the job with its log folder. A schedule's run
    (portal/session/job/schedules.py) names its schedule, and the notebook as the user named it."""
    home = home or os.path.expanduser("~")
    notebook = _read_notebook(plan.notebook) if plan.notebook is not None else None
    root = jobs_root(home)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_dir = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    job_dir.mkdir(mode=0o700)
    script = plan.script
    if plan.notebook is not None:
        # The notebook as it is now: editing it while the job waits or runs changes nothing of the job.
        (job_dir / INPUT).write_bytes(notebook)
        (job_dir / SPEC).write_text(json.dumps(_notebook_spec(plan, policy, home, shown_as), indent=1))
        text = render_notebook_script(plan, policy, str(job_dir), home)
    else:
        if plan.code is not None:
            script = str(job_dir / "cell.py")
            Path(script).write_text(plan.code)
        text = render_script(plan, policy, str(job_dir), script, home)
    (job_dir / "job.sbatch").write_text(text)
    job_id = slurm().submit_file(str(job_dir / "job.sbatch"))
    session, session_job = launching_session()
    info = JobInfo(job_id=job_id, name=plan.name, folder=str(job_dir), submitted=time.time(),
                   nodes=plan.nodes, ranks=plan.ranks, gpus_per_node=plan.gpus_per_node,
                   partition=plan.profile.partition, image=plan.image.name if plan.image else None,
                   script=script, description=plan.describe(), session=session, session_job=session_job,
                   kind="notebook" if plan.notebook else "mpi", notebook=shown_as or plan.notebook,
                   runs=len(plan.points), schedule=schedule)
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
    # The session it was launched from (several per user: JupyterHub's named servers): its name ('' for
    # the default one) and its Slurm job id; jobs from before sessions were recorded have neither.
    session: str = ""
    session_job: int | None = None
    kind: str = "mpi"  # mpi (Horovod, torchrun, a script or cell) | notebook (a notebook run headless)
    notebook: str | None = None  # the notebook as the user named it (the job runs its copy)
    runs: int = 0  # a notebook job's runs: 1, or one per point of its grid (a Slurm array)
    schedule: str = ""  # the schedule whose run this is (portal/session/job/schedules.py), if any
    state: str = "PENDING"
    reason: str = ""
    exit_code: str = ""
    node_list: str = ""
    run_states: dict[str, str] = field(default_factory=dict)  # a notebook job's runs: "0" -> COMPLETED, ...

    @property
    def finished(self) -> bool:
        return self.state in FINISHED or self.state == "UNKNOWN"

    def as_dict(self) -> dict:
        this = self.session_job is not None and self.session_job == launching_session()[1]
        return {**asdict(self), "finished": self.finished, "from_this_session": this}


def held_slice(environ=os.environ) -> dict:
    """What this session's own job holds (the JupyterLab status bar): GPUs, CPUs, memory, and the
    walltime left as Slurm counts it (TimeLimit - RunTime, so no clock or time zone is involved)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    cpus = environ.get("SLURM_CPUS_PER_TASK") or environ.get("SLURM_CPUS_ON_NODE") or "0"
    mem = environ.get("SLURM_MEM_PER_NODE") or "0"
    share = share_per_gpu(environ)
    found = {"job_id": whole_number(job_id), "partition": environ.get("SLURM_JOB_PARTITION", ""),
             "gpus": 0 if share else len(job_gpus(environ)), "cpus": whole_number(cpus) or 0,
             "share": share_name(share) if share else None,
             "memory_mb": whole_number(mem) or 0, "time_limit_s": None, "time_left_s": None, "node": ""}
    if found["job_id"] is None:
        return found
    fields = slurm().jobs(found["job_id"]).get(found["job_id"], {})
    try:
        limit, ran = parse_walltime(fields["TimeLimit"]), parse_walltime(fields["RunTime"])
    except (KeyError, ValueError):  # UNLIMITED, or slurmctld forgot the job
        return found
    found.update(time_limit_s=limit, time_left_s=max(0, limit - ran), node=fields.get("NodeList", ""))
    return found


ACCOUNTING_FIELDS = ("JobID", "State", "ExitCode", "NodeList", "Submit")


def _accounting(job_ids: list[int]) -> dict[int, dict[str, str]]:
    """Final states from Slurm accounting, for jobs slurmctld no longer remembers; {} without it."""
    if not job_ids:
        return {}
    try:
        return slurm().accounting(job_ids, ACCOUNTING_FIELDS)
    except SlurmError:
        return {}  # no slurmdbd on this cluster, or it does not answer


def load(job_id: int, home: str | None = None, listed: dict[int, dict[str, str]] | None = None,
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
    if info.kind == "notebook" and info.runs > 1:
        _array_state(info, listed if listed is not None else slurm().jobs(job_id), folder)
        if info.finished and info.state != "UNKNOWN":  # UNKNOWN: asked about again next time
            _write_state(final, info, ("state", "reason", "run_states"))
        return info
    fields = (listed if listed is not None else slurm().jobs(job_id)).get(int(job_id))
    if fields is None:
        # Forgotten by slurmctld (MinJobAge) before anyone saw it end: accounting remembers.
        record = (accounting if accounting is not None else _accounting([job_id])).get(int(job_id))
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
    if info.kind == "notebook":
        ran = _run_record(folder, 0)
        if info.state == "UNKNOWN" and ran.get("state") in FINISHED:  # the run's own record of its end
            info.state, info.reason = ran["state"], "as the run recorded its end"
        info.run_states = {"0": info.state}
        if info.state == "FAILED" and ran.get("error"):
            info.reason = ran["error"]
    if info.finished:
        _write_state(final, info, ("state", "reason", "exit_code", "node_list", "run_states"))
    return info


def _write_state(final: Path, info: JobInfo, keys: tuple[str, ...]) -> None:
    """A finished job's state.json, whole or not at all: the panel, its log stream and the results
    table read it at the same time."""
    write_whole(final, json.dumps({k: getattr(info, k) for k in keys}))


def _run_record(folder: Path, run: int) -> dict:
    """What a notebook job's run recorded of itself (portal/session/notebookjob.py); {} before it started."""
    try:
        record = json.loads((folder / record_name(run)).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _array_state(info: JobInfo, listed: dict[int, dict[str, str]], folder: Path) -> None:
    """A grid's state from its runs': Slurm's for the tasks slurmctld knows, else what each run recorded
    of its end, else Slurm accounting's (a run killed by its walltime or memory limit records nothing)."""
    slurm_states: dict[int, str] = {}
    for fields in listed.values():
        if fields.get("ArrayJobId") == str(info.job_id):
            for task in array_task_ids(fields.get("ArrayTaskId", "")):
                slurm_states[task] = fields.get("JobState", "UNKNOWN")
    records = {run: _run_record(folder, run) for run in range(info.runs)}
    states = {run: slurm_states.get(run) or (records[run].get("state") if records[run].get("state") in FINISHED
                                             else "UNKNOWN") for run in range(info.runs)}
    if "UNKNOWN" in states.values():
        try:
            accounted = slurm().array_states(info.job_id)
        except SlurmError:
            accounted = {}  # no accounting on this cluster: the run stays UNKNOWN, and is asked about again
        states.update({run: accounted[run] for run, state in states.items() if state == "UNKNOWN" and run in accounted})
    info.run_states = {str(run): state for run, state in states.items()}
    values = set(states.values())
    active = {state for state in values if state not in FINISHED and state not in ("PENDING", "UNKNOWN")}
    if active:
        info.state = "RUNNING"  # RUNNING, COMPLETING, REQUEUED, SUSPENDED, ...: not over
    elif "PENDING" in values:
        info.state = "PENDING"
    elif values == {"COMPLETED"}:
        info.state = "COMPLETED"
    elif "UNKNOWN" in values:
        info.state = "UNKNOWN"
    elif "CANCELLED" in values:
        info.state = "CANCELLED"
    else:
        info.state = "FAILED"
    failures = [f"run {run}: {records[run].get('error') or state}" for run, state in states.items()
                if state in FINISHED and state != "COMPLETED"]
    done = sum(state == "COMPLETED" for state in states.values())
    info.reason = f"{done} of {info.runs} runs completed" + (f"; {'; '.join(failures[:3])}" if failures else "")


def list_jobs(home: str | None = None, limit: int = 50) -> list[JobInfo]:
    root = jobs_root(home)
    if not root.is_dir():
        return []
    # Newest first by submission (the folders are named by time): job ids restart when a
    # cluster's Slurm state is reset, so the highest id is not the latest job.
    links = [(os.readlink(p), int(p.name)) for p in root.iterdir() if p.name.isdigit() and p.is_symlink()]
    ids = [job_id for _, job_id in sorted(links, reverse=True)[:limit]]
    # Slurm is asked only about her jobs whose end is not recorded yet (usually a few), each by its id:
    # their lines are hers alone (SlurmCommands.jobs).
    unfinished = [j for j in ids if not (root / str(j) / "state.json").exists()]
    listed: dict[int, dict[str, str]] = {}
    for job_id in unfinished:
        listed.update(slurm().jobs(job_id))
    # One sacct for all the jobs slurmctld forgot whose end nobody recorded yet.
    forgotten = [j for j in unfinished if j not in listed]
    accounting = _accounting(forgotten)
    jobs = []
    for job_id in ids:
        try:
            jobs.append(load(job_id, home, listed, accounting))
        except JobNotFound:
            continue
    return jobs


def cancel(job_id: int, home: str | None = None) -> JobInfo:
    info = load(job_id, home)  # only jobs launched from the user's sessions
    if not info.finished:
        slurm().cancel(job_id)
    return info


# ------------------------------------------------------------------------------ a grid's results
def results(job_id: int, home: str | None = None) -> dict:
    """A notebook job's runs as a table: per run its parameters, how it ended and what its cell tagged
    ``results`` printed as JSON ({"columns": [...], "rows": [{column: value}]}), in run order."""
    info = load(job_id, home)
    if info.kind != "notebook":
        raise JobNotFound(f"job {job_id} is not a notebook job: it has no results table")
    folder = Path(info.folder)
    spec = json.loads((folder / SPEC).read_text())
    rows, columns = [], {"run": None}  # a dict as an ordered set: thousands of result names stay cheap
    for run, point in enumerate(spec["points"]):
        parameters = {**spec.get("parameters", {}), **point}
        record = _run_record(folder, run)
        found = record.get("results") if isinstance(record.get("results"), dict) else {}
        row = {"run": run, **parameters, "state": info.run_states.get(str(run), record.get("state", "PENDING")),
               **{k: v for k, v in found.items() if k not in (*RESULT_COLUMNS, *parameters)},
               "output": output_name(run, len(spec["points"]))}
        columns.update(dict.fromkeys(row))
        rows.append(row)
    columns.pop("output", None)
    return {"job_id": info.job_id, "folder": info.folder, "columns": [*columns, "output"],  # last: the notebook
            "rows": rows}


_JOB_NOTEBOOK = re.compile(r"^(input|output|output-\d{1,5})\.ipynb$")
MAX_NOTEBOOK_BYTES = 50 * 2**20
FULLY_READ_BYTES = 4 * 2**20  # notebooks up to this are read by nbformat before the job; larger ones only as JSON


def job_notebook(job_id: int, name: str, home: str | None = None) -> dict:
    """A notebook job's notebook (its copy as submitted, or an executed one) as a read-only model of
    Jupyter's contents API: the Jobs panel opens it in JupyterLab (a drive of the panel's own), while the
    job's folder stays hidden to the session's file browser and contents API."""
    info = load(job_id, home)
    if info.kind != "notebook" or not _JOB_NOTEBOOK.match(name):
        raise JobNotFound(f"job {job_id} has no notebook {name}")
    path = Path(info.folder) / name
    try:
        if path.is_symlink() or path.stat().st_size > MAX_NOTEBOOK_BYTES:
            raise JobNotFound(f"{name} of job {job_id} is not a notebook the panel opens (a link, or over 50 MB)")
        st = path.stat()
        import nbformat  # its reader joins each text's lines, as the contents API serves a notebook

        content = nbformat.reads(path.read_text(), as_version=nbformat.NO_CONVERT)
    except FileNotFoundError:
        raise JobNotFound(f"job {job_id} has no {name} yet: it is written once the run's first cell has run") from None
    except (OSError, ValueError) as error:
        raise JobNotFound(f"{name} of job {job_id} cannot be read: {error}") from None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))
    return {"name": name, "path": f"{int(job_id)}/{name}", "type": "notebook", "format": "json", "mimetype": None,
            "content": content, "writable": False, "created": stamp, "last_modified": stamp, "size": st.st_size,
            "hash": None, "hash_algorithm": None}


def results_csv(table: dict) -> str:
    """The results table as CSV. A text cell a spreadsheet would take for a formula (=, +, -, @, tab,
    CR first) is written with a ' before it, as OWASP advises: a result can quote text from a file
    another user wrote. Numbers stay numbers."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([_inert(column) for column in table["columns"]])
    for row in table["rows"]:
        cells = (row.get(column, "") for column in table["columns"])
        writer.writerow([_inert(json.dumps(v) if isinstance(v, (list, dict)) else v) for v in cells])
    return out.getvalue()


def _inert(value):
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


# ------------------------------------------------------------------------------ logs
_RANK_FILE = re.compile(r"^rank-(\d+)\.(out|err)$")
_TASK_FILE = re.compile(r"^task-(\d+)\.log$")  # a grid's runs (Slurm array tasks)


@dataclass
class LogFollower:
    """Reads each rank's new complete lines since the last call: events for the magic and the websocket."""

    folder: Path
    offsets: dict[str, int] = field(default_factory=dict)
    partial: dict[str, str] = field(default_factory=dict)
    # Set by poll: it stopped at its budget with more written than it read (call again at once).
    behind: bool = False

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
            elif task := _TASK_FILE.match(entry):
                files.append((self.folder / entry, int(task.group(1)), "task"))
        return files

    def poll(self, final: bool = False, budget: int = 4 * 2**20) -> list[dict]:
        """The new complete lines of every file (``final``: the last unfinished ones too), reading at
        most ``budget`` bytes in all: a grid of a thousand runs' logs is read a slice per call, not
        all at once into memory."""
        events, self.behind = [], False
        for path, rank, stream in self._files():
            if budget <= 0:
                self.behind = True
                break
            key = path.name
            try:
                with open(path, "rb") as handle:
                    handle.seek(self.offsets.get(key, 0))
                    data = handle.read(budget)
                    self.offsets[key] = handle.tell()
                    at_end = len(data) < budget or not handle.read(1)
            except OSError:
                continue
            budget -= len(data)
            self.behind = self.behind or not at_end
            text = self.partial.pop(key, "") + data.decode(errors="replace")
            lines = text.split("\n")
            rest = lines.pop()
            if rest and final and at_end:
                lines.append(rest)
            elif rest:
                self.partial[key] = rest
            events += [{"rank": rank, "stream": stream, "line": line.rstrip("\r")} for line in lines]
        return events


def format_event(event: dict) -> str:
    if event["stream"] == "task":
        return f"[run {event['rank']}] {event['line']}"
    who = "batch" if event["rank"] is None else f"rank {event['rank']}"
    return f"[{who}] {event['line']}"
