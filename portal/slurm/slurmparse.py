"""What Slurm says, read: its jobs and nodes as typed values, and the errors its commands fail with.

Pure: nothing here runs a command (portal/slurm/slurmclient.py runs them). squeue's answer is read
with a separator of the call's own (:func:`squeue_format`, :func:`parse_squeue`), sinfo's as JSON,
sacct's and scontrol's as their parsable text.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

# A line of a user's file the hub shows her (her session's log) is cut after LINE_CHARS.
LINE_CHARS = 500
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is Slurm's own words."""


class SlurmUnavailable(SlurmError):
    """slurmctld could not be reached (transient: callers keep their sessions)."""


class SlurmMissing(SlurmError):
    """A Slurm command is not installed where it was run."""


UNREACHABLE_HINTS = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
)


def refusal_hint(message: str, account: str | None = None, qos: str | None = None) -> str:
    """Plain words to put after Slurm's own refusal, for the refusals accounting brings (sbatch)."""
    if "accounting/QOS policy" in message or "QOSMax" in message:
        return (f" The limits of the Slurm QoS{f' {qos}' if qos else ''} do not allow this request (they count "
                "everything you run): ask for fewer GPUs or less time, or ask your admin.")
    if "Invalid qos" in message:
        return f" Your Slurm account may not use the QoS {qos or '(default)'}: ask your admin."
    if "Invalid account" in message:
        return (f" You have no Slurm association with the account {account or '(default)'} on this partition: "
                "ask your admin to add you (sacctmgr add user).")
    return ""


_FULL = re.compile(r"\[Errno (28|122)\]|No space left on device|Disk quota exceeded")


def home_full(message: str) -> bool:
    """Whether a submission failed because the user's folders are full: the mediator, writing her session's
    files as her (its log folder, its certificates in ~/.dsportal), was told ENOSPC or EDQUOT."""
    return bool(_FULL.search(message or ""))


@dataclass(frozen=True)
class Job:
    job_id: int
    user: str
    name: str
    state: str
    reason: str
    partition: str
    batch_host: str
    nodes: str
    exit_code: int
    start_time: int
    submit_time: int
    gpus: int = 0  # per node, as requested (tres_per_node)
    profile: str = ""  # the portal profile, from the job's comment (dsportal-profile=NAME)
    priority: int = 0  # while pending: the scheduler serves higher first
    time_limit: int = 0  # minutes (0: none known)
    restarts: int = 0  # times Slurm put the job back in the queue to run again (a preemption's REQUEUE)

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def ending(self) -> bool:
        """Slurm is ending the job's processes (COMPLETING): its batch script is over, though the
        job still holds its resources, and the state hides how it ended (cancelled, failed...)."""
        return self.state == "COMPLETING"

    @property
    def finished(self) -> bool:
        return not (self.pending or self.running)


PROFILE_COMMENT = re.compile(r"(?:^|[ ,;])dsportal-profile=([A-Za-z0-9_.-]+)")


def queue_places(jobs: dict[int, Job], others: Iterable[tuple[int, str, int, int]] = ()) -> dict[int, tuple[int, int]]:
    """{job id: (place, of)}: where each pending session job stands among its partition's pending
    jobs (``others``: the rest, as (id, partition, priority, submit time)), in the order the scheduler
    takes them (priority, then age)."""
    queues: dict[str, list[tuple[int, int, int]]] = {}
    for job in jobs.values():
        if job.pending:
            queues.setdefault(job.partition, []).append((-job.priority, job.submit_time, job.job_id))
    for job_id, partition, priority, submitted in others:
        if partition in queues:  # only queues a session waits in are ranked
            queues[partition].append((-priority, submitted, job_id))
    places = {}
    for queue in queues.values():
        queue.sort()
        places.update({entry[2]: (place, len(queue)) for place, entry in enumerate(queue, 1) if entry[2] in jobs})
    return places


def profile_of(comment: str) -> str:
    """The portal profile a job's comment names (the batch scripts' --comment=dsportal-profile=NAME)."""
    found = PROFILE_COMMENT.search(comment)
    return found.group(1) if found else ""


def job_gpus(environ=os.environ) -> set[int]:
    """The job's GPUs as device minor numbers (/dev/nvidiaN), as Slurm names them."""
    value = environ.get("SLURM_JOB_GPUS") or environ.get("CUDA_VISIBLE_DEVICES") or ""
    return {int(part) for part in value.split(",") if part.strip().isascii() and part.strip().isdigit()}


def _exit_status(raw: int) -> int:
    """The exit code in a wait status (squeue's exit_code field)."""
    return raw >> 8 if raw > 255 else raw


_UNUSABLE_NODE_STATES = ("down", "drain", "fail", "future", "unknown", "maint", "reboot")


def _gpu_count(tres: str) -> int:
    """The GPUs of a job's tres-per-node: 22.05's "gres:gpu:2", 23.02's and later's "gres/gpu:2"."""
    return gpus_and_shards(_TRES_GRES.sub("", tres))[0]


_TRES_GRES = re.compile(r"(?<![^,])gres[:/]")


# A type is optional, and sinfo's gres_used names an untyped one "(null)": shard:(null):3(IDX:...)
_GRES_GPU_OR_SHARD = re.compile(r"(?:^|,)(gpu|shard)(?::(?:\(null\)|[^:(,]+))?:(\d+)")


def gpus_and_shards(gres: str) -> tuple[int, int]:
    """A node's GPUs and GPU shards (Slurm's shard GRES) from its Gres (gpu:h100:4,shard:16)."""
    counts = {"gpu": 0, "shard": 0}
    for kind, count in _GRES_GPU_OR_SHARD.findall(gres or ""):
        counts[kind] += int(count)
    return counts["gpu"], counts["shard"]


@dataclass(frozen=True)
class Node:
    name: str
    state: str
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    mem_mb: int
    alloc_mem_mb: int
    gpus: int
    alloc_gpus: int
    address: str = ""  # NodeAddr: where the login node (hub, slurmctld) reaches it
    shards: int = 0  # shares of its GPUs (Slurm's shard GRES), and those in use
    alloc_shards: int = 0

    @property
    def usable(self) -> bool:
        return not any(word in self.state.lower() for word in _UNUSABLE_NODE_STATES)

    @classmethod
    def from_json(cls, item: dict) -> Node:
        gpus, shards = gpus_and_shards(item.get("gres", ""))
        alloc_gpus, alloc_shards = gpus_and_shards(item.get("gres_used", ""))
        return cls(
            name=item["name"],
            state=node_state(item.get("state")),
            partitions=tuple(item.get("partitions") or ()),
            cpus=int(item.get("cpus") or 0),
            alloc_cpus=int(item.get("alloc_cpus") or 0),
            mem_mb=int(item.get("real_memory") or 0),
            alloc_mem_mb=int(item.get("alloc_memory") or 0),
            gpus=gpus,
            alloc_gpus=alloc_gpus,
            address=str(item.get("address") or item["name"]),
            shards=shards,
            alloc_shards=alloc_shards,
        )


def node_state(state) -> str:
    """A node's state as 22.05 says it ("idle", "mixed"), also of 23.02's and later lists of state and
    flags (["IDLE", "DRAIN"]: "idle+drain")."""
    if isinstance(state, list):
        # Power saving is not unusable: Slurm powers such a node up for a job (POWERED_DOWN holds "down").
        return "+".join(str(word).lower() for word in state if not str(word).upper().startswith("POWER"))
    return str(state or "")


@dataclass(frozen=True)
class Resources:
    """Free and total resources of a partition's usable nodes."""

    nodes: int = 0
    gpus: int = 0
    free_gpus: int = 0
    cpus: int = 0
    free_cpus: int = 0
    mem_mb: int = 0
    free_mem_mb: int = 0
    largest_free_gpus_on_a_node: int = 0
    most_gpus_on_a_node: int = 0
    shards: int = 0  # GPU shares (shard GRES) and those free
    free_shards: int = 0


def partition_resources(nodes: Iterable[Node]) -> dict[str, Resources]:
    totals: dict[str, dict[str, int]] = {}
    for node in nodes:
        if not node.usable:
            continue
        free_gpus = max(node.gpus - node.alloc_gpus, 0)
        for partition in node.partitions:
            t = totals.setdefault(partition, dict.fromkeys(Resources.__dataclass_fields__, 0))
            t["nodes"] += 1
            t["gpus"] += node.gpus
            t["free_gpus"] += free_gpus
            t["cpus"] += node.cpus
            t["free_cpus"] += max(node.cpus - node.alloc_cpus, 0)
            t["mem_mb"] += node.mem_mb
            t["free_mem_mb"] += max(node.mem_mb - node.alloc_mem_mb, 0)
            t["largest_free_gpus_on_a_node"] = max(t["largest_free_gpus_on_a_node"], free_gpus)
            t["most_gpus_on_a_node"] = max(t["most_gpus_on_a_node"], node.gpus)
            t["shards"] += node.shards
            t["free_shards"] += max(node.shards - node.alloc_shards, 0)
    return {name: Resources(**values) for name, values in totals.items()}


def nodes_argv(release: str | None) -> list[str]:
    """The command (its name first) that lists each node as JSON for the commands of ``release``: Slurm 22.05's
    ``sinfo --json``; from 23.02 on, sinfo's JSON groups the nodes (its "sinfo" list) and ``scontrol --json
    show nodes`` lists each, in the same fields. A release not known (None): the newer command."""
    if release and tuple(int(part) for part in release_line(release).split(".")) < (23, 2):
        return ["sinfo", "--json"]
    return ["scontrol", "--json", "show", "nodes"]


def tells_states_alone(release: str | None) -> bool:
    """Whether the commands of ``release`` can tell jobs' states alone (``squeue --only-job-state``, Slurm 23.02
    on); not where they did not say their release."""
    return bool(release) and tuple(int(part) for part in release_line(release).split(".")) >= (23, 2)


def job_states_argv(squeue: str, release: str | None, job_ids: Iterable[int]) -> list[str] | None:
    """The command that tells only the state of each of ``job_ids`` (those slurmctld still knows), for the commands
    of ``release``: ``squeue --only-job-state`` (Slurm 23.02 on), which slurmctld answers from the jobs' states
    alone, not by packing every job of the cluster as a listing does. None where the commands do not have it
    (22.05) or did not say their release."""
    if not tells_states_alone(release):
        return None
    return [squeue, "--only-job-state", "--noheader", "--states=all", f"--jobs={','.join(str(int(j)) for j in job_ids)}",
            "--format=%i %T"]


def parse_job_states(text: str) -> dict[int, str]:
    """job_states_argv's answer -> each listed job's state by id ("RUNNING"); an id slurmctld forgot is not listed.
    Anything else than lines of an id and a state is an error, never "no jobs"."""
    states: dict[int, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, _, state = line.strip().partition(" ")
        if not (job_id.isascii() and job_id.isdigit() and state.isascii() and state.replace("_", "").isalpha()):
            raise SlurmError(f"squeue's job states could not be read ({line[:60]!r})")
        states[int(job_id)] = state
    return states


def parse_sinfo_json(text: str) -> list[Node]:
    """Each node of nodes_argv's answer, whichever release gave it (its "nodes" list). An answer without one (the
    sinfo --json of 23.02 or later, its commands upgraded under a running hub) is an error, never "no nodes"."""
    answer = json.loads(text)
    if "nodes" not in answer:
        raise SlurmError("Slurm listed no nodes in the form this release's commands were asked for (were they "
                         "upgraded? asked again)")
    return [Node.from_json(item) for item in answer["nodes"] or []]


# The session jobs' names (spawner/gpuspawner.py: dsportal-<user>[:<server>]).
SESSION_JOB_PREFIX = "dsportal-"
# What the hub's squeue prints of each job (squeue -O names), every value whole (width 0) and followed
# by the call's own random separator. The user-set values (a job's name and comment) come last.
SQUEUE_FIELDS = ("JobID", "UserName", "State", "Reason", "Partition", "PriorityLong", "SubmitTime", "StartTime",
                 "TimeLimit", "BatchHost", "NodeList", "exit_code", "tres-per-node", "RestartCnt", "Name", "Comment")
_NOT_SET = ("", "N/A", "n/a", "(null)", "None", "NONE", "Unknown")


def squeue_format(separator: str) -> str:
    """squeue's -O format (passed as SQUEUE_FORMAT2, in the command's environment, which other users
    cannot read: a user who could see the separator in time could name a job so as to end a field)."""
    return ",".join(f"{field}:0{separator}" for field in SQUEUE_FIELDS)


def _epoch(text: str) -> int:
    """A time squeue printed with SLURM_TIME_FORMAT=%s (seconds since the epoch); 0 for none."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else 0


def _minutes(text: str) -> int:
    try:
        return slurm_minutes(text) if text.strip() not in _NOT_SET + ("UNLIMITED", "NOT_SET", "INVALID") else 0
    except ValueError:
        return 0


def parse_squeue(text: str, separator: str) -> tuple[dict[int, Job], list[tuple[int, str, int, int]]]:
    """squeue's answer to :func:`squeue_format` -> (the portal's session jobs by id, as Job; every
    other pending job as (id, partition, priority, submit time), for the places in the queue).

    Fields are split at the separator, which no value can hold, so a name or comment with blanks,
    line breaks or field-like text stays one value. A department's thousands of other jobs are
    only glanced at: whether they are sessions, and their place in the queue if they wait."""
    values = text.split(separator)
    count = len(SQUEUE_FIELDS)
    if (len(values) - 1) % count or values[-1].strip():
        raise SlurmError(f"squeue's answer could not be read ({len(values) - 1} values for {count} fields a job)")
    sessions: dict[int, Job] = {}
    others: list[tuple[int, str, int, int]] = []
    for start in range(0, len(values) - 1, count):
        (job_id, user, state, reason, partition, priority, submitted, started, limit, batch_host, nodes, exit_code,
         tres, restarts, name, comment) = values[start:start + count]
        job_id = job_id.strip()  # each job's line after the first begins with the line break
        if not (job_id.isascii() and job_id.isdigit()):
            raise SlurmError(f"squeue's answer could not be read (job id {job_id[:20]!r})")
        if not name.startswith(SESSION_JOB_PREFIX):
            if state in PENDING_STATES:
                others.append((int(job_id), partition, _number_text(priority), _epoch(submitted)))
            continue
        code = exit_code.split(":")[0]
        sessions[int(job_id)] = Job(
            job_id=int(job_id), user=user, name=name, state=state or "UNKNOWN",
            reason=reason if reason not in _NOT_SET else "None", partition=partition,
            batch_host=batch_host if batch_host not in _NOT_SET else "",
            nodes=nodes if nodes not in _NOT_SET else "",
            exit_code=_exit_status(int(code)) if code.isascii() and code.isdigit() else 0,  # the wait status
            start_time=_epoch(started), submit_time=_epoch(submitted),
            gpus=_gpu_count(tres if tres not in _NOT_SET else ""),
            profile=profile_of(comment if comment not in _NOT_SET else ""), priority=_number_text(priority),
            time_limit=_minutes(limit), restarts=_number_text(restarts))
    return sessions, others


def _number_text(text: str) -> int:
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else 0


def checked_output(argv: list[str], returncode: int, out: str, err: str) -> str:
    """A finished command's output, or the error its words call for."""
    if returncode != 0:
        message = (err or out).strip() or f"exit status {returncode}"
        kind = SlurmUnavailable if any(h in message for h in UNREACHABLE_HINTS) else SlurmError
        raise kind(message)
    return out


def parse_job_id(out: str) -> int:
    """``sbatch --parsable``'s answer: 'ID' or 'ID;cluster'."""
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        return int(last.split(";")[0])
    except ValueError:
        raise SlurmError(f"sbatch gave no job id: {out.strip()!r}") from None


def parse_scontrol_jobs(text: str) -> dict[int, dict[str, str]]:
    """``scontrol show job -o`` lines -> {job id: {field: value}}."""
    jobs = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "JobId" in fields:
            jobs[int(fields["JobId"])] = fields
    return jobs


def parse_sacct(text: str, fields: tuple[str, ...], separator: str) -> dict[int, dict[str, str]]:
    """sacct's answer to :func:`sacct_argv` (JobID first) -> {job id: {field: value}}, the State's first
    word ('CANCELLED by 5101' -> 'CANCELLED'). Where an id comes round again (a reset cluster,
    wrap-around), the newest submission wins."""
    return newest_by_job(sacct_records(text, fields, separator))


def newest_by_job(records: list[dict[str, str]]) -> dict[int, dict[str, str]]:
    """sacct's records of whole jobs (:func:`sacct_records`) -> {job id: record}, as :func:`parse_sacct`."""
    jobs: dict[int, dict[str, str]] = {}
    for record in records:
        if "State" in record:
            record["State"] = (record["State"].split() or ["UNKNOWN"])[0]
        earlier = jobs.get(int(record["JobID"]))
        if earlier is None or record.get("Submit", "") >= earlier.get("Submit", ""):
            jobs[int(record["JobID"])] = record
    return jobs


def sacct_separator() -> str:
    """A separator of sacct's fields no job's name or comment holds: new and random for each call."""
    return f"\x1f{secrets.token_hex(8)}\x1f"


def sacct_records(text: str, fields: tuple[str, ...], separator: str, whole_jobs: bool = True) -> list[dict[str, str]]:
    """sacct's answer to :func:`sacct_argv` -> one {field: value} per record (``whole_jobs``: only those
    whose JobID is a number, not an array's tasks ID_N).

    Each record ends with the call's own separator and a line break: a job's name or comment is
    given by its user, line breaks and field-like text included ("x\\n999|alice|..." made a record of
    its own when lines were split at '|'), and stays one value here."""
    values = text.split(separator)
    count = len(fields)
    if (len(values) - 1) % count or values[-1].strip():
        raise SlurmError(f"sacct's answer could not be read ({len(values) - 1} values for {count} fields a job)")
    records = []
    for start in range(0, len(values) - 1, count):
        record = dict(zip(fields, values[start:start + count], strict=True))
        record[fields[0]] = record[fields[0]].lstrip("\n")  # each record after the first begins with the line break
        if not whole_jobs or (record[fields[0]].isascii() and record[fields[0]].isdigit()):
            records.append(record)
    return records


def slurm_minutes(text: str) -> int:
    """Slurm's time values ('D-HH:MM:SS', 'HH:MM:SS', 'MM:SS', 'MM') -> whole minutes."""
    days, _, clock = text.strip().rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        parts = [0, parts[0], 0]  # minutes alone
    elif len(parts) == 2:
        parts = [0, *parts]  # MM:SS
    hours, minutes, _seconds = parts
    return (int(days or 0) * 24 + hours) * 60 + minutes


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s 'Name = value' lines -> {Name: value}."""
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and " " not in name.strip():
            values[name.strip()] = value.strip()
    if not values:
        raise SlurmError("scontrol show config printed nothing")
    return values


def bounded_tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``, each cut to LINE_CHARS (marked where cut)."""
    kept = text.splitlines()[-max(0, int(lines)):] if lines else []
    return "\n".join(line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]} [... {len(line) - LINE_CHARS} more characters]"
                     for line in kept)


def array_task_ids(text: str) -> list[int]:
    """Slurm's ArrayTaskId: '3', '2-5%2', '[1,4-5]', '1-7:2' -> the task numbers (written in full: the
    session's Slurm commands run with SLURM_BITSTR_LEN=0)."""
    numbers = []
    for part in text.split("%")[0].strip("[]").split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        if first.isdigit() and (not last or last.isdigit()) and (not step or step.isdigit() and int(step) > 0):
            numbers += range(int(first), int(last or first) + 1, int(step or 1))
    return numbers


# ------------------------------------------------------------------------------------------ releases
# The Slurm releases on which dsportal's whole cluster suite (make test) passed, with the date of the run:
# docs/reference/compatibility.md has each run. Where releases differ, the Slurm layer (this module and
# slurmclient.py) speaks to the release it finds; `dsportal check` names it, and says when no run has used it.
TESTED_RELEASES = {"22.05": "2026-12-06", "24.11": "2026-12-07", "26.05": "2026-12-07"}
_RELEASE = re.compile(r"\b(\d{2})\.(\d{2})\.(\d+)\b")


def mpi_plugins(text: str) -> set[str]:
    """The MPI plugins of ``srun --mpi=list`` ("MPI plugin types are...", then one a line, indented)."""
    return {line.strip() for line in text.splitlines() if line[:1] in ("\t", " ") and line.strip()}


def private_tmp_plugin(config: dict[str, str]) -> str | None:
    """The plugin that gives each job its own /tmp and /dev/shm, from scontrol show config: job_container/tmpfs
    (JobContainerType, up to 25.05), namespace/tmpfs (NamespaceType, its name from 25.11 on); None."""
    for key, plugin in (("JobContainerType", "job_container/tmpfs"), ("NamespaceType", "namespace/tmpfs")):
        if config.get(key) == plugin:
            return plugin
    return None


def parse_release(text: str) -> str | None:
    """"22.05.8" from ``sinfo --version``'s "slurm 22.05.8" (or scontrol show config's SLURM_VERSION); None."""
    found = _RELEASE.search(text or "")
    return ".".join(found.groups()) if found else None


def release_line(version: str) -> str:
    """The release of a version: "22.05" of "22.05.8"."""
    return ".".join(version.split(".")[:2])


def describe_releases(controller: str | None, commands: str | None) -> tuple[str, bool]:
    """(the words of `dsportal check`, whether they are a warning) for slurmctld's version and this host's
    commands' version (either None where it was not found)."""
    if controller is None:
        return ("slurmctld did not say its version (scontrol show config: SLURM_VERSION)", True)
    line = release_line(controller)
    said = f"slurmctld {controller}" + (f", this host's commands {commands}" if commands else "")
    if commands and release_line(commands) != line:
        return (f"{said}: this host's commands are of another release than slurmctld; install the cluster's own "
                "release on this host (slurmctld accepts commands of its own release and up to two older ones, "
                "three from 24.11, never newer)", True)
    if line in TESTED_RELEASES:
        return (f"{said}: dsportal's cluster suite passed on Slurm {line} ({TESTED_RELEASES[line]}, "
                "docs/reference/compatibility.md)", False)
    tested = ", ".join(sorted(TESTED_RELEASES))
    return (f"{said}: no run of dsportal's tests has used Slurm {line} yet (only {tested}): try it on a test "
            "cluster first (docs/reference/compatibility.md)", True)
