"""The one place that runs Slurm commands (what they print is read by portal/slurm/slurmparse.py).

Commands run with an argv list (never a shell), and fail with one set of errors: SlurmError
(Slurm's own words) and SlurmUnavailable (slurmctld did not answer). Two clients share them:

- :class:`Slurm`, asynchronous, for the hub: it runs commands as a user (runuser/sudo), and job
  state comes from one ``squeue`` of every job the controller still remembers (finished ones
  included, for MinJobAge), so a single call serves every session of the hub: callers share one
  cached snapshot (:func:`shared_client`) instead of each running its own. Only the portal's
  sessions are read in full (:func:`~portal.slurm.slurmparse.parse_squeue`); a department's
  thousands of other jobs cost a line each;
- :class:`SlurmCommands`, blocking, for code that runs Slurm as its own user and has no event loop
  of its own to spare: a session's job launcher (in kernels and threads) and the admin's commands.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import pwd
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from portal.core import defaults
from portal.slurm.mediator import slurm_first as slurm_first  # one piece for the hub and the mediator
from portal.slurm.slurmparse import (
    LINE_CHARS,
    Job,
    Node,
    Resources,
    SlurmError,
    SlurmMissing,
    SlurmUnavailable,
    array_task_ids,
    bounded_tail,
    checked_output,
    home_full as home_full,
    job_gpus as job_gpus,
    job_states_argv,
    newest_by_job,
    nodes_argv,
    parse_config,
    parse_job_id,
    parse_job_states,
    parse_release,
    parse_sacct,
    parse_scontrol_jobs,
    parse_sinfo_json,
    parse_squeue,
    partition_resources,
    queue_places,
    refusal_hint as refusal_hint,
    sacct_records,
    sacct_separator,
    slurm_minutes,
    squeue_format,
    tells_states_alone,
)

log = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# A user's file the hub shows her (her session's log): at most its last TAIL_BYTES, lines cut to LINE_CHARS.
TAIL_BYTES = 64 * 1024
# What of the hub's environment its Slurm commands get (the locale, where Slurm and munge are).
PASSED_ON = {"PATH", "LANG", "LANGUAGE", "TZ", "SLURM_CONF", "MUNGE_SOCKET"}


def sacct_argv(sacct: str, fields: tuple[str, ...], separator: str, *, job_ids: Iterable[int] = (), since: str = "",
               user: str | None = None) -> list[str]:
    """Whole jobs (-X), each field followed by ``separator`` (slurmparse.sacct_separator; -p): those of
    ``job_ids``, or those since ``since``; of ``user``, or all."""
    argv = [sacct, "-X", "-n", "-p", f"--delimiter={separator}"]
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


# While sessions run, or wait for JupyterLab in a job that runs, the hub looks at their jobs' states alone
# (Slurm.running_job), and lists the cluster's jobs in full at least every FULL_AT_REST seconds; a job id not asked
# after for WATCHED_FOR seconds (its session ended or is starting again) leaves that look. A job whose state the look
# finds changed is asked for alone (Slurm.job_alone), unless more than ONE_BY_ONE changed at once: then one listing.
FULL_AT_REST = 30.0
WATCHED_FOR = 60.0
ONE_BY_ONE = 8

ACCOUNTING_FIELDS = ("JobID", "User", "JobName", "State", "Reason", "Partition", "NodeList", "ExitCode", "Submit")


class JobStates(dict):
    """A look's answer (job id -> state) and the job ids it asked about (``asked``): one it does not list is
    gone from slurmctld, one it did not ask about is unknown to it."""

    def __init__(self, states: dict[int, str], asked: Iterable[int]):
        super().__init__(states)
        self.asked = frozenset(asked)


class Slurm:
    """Typed wrapper over the Slurm client commands.

    Everything the hub does as a user goes through the root-owned ``mediator`` (portal/slurm/mediator.py),
    run as her: with ``sudo`` (an unprivileged hub whose one sudo rule allows the mediator) or ``runuser``
    (a hub run as root).
    """

    def __init__(
        self,
        conf: Path | None = None,
        bin_dir: Path = Path(defaults.SLURM_BIN_DIR),
        submit_as: str = defaults.SUBMIT_AS,
        cache_seconds: float = defaults.SQUEUE_INTERVAL,
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
        self._states = _Snapshot(self._fetch_states, empty=None)  # the running sessions' jobs' states (running_job)
        self._watched: dict[int, float] = {}  # those jobs' ids: when each was last asked after
        self._alone: dict[int, tuple[float, Job | None]] = {}  # job_alone's answers: (when asked, the job)
        self._alone_flight: dict[int, tuple[float, asyncio.Future]] = {}  # job_alone's calls under way: (started, call)
        self._alone_slots = asyncio.Semaphore(ONE_BY_ONE)  # job_alone's squeues at once
        self._release_flight: asyncio.Future | None = None  # release()'s call under way, shared
        self._changes: tuple[object, int] = (None, 0)  # (a look, how many of its jobs changed state)
        # Commands run as users (the mediator: sbatch, certificates, scancel, log tails) a few at a time:
        # a class starting at once ran two Python processes per student together on the login node's
        # cores, which left the hub's own loop almost none and ran sbatch past its timeout.
        self._as_user_slots = asyncio.Semaphore(as_user_at_once or max(4, 2 * (os.cpu_count() or 1)))
        self._others_pending: list[tuple[int, str, int, int]] = []  # the last squeue's other pending jobs
        self._sinfo = _Snapshot(self._fetch_nodes, empty=[])
        self._release: str | None = None  # this host's commands' release, once asked ("": they did not say)
        self._cancels: set[asyncio.Task] = set()  # cancel_soon's, held until they end
        self._places: tuple[dict, dict] = ({}, {})  # (the squeue snapshot, its queue_places)
        # Told of each command: its name (command_name), outcome (ok; error: Slurm refused; unavailable:
        # slurmctld did not answer; None: it ended otherwise) and seconds. The hub's metrics set it.
        self.on_command: Callable[[str, str | None, float], None] | None = None

    # -- running commands -------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A command's environment: what the hub's own holds that a Slurm client needs, and ``extra``.

        Never the hub's whole environment: a command run as the user (and sbatch's job, which gets
        sbatch's environment) is hers to read in /proc/PID/environ, and the hub holds secrets
        (JUPYTERHUB_CRYPT_KEY, CONFIGPROXY_AUTH_TOKEN, LDAP passwords, API keys)."""
        env = {name: value for name, value in os.environ.items() if name in PASSED_ON or name.startswith("LC_")}
        env["PATH"] = slurm_first(self.bin_dir, env.get("PATH", SAFE_PATH))
        env.update(extra or {})
        if self.conf:
            env["SLURM_CONF"] = str(self.conf)
        else:  # configless, as portal.yaml says: not a slurm.conf the hub's own environment happens to name
            env.pop("SLURM_CONF", None)
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
        async with self._told(command_name(argv)):
            return await self._run(argv, input=input, env=env)

    @contextlib.asynccontextmanager
    async def _told(self, name: str):
        """One command's outcome (ok, unavailable, error) and seconds, told to on_command (the hub's metrics)."""
        started, outcome = time.monotonic(), None
        try:
            yield
            outcome = "ok"
        except SlurmUnavailable:
            outcome = "unavailable"
            raise
        except SlurmError:
            outcome = "error"
            raise
        finally:
            if self.on_command:
                self.on_command(name, outcome, time.monotonic() - started)

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

    async def running_job(self, job_id: int, fresh_after: float = 0.0) -> Job | None:
        """A session's job that runs, for the hub's checks that it still runs (hub.poll_interval, every few seconds
        for each session) and for a start's checks while JupyterLab starts in it (each second).

        Its newest record (the last full listing's, or :meth:`job_alone`'s, taken after ``fresh_after``) while one
        look at the states alone of every such job (slurmparse.job_states_argv, shared as the listing is) finds its
        state unchanged and that record is less than FULL_AT_REST seconds old. A job the look finds changed is
        asked for alone; where more than ONE_BY_ONE changed at once, one full listing taken after that look serves
        them all. A job with no record yet is asked for alone, while fewer than ONE_BY_ONE are asked for so (else
        the full listing). A record older than FULL_AT_REST, or one of a job that does not run (its place in the
        queue, its reason and estimate are the full listing's), comes from a full listing, as :meth:`job`.

        So a class running untouched costs one short answer a second, however many jobs of others slurmctld
        holds (a department's thousands, finished ones included until MinJobAge), and a full listing twice a
        minute, instead of a full listing every second; a class starting costs a short answer for each job's
        changes. Where the commands have no such look (22.05), or it fails, it is :meth:`job`; where slurmctld
        does not answer it, SlurmUnavailable at once, as the full listing would fail. A state that changes and
        changes back between two looks (a job requeued and run again within the second) shows with the next
        full listing."""
        job_id = int(job_id)
        if not tells_states_alone(await self.release()):
            return await self.job(job_id, fresh_after=fresh_after)  # no look to be had: as 22.05's commands are asked
        taken_at, known = self._newest(job_id, fresh_after)
        if taken_at == 0.0 and len(self._alone_flight) < ONE_BY_ONE:
            asked = time.monotonic()
            known = await self.job_alone(job_id, fresh_after)
            if known is None or known.running:
                return known
            return await self.job(job_id, fresh_after=max(fresh_after, asked))  # it waits: its place is the listing's
        if known is None or not known.running or time.monotonic() - taken_at >= FULL_AT_REST:
            return await self.job(job_id, fresh_after=fresh_after)
        self._watched[job_id] = time.monotonic()
        try:
            states = await self._states.get(self.cache_seconds)
            if states is not None and job_id not in states.asked:  # newly watched: the next look asks for it
                states = await self._states.get(self.cache_seconds, fresh_after=time.monotonic())
        except SlurmUnavailable:
            raise  # slurmctld did not answer (within command_timeout): a full listing would wait as long again
        except SlurmError as error:
            log.debug("The look at the sessions' job states failed (%s): a full listing instead", error)
            states = None
        if states is None:
            return await self.job(job_id, fresh_after=fresh_after)
        if states.get(job_id) == known.state:
            return known
        looked_at = self._states.taken_at
        if self._changed(states) > ONE_BY_ONE or len(self._alone_flight) >= ONE_BY_ONE:
            return await self.job(job_id, fresh_after=max(fresh_after, looked_at))  # one for them all
        return await self.job_alone(job_id, fresh_after=max(fresh_after, looked_at))

    def _newest(self, job_id: int, fresh_after: float) -> tuple[float, Job | None]:
        """(when taken, the job) of the newer of the last full listing's record of ``job_id`` and job_alone's,
        of those taken after ``fresh_after``; (0.0, None) where neither is."""
        listing = self._squeue
        candidates = [(listing.taken_at, listing.value.get(job_id))] if job_id in listing.value else []
        if job_id in self._alone:
            candidates.append(self._alone[job_id])
        candidates = [c for c in candidates if c[0] > fresh_after]
        return max(candidates, key=lambda c: c[0]) if candidates else (0.0, None)

    def _changed(self, states: dict[int, str]) -> int:
        """How many of the jobs the look ``states`` tells of have another state than their newest record (once a look)."""
        if self._changes[0] is not states:
            changed = 0
            for job_id, state in states.items():
                known = self._newest(job_id, 0.0)[1]
                changed += known is not None and known.state != state
            self._changes = (states, changed)
        return self._changes[1]

    async def job_alone(self, job_id: int, fresh_after: float = 0.0) -> Job | None:
        """The session job ``job_id`` as slurmctld tells it, asked for alone (``squeue --jobs=ID``, which
        slurmctld answers for that job without packing every job) after ``fresh_after`` (time.monotonic()); None
        where it does not know the id (or the job is no session). Callers asking for the same job share a call
        that started after their ``fresh_after``; at most ONE_BY_ONE such calls run at once. Its answer serves
        :meth:`running_job` after it."""
        job_id = int(job_id)
        while True:
            if job_id not in self._alone_flight:
                started = time.monotonic()
                self._alone_flight[job_id] = (started, asyncio.ensure_future(self._ask_alone(job_id, started)))
            started, call = self._alone_flight[job_id]
            job = await asyncio.shield(call)  # one caller cancelled does not cancel the call for the others
            if started > fresh_after:
                return job

    async def _ask_alone(self, job_id: int, asked: float) -> Job | None:
        try:
            async with self._alone_slots:
                job = await self._fetch_alone(job_id)
            self._alone = {other: answer for other, answer in self._alone.items() if asked - answer[0] < WATCHED_FOR}
            self._alone[job_id] = (asked, job)
            return job
        finally:
            self._alone_flight.pop(job_id, None)

    async def _fetch_alone(self, job_id: int) -> Job | None:
        try:
            sessions, _ = await self._squeue_sessions(f"--jobs={job_id}")
        except SlurmError as error:
            if "invalid job id" in str(error).lower():  # slurmctld forgot it (MinJobAge) or never had it
                return None
            raise
        return sessions.get(job_id)

    async def _fetch_states(self) -> dict[int, str] | None:
        """The states of the jobs asked after lately (running_job); None where the commands cannot tell
        states alone."""
        now = time.monotonic()
        self._watched = {job_id: asked for job_id, asked in self._watched.items() if now - asked < WATCHED_FOR}
        asked = sorted(self._watched)
        argv = job_states_argv(self.tool("squeue"), await self.release(), asked)
        if argv is None or not asked:
            return None
        return JobStates(parse_job_states(await self.run(argv)), asked)

    async def accounting(self, job_id: int, user: str | None = None) -> Job | None:
        """The job as Slurm accounting (slurmdbd) recorded it, once slurmctld has forgotten it;
        None where the cluster keeps no accounting or has no record. Job ids come round again
        (a reset cluster, wrap-around): the newest record of the id (of that user) is the one."""
        separator = sacct_separator()
        try:
            out = await self.run(sacct_argv(self.tool("sacct"), ACCOUNTING_FIELDS, separator, job_ids=[job_id],
                                            user=user))
            record = parse_sacct(out, ACCOUNTING_FIELDS, separator).get(int(job_id))
        except SlurmError:
            return None
        if record is None or (user and record["User"] != user):
            return None
        exit_code = record.get("ExitCode", "0:0").split(":")[0]
        return Job(job_id=int(job_id), user=record["User"], name=record["JobName"], state=record["State"],
                   reason=record.get("Reason") or "None", partition=record["Partition"], batch_host="",
                   nodes=record.get("NodeList", ""),
                   exit_code=int(exit_code) if exit_code.isascii() and exit_code.isdigit() else 0, start_time=0,
                   submit_time=0)

    async def nodes(self, max_age: float = 10.0) -> list[Node]:
        """Every node, from one shared listing (slurmparse.nodes_argv: `sinfo --json` on 22.05) taken at most every ``max_age`` seconds."""
        return await self._sinfo.get(max_age)

    @property
    def last_nodes(self) -> list[Node]:
        """The nodes of the last ``sinfo`` that answered (none before the first)."""
        return self._sinfo.value

    @property
    def last_jobs(self) -> dict[int, Job]:
        """The session jobs as last told, without asking Slurm: the last full listing's (none before the first),
        each job asked for alone since (job_alone) as that answer tells it."""
        listing = self._squeue
        newer = {job_id: job for job_id, (taken_at, job) in self._alone.items() if taken_at > listing.taken_at}
        if not newer:
            return listing.value
        jobs = {job_id: job for job_id, job in listing.value.items() if job_id not in newer}
        jobs.update((job_id, job) for job_id, job in newer.items() if job is not None)
        return jobs

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
        sessions, self._others_pending = await self._squeue_sessions()
        return sessions

    async def _squeue_sessions(self, *only: str) -> tuple[dict[int, Job], list[tuple[int, str, int, int]]]:
        """parse_squeue of ``squeue`` in squeue_format, of every job slurmctld knows (or those ``only`` names)."""
        # squeue --json (Slurm 22.05) filters nothing and prints ~100 fields of every job the controller
        # knows, which the hub parsed at each poll: its cost grew with the whole cluster's queue.
        separator = f"\x1f{secrets.token_hex(8)}\x1f"
        out = await self.run([self.tool("squeue"), "--noheader", "--all", "--states=all", *only],
                             env={"SQUEUE_FORMAT2": squeue_format(separator), "SLURM_TIME_FORMAT": "%s"})
        return parse_squeue(out, separator)

    async def _fetch_nodes(self) -> list[Node]:
        name, *args = nodes_argv(await self.release())
        try:
            return parse_sinfo_json(await self.run([self.tool(name), *args]))
        except SlurmError:
            self._release = None  # asked again next time: the commands may have been upgraded meanwhile
            raise

    async def release(self) -> str | None:
        """The release of this host's Slurm commands ("24.11.5"; None where they do not say), asked once:
        where releases differ, the layer speaks to it (slurmparse.nodes_argv)."""
        if self._release is None:
            if self._release_flight is None:  # callers at once share one call
                self._release_flight = asyncio.ensure_future(self.run([self.tool("sinfo"), "--version"]))
            call = self._release_flight
            try:
                self._release = parse_release(await asyncio.shield(call)) or ""
            except SlurmError:
                return None
            finally:
                if self._release_flight is call and call.done():
                    self._release_flight = None
        return self._release or None

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


def _client_key(conf: str | None, bin_dir: str, submit_as: str, mediator: str) -> tuple:
    return str(conf or ""), str(bin_dir), submit_as, mediator


def shared_client(conf: str | None, bin_dir: str, submit_as: str, cache_seconds: float,
                  mediator: str = defaults.MEDIATOR) -> Slurm:
    """One Slurm client (and so one squeue snapshot) per hub, whatever the number of sessions."""
    key = _client_key(conf, bin_dir, submit_as, mediator)
    if key not in _clients:
        _clients[key] = Slurm(Path(conf) if conf else None, Path(bin_dir), submit_as, cache_seconds=cache_seconds,
                              mediator=Path(mediator))
    return _clients[key]


def share_client(client: Slurm | None, conf: str | None, bin_dir: str, submit_as: str,
                 mediator: str = defaults.MEDIATOR) -> Slurm | None:
    """Make ``client`` what :func:`shared_client` hands out for these settings, to the hub's spawners (their
    ``slurm``), its spawn form and its metrics alike: the seam through which a Slurm of one's own takes the
    place of the commands (tests/fakeslurm.py's, a Slurm whose commands are a cluster in memory). Returns
    the client it replaces (None: none yet), to be put back the same way; None as ``client`` forgets the
    entry. The hub never calls it."""
    key = _client_key(conf, bin_dir, submit_as, mediator)
    replaced = _clients.pop(key, None)
    if client is not None:
        _clients[key] = client
    return replaced


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
        env = {name: value for name, value in os.environ.items() if name != "SLURM_CONF"}  # portal.yaml's alone
        return cls(env={**env, **settings.slurm_env()}, bin_dir=settings.slurm.bin_dir)

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

    def jobs(self, job_id: int) -> dict[int, dict[str, str]]:
        """``scontrol show job``'s fields of one of the user's jobs (an array's: each task's), by job id;
        {} for an id slurmctld does not know (any more).

        Never of all jobs: without PrivateData=jobs (Slurm's default) that lists everyone's, and
        scontrol prints a job's name and comment as they were given, line breaks included, so a
        neighbour's job named "x\\nJobId=<hers> JobState=COMPLETED" would read as a line of hers."""
        argv = [self.tool("scontrol"), "show", "job", "-o", str(int(job_id))]
        try:
            return parse_scontrol_jobs(self.run(argv))
        except SlurmError as error:
            if "Invalid job id" in str(error) and not isinstance(error, SlurmUnavailable):
                return {}
            raise

    def _sacct(self, fields: tuple[str, ...], *, job_ids: Iterable[int] = (), since: str = "", user: str | None = None,
               whole_jobs: bool = True, timeout: float = 15) -> list[dict[str, str]]:
        """sacct's records, read with a separator of this call's own (slurmparse.sacct_records)."""
        separator = sacct_separator()
        argv = sacct_argv(self.tool("sacct"), fields, separator, job_ids=job_ids, since=since, user=user)
        return sacct_records(self.run(argv, timeout=timeout), fields, separator, whole_jobs=whole_jobs)

    def accounting(self, job_ids: list[int], fields: tuple[str, ...], timeout: float = 15) -> dict[int, dict[str, str]]:
        """What Slurm accounting recorded of this user's ``job_ids`` (raises where the cluster keeps none)."""
        return newest_by_job(self._sacct(fields, job_ids=job_ids, user=_own_name(), timeout=timeout))

    def array_states(self, job_id: int, timeout: float = 15) -> dict[int, str]:
        """The state Slurm accounting recorded of each task of this user's job array ``job_id`` (its rows
        ID_N), for tasks slurmctld forgot; raises where the cluster keeps no accounting."""
        states = {}
        for record in self._sacct(("JobID", "State"), job_ids=[job_id], user=_own_name(), whole_jobs=False,
                                  timeout=timeout):
            state = record["State"]
            array, _, tasks = record["JobID"].partition("_")
            if array != str(int(job_id)) or not tasks.isascii():
                continue
            # one row per task that ran (ID_3); one for those that never did (ID_[4-9%2], cancelled pending)
            for task in array_task_ids(tasks):
                states[task] = (state.split() or ["UNKNOWN"])[0]
        return states

    def accounting_since(self, since: str, fields: tuple[str, ...], user: str | None = None,
                         timeout: float = 60) -> list[dict[str, str]]:
        """Every whole job accounting recorded since ``since`` (a Slurm time: 2026-11-01T00:00:00, now-1minutes)."""
        return self._sacct(fields, since=since, user=user, timeout=timeout)

    def accounting_backlog(self, timeout: float = 10) -> int | None:
        """How many accounting records slurmctld holds for slurmdbd (sdiag's "DBD Agent queue size"): more
        than a few while slurmdbd is down or catching up. None where sdiag does not say (not allowed, or a
        release that prints it otherwise)."""
        try:
            out = self.run([self.tool("sdiag")], timeout=timeout)
        except SlurmError:
            return None
        return parse_dbd_backlog(out)

    def nodes(self, timeout: float = 10) -> list[Node]:
        try:
            release = parse_release(self.run([self.tool("sinfo"), "--version"], timeout=timeout))
        except SlurmError:
            release = None
        name, *args = nodes_argv(release)
        return parse_sinfo_json(self.run([self.tool(name), *args], timeout=timeout))

    def partitions(self) -> list[str]:
        out = self.run([self.tool("sinfo"), "-h", "-o", "%R"])
        return sorted({line.strip() for line in out.splitlines() if line.strip()})

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (slurm.conf and cgroup.conf, as slurmctld has them)."""
        return parse_config(self.run([self.tool("scontrol"), "show", "config"]))

    def releases(self) -> tuple[str | None, str | None]:
        """(slurmctld's version, this host's commands' version), e.g. ("22.05.8", "22.05.8"); None where not
        found. Raises where slurmctld does not answer."""
        controller = parse_release(self.config().get("SLURM_VERSION", ""))
        try:
            commands = parse_release(self.run([self.tool("sinfo"), "--version"]))
        except SlurmError:
            commands = None
        return controller, commands


CATCHING_UP = 100  # records slurmctld holds for slurmdbd, at least, before its answers are called behind
_DBD_BACKLOG = re.compile(r"^\s*DBD Agent queue size:\s*([0-9]+)\s*$", re.MULTILINE)


def parse_dbd_backlog(sdiag_out: str) -> int | None:
    """sdiag's "DBD Agent queue size: N" (Slurm 22.05 to 25.x), or None."""
    found = _DBD_BACKLOG.search(sdiag_out)
    return int(found.group(1)) if found else None


def command_name(argv: list[str]) -> str:
    """'squeue' for [.../squeue, --json]; for the mediator run as a user ([runuser, -u, alice, --,
    .../mediator, submit]) what it did: 'sbatch' (submit, or start: certificates and sbatch in one run),
    'scancel', 'mediator tail', 'mediator certs'."""
    for index, part in enumerate(argv):
        name = Path(part).name
        if name == "squeue" and "--only-job-state" in argv:
            return "squeue states"
        if name == "squeue" and any(arg.startswith("--jobs=") for arg in argv):
            return "squeue job"
        if name in ("sbatch", "scancel", "squeue", "sinfo", "scontrol", "sacct", "srun"):
            return name
        if part.endswith("/mediator"):
            verb = argv[index + 1] if index + 1 < len(argv) else ""
            return {"submit": "sbatch", "start": "sbatch", "cancel": "scancel"}.get(verb, f"mediator {verb}".strip())
    return Path(argv[0]).name if argv else "?"
