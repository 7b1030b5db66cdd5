"""A Slurm cluster in memory, behind the hub's own Slurm client: the spawners' whole life without a cluster.

:class:`FakeSlurm` is a :class:`portal.slurm.slurmclient.Slurm` whose commands are answered here
instead of run: what the spawners call of it that runs a command (``submit``, ``cancel``, ``accounting``,
``read_as_user``, ``write_private_files_as_user``, ``set_time_limit``, ``time_ceiling``, and the client's
two snapshot fetches ``_fetch_jobs`` and ``_fetch_nodes``: squeue and sinfo) is overridden; everything
built on them is the real client's own, unchanged: the shared squeue snapshot and its cache (``jobs``,
``job``, ``fresh_after``, ``max_age``, one call for a burst of callers), ``queue_place``, ``cancel_soon`` /
``cancel_until_done``, ``nodes``, ``resources``, ``last_jobs``, ``last_nodes``. What they hand back are
slurmparse's own types (Job, Node, Resources) and errors (SlurmError, SlurmUnavailable), in the words the
real commands fail with. A command this module does not answer is a test's failure, never a
real command run (:meth:`FakeSlurm._run`).

The cluster's side (jobs starting, ending, a node failing, slurmctld down) is the test's to play, with
:meth:`FakeSlurm.start`, :meth:`end`, :meth:`completing`, :meth:`forget`, :meth:`hold`, :meth:`go_down` ...
A change is seen by the spawners as the real one is: with the next squeue snapshot, at most
``cache_seconds`` later (:meth:`later` waits for it).

The hub's spawners reach it through the seam of the Slurm layer, ``slurmclient.share_client``: installed
for the spawners' config with :meth:`FakeSlurm.installed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from portal.core import defaults
from portal.core.settings import parse_memory_mb
from portal.slurm import slurmclient
from portal.slurm.slurmparse import (
    PENDING_STATES,
    RUNNING_STATES,
    SESSION_JOB_PREFIX,
    Job,
    Node,
    SlurmError,
    SlurmUnavailable,
    bounded_tail,
    gpus_and_shards,
    profile_of,
    slurm_minutes,
)

# What the real commands print when slurmctld does not answer (slurmparse.UNREACHABLE_HINTS has it).
CONTROLLER_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"

DEFAULT_NODES = (
    Node(name="node1", state="idle", partitions=("gpu", "scavenger"), cpus=64, alloc_cpus=0, mem_mb=512_000, alloc_mem_mb=0,
         gpus=4, alloc_gpus=0, address="10.0.0.1"),
    Node(name="node2", state="idle", partitions=("gpu", "cpu", "scavenger"), cpus=64, alloc_cpus=0, mem_mb=512_000,
         alloc_mem_mb=0, gpus=4, alloc_gpus=0, address="10.0.0.2"),
    Node(name="node3", state="idle", partitions=("cpu",), cpus=32, alloc_cpus=0, mem_mb=128_000, alloc_mem_mb=0,
         gpus=0, alloc_gpus=0, address="10.0.0.3"),
)


def client_key(config) -> tuple[str, str, str, str]:
    """What slurmclient.shared_client tells clients apart by, of the SlurmGPUSpawner settings in traitlets
    ``config`` (slurm_conf, slurm_bin_dir, submit_as, mediator; each trait's default where unset)."""
    section = config.SlurmGPUSpawner
    return (section.get("slurm_conf", ""), section.get("slurm_bin_dir", defaults.SLURM_BIN_DIR),
            section.get("submit_as", defaults.SUBMIT_AS), section.get("mediator", defaults.MEDIATOR))


def sbatch_options(script: str) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of a batch script, as sbatch reads them: up to the first
    line that is neither a comment nor blank ({"--partition": "gpu", "--no-requeue": ""})."""
    options = {}
    for line in script.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            name, _, value = line[len("#SBATCH "):].strip().partition("=")
            options[name] = value
    return options


@dataclass
class Submission:
    """One sbatch the client asked for, as the mediator received it."""

    user: str
    script: str
    log_dir: str
    env: dict[str, str]
    certs: tuple[str, dict[str, str]] | None
    job_id: int | None = None  # None: refused

    @property
    def sbatch(self) -> dict[str, str]:
        return sbatch_options(self.script)


@dataclass
class Record:
    """A job as slurmctld (and accounting) hold it; :meth:`job` is what squeue shows of it."""

    job_id: int
    user: str
    name: str
    partition: str
    state: str = "PENDING"
    reason: str = "Priority"
    batch_host: str = ""
    exit_code: int = 0
    submit_time: int = 0
    start_time: int = 0
    time_limit: int = 0
    gpus: int = 0
    shards: int = 0
    cpus: int = 1
    mem_mb: int = 0
    comment: str = ""
    priority: int = 1000
    output: str = ""
    listed: bool = True  # squeue still shows it (an ended job until MinJobAge)
    recorded: tuple[str, int, str] | None = None  # (state, exit code, reason) accounting has, where squeue lags
    restarts: int = 0  # times Slurm put it back in the queue (a preemption's REQUEUE)

    def job(self) -> Job:
        return Job(job_id=self.job_id, user=self.user, name=self.name, state=self.state, reason=self.reason,
                   partition=self.partition, batch_host=self.batch_host,
                   nodes=self.batch_host, exit_code=self.exit_code, start_time=self.start_time,
                   submit_time=self.submit_time, gpus=self.gpus, profile=profile_of(self.comment),
                   priority=self.priority, time_limit=self.time_limit, restarts=self.restarts)


@dataclass
class LogFile:
    owner: str
    text: str
    mtime: float = field(default_factory=time.time)


class FakeSlurm(slurmclient.Slurm):
    """The hub's Slurm client over a cluster in memory (see the module's docstring)."""

    def __init__(self, nodes: tuple[Node, ...] = DEFAULT_NODES, cache_seconds: float = 0.02,
                 accounting: bool = True, first_job_id: int = 1000, release: str = "24.11.5"):
        super().__init__(conf=None, bin_dir=Path("/nonexistent/fakeslurm/bin"), cache_seconds=cache_seconds,
                         mediator=Path("/nonexistent/fakeslurm/mediator"))
        self.node_list = list(nodes)
        self.records: dict[int, Record] = {}
        self.submissions: list[Submission] = []
        self.cancels: list[tuple[str, int]] = []  # every scancel asked, (user, job id), taken or not
        self.commands: list[str] = []  # every command, by slurmclient.command_name: 'sbatch', 'squeue' ...
        self.logs: dict[str, LogFile] = {}
        self.keeps_accounting = accounting  # slurmdbd: sacct knows every job, also once squeue forgot it
        self.down: str = ""  # slurmctld's silence, in the commands' words ("": it answers)
        self.refusals: list[str] = []  # sbatch's next refusals, in Slurm's words
        self.latency: dict[str, float] = {}  # seconds a command (by name) takes
        self.start_on: str = ""  # a node: jobs run there as they are submitted (the queue is empty)
        self.time_limits: dict[str, int] = {}  # minutes: a partition's MaxTime, "qos:NAME" a QoS's MaxWall
        self.private_files: list[tuple[str, str, dict[str, str]]] = []  # (user, folder, files) written
        self._next_id = first_job_id
        self.slurm_release = release  # its commands' (sinfo --version): before 23.02 they cannot tell states alone

    # -- the seam ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self, config):
        """This client as the shared one for the SlurmGPUSpawner settings in traitlets ``config``, for
        the block; the one there before (if any) is put back after it."""
        replaced = slurmclient.share_client(self, *client_key(config))
        try:
            yield self
        finally:
            slurmclient.share_client(replaced, *client_key(config))

    # -- what the client runs ------------------------------------------------------------------------
    async def _run(self, argv, *, input=None, env=None):
        if argv[:2] == [self.tool("squeue"), "--only-job-state"]:  # the client's own command (running_job's look)
            return await self._job_states(argv)
        raise AssertionError(f"fakeslurm: the client ran a command the fake does not answer: {argv}")

    async def release(self) -> str | None:
        return self.slurm_release

    async def _job_states(self, argv: list[str]) -> str:
        """squeue --only-job-state --jobs=...: a line "ID STATE" for each of those jobs squeue still lists."""
        if self.down:
            raise SlurmUnavailable(self.down)
        asked = {int(j) for arg in argv if arg.startswith("--jobs=") for j in arg.removeprefix("--jobs=").split(",")}
        return "".join(f"{r.job_id} {r.state}\n" for r in self.records.values() if r.listed and r.job_id in asked)

    @contextlib.asynccontextmanager
    async def _told(self, name: str):
        """One command, counted and told to on_command as the real client tells it (its _told), taking its
        latency."""
        self.commands.append(name)
        async with super()._told(name):
            await asyncio.sleep(self.latency.get(name, 0))
            yield

    async def _command(self, name: str, *, needs_controller: bool = True) -> None:
        """A command that fails as the real one does while slurmctld is down."""
        async with self._told(name):
            if self.down and needs_controller:
                raise SlurmUnavailable(self.down)

    async def submit(self, user: str, script: str, log_dir: str, env: dict[str, str] | None = None,
                     certs: tuple[str, dict[str, str]] | None = None) -> int:
        env = self.env(env)
        submission = Submission(user, script, log_dir, env, certs)
        self.submissions.append(submission)
        if certs is not None:  # written by the same mediator run, before sbatch
            self._check_file_names(certs[1])
            self.private_files.append((user, certs[0], dict(certs[1])))
        self.commands.append("sbatch")
        async with super()._told("sbatch"):  # told as the real client tells it; its latency comes further down
            # The mediator's checks (portal/slurm/mediator.py), then sbatch's and slurmctld's.
            for name, value in env.items():
                if not (isinstance(name, str) and isinstance(value, str)) or "\0" in value:
                    raise SlurmError(f"dsportal mediator: environment variable {name!r} is not NAME=text")
            if not script.startswith("#!"):
                raise SlurmError("sbatch: error: This does not look like a batch script.  The first line must "
                                 "start with #! followed by the path to an interpreter.")
            if self.down:
                await asyncio.sleep(self.latency.get("sbatch", 0))
                raise SlurmUnavailable("sbatch: error: Batch job submission failed: Unable to contact slurm "
                                       "controller (connect failure)")
            if self.refusals:
                raise SlurmError(self.refusals.pop(0))
            options = sbatch_options(script)
            partition = options.get("--partition", "")
            if not any(partition in node.partitions for node in self.node_list):
                raise SlurmError("sbatch: error: Batch job submission failed: Invalid partition name specified")
            job_id, self._next_id = self._next_id, self._next_id + 1
            gpus, shards = gpus_and_shards(options.get("--gres", ""))
            record = Record(job_id=job_id, user=user, name=options.get("--job-name", "sbatch"), partition=partition,
                            submit_time=int(time.time()), time_limit=slurm_minutes(options.get("--time", "60")),
                            gpus=gpus, shards=shards, cpus=int(options.get("--cpus-per-task", "1")),
                            mem_mb=parse_memory_mb(options.get("--mem", "1000M")),
                            comment=options.get("--comment", ""),
                            output=options.get("--output", "slurm-%j.out").replace("%j", str(job_id)))
            self.records[job_id] = record  # slurmctld has it now, though sbatch has not answered yet
            submission.job_id = job_id
            if self.start_on:
                self.start(job_id, self.start_on)
            await asyncio.sleep(self.latency.get("sbatch", 0))
            return job_id

    async def cancel(self, user: str, job_id: int) -> None:
        self.cancels.append((user, int(job_id)))
        await self._command("scancel")
        record = self.records.get(int(job_id))
        if record is None or not record.listed:
            raise SlurmError(f"scancel: error: Kill job error on job id {job_id}: Invalid job id specified")
        if record.user != user:
            raise SlurmError(f"scancel: error: Kill job error on job id {job_id}: Access/permission denied")
        if record.state == "COMPLETING" or record.state not in PENDING_STATES | RUNNING_STATES:
            raise SlurmError(f"scancel: error: Kill job error on job id {job_id}: "
                             "Job/step already completing or completed")
        record.state, record.reason = "CANCELLED", "None"

    async def accounting(self, job_id: int, user: str | None = None) -> Job | None:
        # As the real one: None where sacct fails, keeps no accounting, or has no record (of that user).
        try:
            await self._command("sacct")
        except SlurmError:
            return None
        record = self.records.get(int(job_id))
        if not self.keeps_accounting or record is None or (user and record.user != user):
            return None
        state, exit_code, reason = record.recorded or (record.state, record.exit_code, record.reason)
        return Job(job_id=record.job_id, user=record.user, name=record.name, state=state, reason=reason or "None",
                   partition=record.partition, batch_host="", nodes=record.batch_host, exit_code=exit_code,
                   start_time=0, submit_time=0)

    async def read_as_user(self, user: str, path: str, lines: int = 30, not_before: float | None = None) -> str:
        await self._command("mediator tail", needs_controller=False)  # the mediator reads it: no slurmctld
        log = self.logs.get(path)
        if log is None:
            return f"(log {path} unreadable: dsportal mediator: [Errno 2] No such file or directory: '{path}')"
        if log.owner != user:
            return f"(log {path} unreadable: dsportal mediator: [Errno 13] Permission denied: '{path}')"
        if not_before is not None and log.mtime < int(not_before) - 1:
            return ""
        return bounded_tail(log.text[-slurmclient.TAIL_BYTES:], lines)

    async def write_private_files_as_user(self, user: str, folder: str, files: dict[str, str]) -> None:
        self._check_file_names(files)
        await self._command("mediator certs", needs_controller=False)
        self.private_files.append((user, folder, dict(files)))

    async def set_time_limit(self, job_id: int, minutes: int) -> None:
        await self._command("scontrol")
        record = self.records.get(int(job_id))
        if record is None or not record.listed or record.state not in PENDING_STATES | RUNNING_STATES:
            raise SlurmError(f"scontrol: error: Job {job_id} not found" if record is None
                             else "Job is no longer pending execution for job " + str(job_id))
        record.time_limit = int(minutes)

    async def time_ceiling(self, partition: str, qos: str | None) -> tuple[int | None, str]:
        await self._command("scontrol")
        limits = [(self.time_limits[partition], f"partition {partition}")] if partition in self.time_limits else []
        if qos and f"qos:{qos}" in self.time_limits:
            limits.append((self.time_limits[f"qos:{qos}"], f"QoS {qos}"))
        return min(limits) if limits else (None, "")

    async def _fetch_jobs(self) -> dict[int, Job]:
        await self._command("squeue")
        listed = [record for record in self.records.values() if record.listed]
        self._others_pending = [(r.job_id, r.partition, r.priority, r.submit_time) for r in listed
                                if not r.name.startswith(SESSION_JOB_PREFIX) and r.state in PENDING_STATES]
        return {r.job_id: r.job() for r in listed if r.name.startswith(SESSION_JOB_PREFIX)}

    async def _fetch_alone(self, job_id: int) -> Job | None:
        """squeue --jobs=ID: that job, if squeue still lists it and it is a session's."""
        record = self.records.get(job_id)  # as slurmctld knows it when asked
        job = record.job() if record and record.listed and record.name.startswith(SESSION_JOB_PREFIX) else None
        await self._command("squeue job")
        return job

    async def _fetch_nodes(self) -> list[Node]:
        await self._command("sinfo")
        nodes = []
        for node in self.node_list:  # what the running jobs hold of each
            held = [r for r in self.records.values() if r.listed and r.state in RUNNING_STATES
                    and r.batch_host == node.name]
            nodes.append(replace(node, alloc_cpus=node.alloc_cpus + sum(r.cpus for r in held),
                                 alloc_mem_mb=node.alloc_mem_mb + sum(r.mem_mb for r in held),
                                 alloc_gpus=node.alloc_gpus + sum(r.gpus for r in held),
                                 alloc_shards=node.alloc_shards + sum(r.shards for r in held)))
        return nodes

    # -- the cluster's side, played by the test -----------------------------------------------------
    def record(self, job_id) -> Record:
        return self.records[int(job_id)]

    def submitted(self, user: str | None = None) -> list[Submission]:
        """The submissions that became jobs (of ``user``)."""
        return [s for s in self.submissions if s.job_id is not None and (user is None or s.user == user)]

    def start(self, job_id, node: str = "") -> Record:
        """The scheduler runs the pending job, on ``node`` (else the first node of its partition)."""
        record = self.record(job_id)
        assert record.state in PENDING_STATES, f"job {job_id} is {record.state}, not pending"
        record.batch_host = node or next(n.name for n in self.node_list if record.partition in n.partitions)
        record.state, record.reason, record.start_time = "RUNNING", "None", int(time.time())
        return record

    def hold(self, job_id, reason: str, priority: int | None = None) -> Record:
        """The pending job waits for ``reason`` (Resources, QOSMaxGRESPerUser ...)."""
        record = self.record(job_id)
        record.reason = reason
        if priority is not None:
            record.priority = priority
        return record

    def completing(self, job_id, state: str = "COMPLETED", exit_code: int = 0, reason: str = "None") -> Record:
        """The job's batch script is over: squeue shows it COMPLETING while Slurm ends its processes,
        which hides how it ended; accounting has that already (``state``)."""
        record = self.record(job_id)
        record.state, record.reason = "COMPLETING", "None"
        record.recorded = (state, exit_code, reason)
        return record

    def end(self, job_id, state: str, exit_code: int = 0, reason: str = "None") -> Record:
        """The job ends as Slurm says: COMPLETED, FAILED, CANCELLED (an scancel outside the portal),
        TIMEOUT, NODE_FAIL, OUT_OF_MEMORY ..."""
        record = self.record(job_id)
        assert state not in PENDING_STATES | RUNNING_STATES, state
        record.state, record.exit_code, record.reason, record.recorded = state, exit_code, reason, None
        return record

    def requeue(self, job_id) -> Record:
        """Slurm preempted the running job and put it back in the queue (PreemptMode=REQUEUE): the same job id,
        pending until it may start again (BeginTime), its restart count one more."""
        record = self.record(job_id)
        assert record.state in RUNNING_STATES, f"job {job_id} is {record.state}, not running"
        record.state, record.reason, record.batch_host = "PENDING", "BeginTime", ""
        record.restarts += 1
        return record

    def forget(self, job_id) -> Record:
        """MinJobAge passed: squeue no longer lists the ended job (accounting, if kept, still has it)."""
        record = self.record(job_id)
        record.listed = False
        return record

    def queue_other(self, user: str, partition: str, priority: int = 1000, name: str = "train") -> Record:
        """Someone else's batch job (not a session), pending in ``partition``."""
        job_id, self._next_id = self._next_id, self._next_id + 1
        record = Record(job_id=job_id, user=user, name=name, partition=partition, priority=priority,
                        submit_time=int(time.time()) - 60)
        self.records[job_id] = record
        return record

    def write_log(self, job_id, text: str, mtime: float | None = None) -> str:
        """The job's output file (its --output), as the job wrote it; returns its path."""
        record = self.record(job_id)
        self.logs[record.output] = LogFile(record.user, text, time.time() if mtime is None else mtime)
        return record.output

    def go_down(self, message: str = CONTROLLER_DOWN) -> None:
        """slurmctld stops answering: every command that needs it fails with SlurmUnavailable."""
        self.down = message

    def come_back(self) -> None:
        self.down = ""

    def refuse_next_submit(self, message: str) -> None:
        """sbatch's next answer is this refusal (Slurm's words, e.g. a QoS limit)."""
        self.refusals.append(message)

    def new_hub_process(self) -> FakeSlurm:
        """The client of a restarted hub: the same cluster (its jobs, logs, nodes and what was asked of
        it), seen afresh: no snapshot taken yet."""
        client = FakeSlurm(cache_seconds=self.cache_seconds)
        for name in ("node_list", "records", "submissions", "cancels", "commands", "logs", "refusals", "latency",
                     "time_limits", "private_files", "keeps_accounting", "down", "start_on", "_next_id",
                     "slurm_release"):
            setattr(client, name, getattr(self, name))
        return client

    def records_age(self, seconds: float) -> None:
        """The hub's records of jobs (the last full listing, each job asked for alone) are ``seconds`` older."""
        self._squeue.taken_at -= seconds
        self._alone = {job_id: (taken_at - seconds, job) for job_id, (taken_at, job) in self._alone.items()}

    async def later(self) -> None:
        """Until a snapshot taken now is stale: the next squeue shows what changed meanwhile."""
        await asyncio.sleep(self.cache_seconds * 1.5)

    def active(self, user: str | None = None) -> list[Record]:
        """Jobs pending or running (of ``user``)."""
        return [r for r in self.records.values() if r.listed and r.state in PENDING_STATES | RUNNING_STATES
                and (user is None or r.user == user)]
