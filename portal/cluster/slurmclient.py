"""The one place that talks to Slurm and parses what it says.

Commands run with an argv list (never a shell), and fail with one set of errors: SlurmError
(Slurm's own words) and SlurmUnavailable (slurmctld did not answer). Two clients share them:

- :class:`Slurm`, asynchronous, for the hub: it runs commands as a user (runuser/sudo), and job
  state comes from one ``squeue`` of every job the controller still remembers (finished ones
  included, for MinJobAge), so a single call serves every session of the hub: callers share one
  cached snapshot (:func:`shared_client`) instead of each running its own. Only the portal's
  sessions are read in full (:func:`parse_squeue`); a department's thousands of other jobs cost a
  line each;
- :class:`SlurmCommands`, blocking, for code that runs Slurm as its own user and has no event loop
  of its own to spare: a session's job launcher (in kernels and threads) and the admin's commands.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import pwd
import re
import secrets
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Histogram

from .. import defaults

log = logging.getLogger(__name__)

# Served with the hub's metrics (/hub/metrics, portal/hub/metrics.py).
SLURM_COMMANDS = Counter(
    "dsportal_slurm_commands", "Slurm client commands the hub ran, by command and outcome "
    "(ok, error: Slurm refused, unavailable: slurmctld did not answer).", ["command", "outcome"])
SLURM_SECONDS = Histogram(
    "dsportal_slurm_command_seconds", "How long the hub's Slurm client commands took.", ["command"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# A user's file the hub shows her (her session's log): at most its last TAIL_BYTES, lines cut.
TAIL_BYTES = 64 * 1024
LINE_CHARS = 500
# What of the hub's environment its Slurm commands get (the locale, where Slurm and munge are).
PASSED_ON = {"PATH", "LANG", "LANGUAGE", "TZ", "SLURM_CONF", "MUNGE_SOCKET"}
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


_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?:(\d+)")
_UNUSABLE_NODE_STATES = ("down", "drain", "fail", "future", "unknown", "maint", "reboot")


def _gpu_count(gres: str) -> int:
    return sum(int(n) for n in _GRES_GPU.findall(gres or ""))


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

    @property
    def usable(self) -> bool:
        return not any(word in self.state.lower() for word in _UNUSABLE_NODE_STATES)

    @classmethod
    def from_json(cls, item: dict) -> Node:
        return cls(
            name=item["name"],
            state=str(item.get("state") or ""),
            partitions=tuple(item.get("partitions") or ()),
            cpus=int(item.get("cpus") or 0),
            alloc_cpus=int(item.get("alloc_cpus") or 0),
            mem_mb=int(item.get("real_memory") or 0),
            alloc_mem_mb=int(item.get("alloc_memory") or 0),
            gpus=_gpu_count(item.get("gres", "")),
            alloc_gpus=_gpu_count(item.get("gres_used", "")),
            address=str(item.get("address") or item["name"]),
        )


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
    return {name: Resources(**values) for name, values in totals.items()}


def parse_sinfo_json(text: str) -> list[Node]:
    return [Node.from_json(item) for item in json.loads(text).get("nodes") or []]


# The session jobs' names (spawner/gpuspawner.py: dsportal-<user>[:<server>]).
SESSION_JOB_PREFIX = "dsportal-"
# What the hub's squeue prints of each job (squeue -O names), every value whole (width 0) and followed
# by the call's own random separator. The user-set values (a job's name and comment) come last.
SQUEUE_FIELDS = ("JobID", "UserName", "State", "Reason", "Partition", "PriorityLong", "SubmitTime", "StartTime",
                 "TimeLimit", "BatchHost", "NodeList", "exit_code", "tres-per-node", "Name", "Comment")
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
         tres, name, comment) = values[start:start + count]
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
            gpus=_gpu_count(tres.replace("gres:", "") if tres not in _NOT_SET else ""),
            profile=profile_of(comment if comment not in _NOT_SET else ""), priority=_number_text(priority),
            time_limit=_minutes(limit))
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


def parse_sacct(text: str, fields: tuple[str, ...]) -> dict[int, dict[str, str]]:
    """``sacct -X -n -P -o <fields>`` lines (JobID first) -> {job id: {field: value}}, the State's first
    word ('CANCELLED by 5101' -> 'CANCELLED'). Where an id comes round again (a reset cluster,
    wrap-around), the newest submission wins."""
    jobs: dict[int, dict[str, str]] = {}
    for record in sacct_records(text, fields):
        if "State" in record:
            record["State"] = (record["State"].split() or ["UNKNOWN"])[0]
        earlier = jobs.get(int(record["JobID"]))
        if earlier is None or record.get("Submit", "") >= earlier.get("Submit", ""):
            jobs[int(record["JobID"])] = record
    return jobs


def sacct_records(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """``sacct -X -n -P -o <fields>`` lines (JobID first) -> one {field: value} per whole job."""
    records = []
    for line in text.splitlines():
        values = line.split("|")
        if len(values) == len(fields) and values[0].isascii() and values[0].isdigit():
            records.append(dict(zip(fields, values, strict=True)))
    return records


def sacct_argv(sacct: str, fields: tuple[str, ...], *, job_ids: Iterable[int] = (), since: str = "",
               user: str | None = None) -> list[str]:
    """Whole jobs (-X), one per line (-P): those of ``job_ids``, or those since ``since``; of ``user``, or all."""
    argv = [sacct, "-X", "-n", "-P"]
    if job_ids:
        argv += ["-j", ",".join(str(int(j)) for j in job_ids)]
    if since:
        argv += ["-S", since, "-E", "now"]
    return argv + ["-o", ",".join(fields)] + (["-u", user] if user else ["-a"])


class _Snapshot:
    """One shared, briefly cached result of a Slurm query: concurrent callers share a single call.

    A caller takes the cached value if it is fresh enough, else joins the call in flight if that
    call started recently enough for it, else waits for that call to end and takes the next one,
    which serves everyone who came meanwhile. So a burst of callers costs at most two calls, and a
    call slower than ``max_age`` (slurmctld busy) is still good for everyone who waited on it:
    judging its age on arrival instead made each waiter call again, one after another.
    """

    def __init__(self, fetch, empty):
        self._fetch = fetch
        self.value = empty
        self.taken_at = 0.0
        self.calls = 0
        self._flight: tuple[float, asyncio.Future] | None = None

    def _usable(self, max_age: float, fresh_after: float) -> bool:
        return self.taken_at > fresh_after and time.monotonic() - self.taken_at < max_age

    async def _take(self, started: float):
        try:
            value = await self._fetch()
            self.calls += 1
            self.value, self.taken_at = value, started
            return value
        finally:
            self._flight = None

    async def get(self, max_age: float, fresh_after: float = 0.0):
        if self._usable(max_age, fresh_after):
            return self.value
        asked = time.monotonic()
        while True:
            if self._flight is None:
                started = time.monotonic()
                self._flight = (started, asyncio.ensure_future(self._take(started)))
            started, call = self._flight
            # shield: one caller cancelled (its request gone) does not cancel the call for the others
            value = await asyncio.shield(call)
            if started > fresh_after and started >= asked - max_age:
                return value


ACCOUNTING_FIELDS = ("JobID", "User", "JobName", "State", "Reason", "Partition", "NodeList", "ExitCode", "Submit")


class Slurm:
    """Typed wrapper over the Slurm client commands.

    Everything the hub does as a user goes through the root-owned ``mediator`` (portal/cluster/mediator.py),
    run as her: with ``sudo`` (an unprivileged hub whose one sudo rule allows the mediator) or ``runuser``
    (a hub run as root).
    """

    def __init__(
        self,
        conf: Path | None = None,
        bin_dir: Path = Path(defaults.SLURM_BIN_DIR),
        submit_as: str = defaults.SUBMIT_AS,
        cache_seconds: float = defaults.SLURM_POLL_INTERVAL,
        command_timeout: float = 30.0,
        mediator: Path = Path(defaults.MEDIATOR),
        as_user_at_once: int = 0,
    ):
        self.conf = conf
        self.bin_dir = Path(bin_dir)
        self.submit_as = submit_as
        self.cache_seconds = cache_seconds
        self.command_timeout = command_timeout
        self.mediator = str(mediator)
        self._squeue = _Snapshot(self._fetch_jobs, empty={})
        # Commands run as users (the mediator: sbatch, certificates, scancel, log tails) a few at a time:
        # a class of 100 starting at once ran 200 Python processes together on the login node's 2 cores,
        # where the hub's own loop got a 100th of a core (API p99 7.8 s) and sbatch ran past its timeout.
        self._as_user_slots = asyncio.Semaphore(as_user_at_once or max(4, 2 * (os.cpu_count() or 1)))
        self._others_pending: list[tuple[int, str, int, int]] = []  # the last squeue's other pending jobs
        self._sinfo = _Snapshot(self._fetch_nodes, empty=[])
        self._cancels: set[asyncio.Task] = set()  # cancel_soon's, held until they end
        self._places: tuple[dict, dict] = ({}, {})  # (the squeue snapshot, its queue_places)

    # -- running commands -------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A command's environment: what the hub's own holds that a Slurm client needs, and ``extra``.

        Never the hub's whole environment: a command run as the user (and sbatch's job, which gets
        sbatch's environment) is hers to read in /proc/PID/environ, and the hub holds secrets
        (JUPYTERHUB_CRYPT_KEY, CONFIGPROXY_AUTH_TOKEN, LDAP passwords, API keys)."""
        env = {name: value for name, value in os.environ.items() if name in PASSED_ON or name.startswith("LC_")}
        env.setdefault("PATH", SAFE_PATH)
        env.update(extra or {})
        if self.conf:
            env["SLURM_CONF"] = str(self.conf)
        return env

    def as_user(self, user: str, *args: str) -> list[str]:
        """The mediator, run as ``user`` with ``args``."""
        if self.submit_as == "sudo":
            return ["sudo", "-n", "-u", user, "--", self.mediator, *args]
        return ["runuser", "-u", user, "--", self.mediator, *args]

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)

    async def run(self, argv: list[str], *, input: str | None = None, env: dict | None = None) -> str:
        if argv[:1] and Path(argv[0]).name in ("sudo", "runuser"):
            async with self._as_user_slots:  # its timeout counts from here, not from the wait for a slot
                return await self._timed(argv, input=input, env=env)
        return await self._timed(argv, input=input, env=env)

    async def _timed(self, argv: list[str], *, input: str | None = None, env: dict | None = None) -> str:
        command, started = command_name(argv), time.monotonic()
        try:
            out = await self._run(argv, input=input, env=env)
        except SlurmUnavailable:
            SLURM_COMMANDS.labels(command, "unavailable").inc()
            raise
        except SlurmError:
            SLURM_COMMANDS.labels(command, "error").inc()
            raise
        finally:
            SLURM_SECONDS.labels(command).observe(time.monotonic() - started)
        SLURM_COMMANDS.labels(command, "ok").inc()
        return out

    async def _run(self, argv: list[str], *, input: str | None = None, env: dict | None = None) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env(env),
            )
        except FileNotFoundError as error:
            raise SlurmError(f"cannot run {argv[0]}: {error.strerror}") from None
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), self.command_timeout
            )
        except TimeoutError:
            try:
                proc.kill()
            except ProcessLookupError:  # it ended just now (killing it raised, and the start failed unexplained)
                pass
            await proc.wait()
            raise SlurmUnavailable(f"{Path(argv[0]).name} did not answer within {self.command_timeout:.0f} s") from None
        return checked_output(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    # -- jobs -------------------------------------------------------------------------
    async def submit(self, user: str, script: str, log_dir: str, env: dict[str, str] | None = None,
                     certs: tuple[str, dict[str, str]] | None = None) -> int:
        """sbatch the script as ``user``, her private ``log_dir`` made first; returns the job id. The job's
        environment goes to the mediator on its input, never on a command line. ``certs`` (folder,
        {name: text}): the session's certificates, written as by write_private_files_as_user in the
        same mediator run, before the submission (a mediator installed before it knew this: two runs)."""
        request = {"script": script, "env": self.env(env), "log_dir": log_dir}
        if certs is None:
            return parse_job_id(await self.run(self.as_user(user, "submit"), input=json.dumps(request)))
        folder, files = certs
        self._check_file_names(files)
        request["certs"] = {name: base64.b64encode(text.encode()).decode() for name, text in files.items()}
        try:
            return parse_job_id(await self.run(self.as_user(user, "start", folder), input=json.dumps(request)))
        except SlurmError as error:
            if "usage: mediator" not in str(error) or " start FOLDER" in str(error):
                raise
        log.warning("the installed mediator %s predates `mediator start` (certificates and submission in one "
                    "run): run `dsportal hub install-mediator`; until then each start takes two runs", self.mediator)
        await self.write_private_files_as_user(user, folder, files)
        del request["certs"]
        return parse_job_id(await self.run(self.as_user(user, "submit"), input=json.dumps(request)))

    async def cancel(self, user: str, job_id: int) -> None:
        await self.run(self.as_user(user, "cancel", str(int(job_id))))

    async def cancel_until_done(self, user: str, job_id: int, every: float = 10.0, for_at_most: float = 3600.0) -> None:
        """scancel as ``user``, asked again every ``every`` s while slurmctld does not answer (down or
        hung), for at most ``for_at_most`` s; Slurm's refusal (the job is gone already) ends it too."""
        deadline = time.monotonic() + for_at_most
        while True:
            try:
                return await self.cancel(user, job_id)
            except SlurmUnavailable as error:
                if time.monotonic() + every > deadline:
                    raise
                log.warning("scancel %s of %s: %s; asking Slurm again in %.0f s", job_id, user, error, every)
                await asyncio.sleep(every)

    def cancel_soon(self, user: str, job_id: int) -> asyncio.Task:
        """cancel_until_done in a task of its own, held until it ends: whoever stops waiting for it
        (a stop that goes on without Slurm's answer) does not end it."""
        task = asyncio.ensure_future(self.cancel_until_done(user, job_id))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)
        return task

    async def set_time_limit(self, job_id: int, minutes: int) -> None:
        """A job's new time limit, as the hub: a Slurm operator (users may only shorten theirs).
        An operator passes the partition's MaxTime and the QoS's MaxWall: ask time_ceiling first."""
        await self.run([self.tool("scontrol"), "update", f"JobId={int(job_id)}", f"TimeLimit={int(minutes)}"])

    async def time_ceiling(self, partition: str, qos: str | None) -> tuple[int | None, str]:
        """(minutes, whose limit) of the longest time limit Slurm lets a user's job in ``partition``
        (and ``qos``) have: the partition's MaxTime, the QoS's MaxWall, the lower; (None, "") if neither."""
        limits = []
        shown = await self.run([self.tool("scontrol"), "show", "partition", partition, "-o"])
        max_time = parse_config(shown.replace(" ", "\n")).get("MaxTime", "UNLIMITED")
        if max_time not in ("UNLIMITED", ""):
            limits.append((slurm_minutes(max_time), f"partition {partition}"))
        if qos:
            wall = (await self.run([self.tool("sacctmgr"), "-n", "-P", "show", "qos", qos, "format=MaxWall"])).strip()
            if wall:
                limits.append((slurm_minutes(wall), f"QoS {qos}"))
        return min(limits) if limits else (None, "")

    async def jobs(self, max_age: float | None = None, fresh_after: float = 0.0) -> dict[int, Job]:
        """The portal's session jobs slurmctld knows (named dsportal-...), from one shared, briefly cached
        ``squeue`` of every job.

        ``fresh_after`` (a time.monotonic() value) demands a snapshot taken after that moment,
        e.g. after one's own sbatch returned.
        """
        max_age = self.cache_seconds if max_age is None else max_age
        return await self._squeue.get(max_age, fresh_after)

    async def job(self, job_id: int, max_age: float | None = None, fresh_after: float = 0.0) -> Job | None:
        return (await self.jobs(max_age, fresh_after)).get(int(job_id))

    async def accounting(self, job_id: int, user: str | None = None) -> Job | None:
        """The job as Slurm accounting (slurmdbd) recorded it, once slurmctld has forgotten it;
        None where the cluster keeps no accounting or has no record. Job ids come round again
        (a reset cluster, wrap-around): the newest record of the id (of that user) is the one."""
        try:
            out = await self.run(sacct_argv(self.tool("sacct"), ACCOUNTING_FIELDS, job_ids=[job_id], user=user))
        except SlurmError:
            return None
        record = parse_sacct(out, ACCOUNTING_FIELDS).get(int(job_id))
        if record is None or (user and record["User"] != user):
            return None
        exit_code = record.get("ExitCode", "0:0").split(":")[0]
        return Job(job_id=int(job_id), user=record["User"], name=record["JobName"], state=record["State"],
                   reason=record.get("Reason") or "None", partition=record["Partition"], batch_host="",
                   nodes=record.get("NodeList", ""),
                   exit_code=int(exit_code) if exit_code.isascii() and exit_code.isdigit() else 0, start_time=0,
                   submit_time=0)

    async def nodes(self, max_age: float = 10.0) -> list[Node]:
        """Every node, from one shared ``sinfo --json`` taken at most every ``max_age`` seconds."""
        return await self._sinfo.get(max_age)

    @property
    def last_nodes(self) -> list[Node]:
        """The nodes of the last ``sinfo`` that answered (none before the first)."""
        return self._sinfo.value

    @property
    def last_jobs(self) -> dict[int, Job]:
        """The jobs of the last ``squeue`` snapshot (none before the first), without asking Slurm."""
        return self._squeue.value

    def queue_place(self, job: Job) -> tuple[int, int]:
        """(place, of) of a pending job in its partition's queue, from the last squeue snapshot; (0, 0)
        when it is not pending there. Ranked once per snapshot, however many sessions wait."""
        jobs = self._squeue.value
        if self._places[0] is not jobs:
            self._places = (jobs, queue_places(jobs, self._others_pending))
        return self._places[1].get(job.job_id, (0, 0))

    @property
    def squeue_calls(self) -> int:
        return self._squeue.calls

    @property
    def sinfo_calls(self) -> int:
        return self._sinfo.calls

    async def _fetch_jobs(self) -> dict[int, Job]:
        # squeue --json (Slurm 22.05) filters nothing and prints ~100 fields of every job the controller
        # knows, which the hub parsed at each poll: its cost grew with the whole cluster's queue (issue 33).
        separator = f"\x1f{secrets.token_hex(8)}\x1f"
        out = await self.run([self.tool("squeue"), "--noheader", "--all", "--states=all"],
                             env={"SQUEUE_FORMAT2": squeue_format(separator), "SLURM_TIME_FORMAT": "%s"})
        sessions, others = parse_squeue(out, separator)
        self._others_pending = others
        return sessions

    async def _fetch_nodes(self) -> list[Node]:
        return parse_sinfo_json(await self.run([self.tool("sinfo"), "--json"]))

    async def resources(self, max_age: float = 10.0) -> dict[str, Resources]:
        return partition_resources(await self.nodes(max_age))

    async def read_as_user(self, user: str, path: str, lines: int = 30, not_before: float | None = None) -> str:
        """The last ``lines`` lines of a file the user owns, read with the user's rights (a symlink
        she planted cannot show her a file she may not read); "" when it was last written before
        ``not_before`` (a time.time() value). Her file, her size: only its last TAIL_BYTES are read,
        and each line is cut to LINE_CHARS, so a log of one huge line costs the hub nothing."""
        since = [] if not_before is None else [str(int(not_before))]
        try:
            tail = await self.run(self.as_user(user, "tail", path, *since))
        except SlurmError as error:
            return f"(log {path} unreadable: {str(error)[:LINE_CHARS]})"
        return bounded_tail(tail, lines)

    @staticmethod
    def _check_file_names(files: dict[str, str]) -> None:
        if any(not name or "/" in name or " " in name for name in files):
            raise ValueError(f"file names without '/' or blanks, not {sorted(files)}")

    async def write_private_files_as_user(self, user: str, folder: str, files: dict[str, str]) -> None:
        """Write ``files`` (name: text) into the user's private ``folder`` (below her ~/.dsportal/certs),
        as the user, mode 600: one mediator run for all of them (each input line a name and its content
        in base64)."""
        self._check_file_names(files)
        lines = "".join(f"{name} {base64.b64encode(text.encode()).decode()}\n" for name, text in files.items())
        await self.run(self.as_user(user, "certs", folder), input=lines)


_clients: dict[tuple, Slurm] = {}


def shared_client(conf: str | None, bin_dir: str, submit_as: str, cache_seconds: float,
                  mediator: str = defaults.MEDIATOR) -> Slurm:
    """One Slurm client (and so one squeue snapshot) per hub, whatever the number of sessions."""
    key = (str(conf or ""), str(bin_dir), submit_as, mediator)
    if key not in _clients:
        _clients[key] = Slurm(Path(conf) if conf else None, Path(bin_dir), submit_as, cache_seconds=cache_seconds,
                              mediator=Path(mediator))
    return _clients[key]


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


def _own_name() -> str | None:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


class SlurmCommands:
    """The Slurm commands run as the calling process's own user, blocking: for a session's job
    launcher (its Jupyter server's threads, the magics in kernels) and the admin's commands.

    ``env`` is the commands' whole environment (None: this process's own)."""

    def __init__(self, env: dict[str, str] | None = None, bin_dir: Path | None = None, command_timeout: float = 30.0):
        self.env = env
        self.bin_dir = bin_dir
        self.command_timeout = command_timeout

    @classmethod
    def from_settings(cls, settings) -> SlurmCommands:
        return cls(env={**os.environ, **settings.slurm_env()}, bin_dir=settings.slurm.bin_dir)

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir else name

    def run(self, argv: list[str], *, input: str | None = None, timeout: float | None = None) -> str:
        timeout = self.command_timeout if timeout is None else timeout
        try:
            result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=self.env)
        except FileNotFoundError:
            raise SlurmMissing(f"{argv[0]} is not installed on this node") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{Path(argv[0]).name} did not answer within {timeout:.0f} s") from None
        return checked_output(argv, result.returncode, result.stdout, result.stderr)

    def submit_file(self, script: str) -> int:
        """sbatch a batch script file; returns the job id."""
        return parse_job_id(self.run([self.tool("sbatch"), "--parsable", script]))

    def cancel(self, job_id: int) -> None:
        self.run([self.tool("scancel"), str(int(job_id))])

    def jobs(self, job_id: int | None = None) -> dict[int, dict[str, str]]:
        """``scontrol show job``'s fields of one job or of all (only her own, with PrivateData=jobs);
        {} for an id slurmctld does not know (any more)."""
        argv = [self.tool("scontrol"), "show", "job", "-o"] + ([str(int(job_id))] if job_id is not None else [])
        try:
            return parse_scontrol_jobs(self.run(argv))
        except SlurmError as error:
            if "Invalid job id" in str(error) and not isinstance(error, SlurmUnavailable):
                return {}
            raise

    def accounting(self, job_ids: list[int], fields: tuple[str, ...], timeout: float = 15) -> dict[int, dict[str, str]]:
        """What Slurm accounting recorded of this user's ``job_ids`` (raises where the cluster keeps none)."""
        argv = sacct_argv(self.tool("sacct"), fields, job_ids=job_ids, user=_own_name())
        return parse_sacct(self.run(argv, timeout=timeout), fields)

    def accounting_since(self, since: str, fields: tuple[str, ...], user: str | None = None,
                         timeout: float = 60) -> list[dict[str, str]]:
        """Every whole job accounting recorded since ``since`` (a Slurm time: 2026-11-01T00:00:00, now-1minutes)."""
        return sacct_records(self.run(sacct_argv(self.tool("sacct"), fields, since=since, user=user),
                                      timeout=timeout), fields)

    def nodes(self, timeout: float = 10) -> list[Node]:
        return parse_sinfo_json(self.run([self.tool("sinfo"), "--json"], timeout=timeout))

    def partitions(self) -> list[str]:
        out = self.run([self.tool("sinfo"), "-h", "-o", "%R"])
        return sorted({line.strip() for line in out.splitlines() if line.strip()})

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (slurm.conf and cgroup.conf, as slurmctld has them)."""
        return parse_config(self.run([self.tool("scontrol"), "show", "config"]))


def bounded_tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``, each cut to LINE_CHARS (marked where cut)."""
    kept = text.splitlines()[-max(0, int(lines)):] if lines else []
    return "\n".join(line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]} [... {len(line) - LINE_CHARS} more characters]"
                     for line in kept)


def command_name(argv: list[str]) -> str:
    """'squeue' for [.../squeue, --json]; for the mediator run as a user ([runuser, -u, alice, --,
    .../mediator, submit]) what it did: 'sbatch' (submit, or start: certificates and sbatch in one run),
    'scancel', 'mediator tail', 'mediator certs'."""
    for index, part in enumerate(argv):
        name = Path(part).name
        if name in ("sbatch", "scancel", "squeue", "sinfo", "scontrol", "sacct", "srun"):
            return name
        if part.endswith("/mediator"):
            verb = argv[index + 1] if index + 1 < len(argv) else ""
            return {"submit": "sbatch", "start": "sbatch", "cancel": "scancel"}.get(verb, f"mediator {verb}".strip())
    return Path(argv[0]).name if argv else "?"
