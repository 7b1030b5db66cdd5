"""SlurmGPUSpawner: a JupyterLab session as a Slurm job holding the user's GPU slice.

Built on batchspawner's SlurmSpawner (its traits, state keeping and the hub API through
which the job reports its port) but talking to Slurm through :mod:`portal.slurm.slurmclient`: argv
lists instead of shell strings, one shared ``squeue`` for all sessions, and a start
that fails fast with the job's own error text when the job dies before its server answers.
"""

from __future__ import annotations

import asyncio
import json
import pwd
import time
from dataclasses import dataclass
from datetime import datetime

import batchspawner
from batchspawner import JobStatus
from jupyterhub.spawner import SpawnException
from traitlets import Any, Bool, Dict, Float, Instance, Integer, List, Unicode, default

from portal.core import sessionvars
from portal.core.rules import LaunchPolicy, SessionRequest, SessionSlice, share_name
from portal.core.sessionspec import SessionSpec
from portal.core.settings import DataMount, Image, Profile, human_duration, parse_walltime
from portal.core.settingtraits import setting
from portal.core.templatesources import Spec
from portal.core.templating import render
from portal.core.userjson import unix_groups
from portal.slurm.slurmclient import Job, Slurm, SlurmError, SlurmUnavailable, home_full, refusal_hint, shared_client
from spawner import metrics

# How a session job that ended outside the portal is described to its user, by Slurm state.
ENDINGS = {"CANCELLED": "was cancelled", "TIMEOUT": "reached its time limit", "NODE_FAIL": "lost its node",
           "FAILED": "failed", "OUT_OF_MEMORY": "ran out of memory", "PREEMPTED": "was preempted",
           "COMPLETED": "ended", "BOOT_FAIL": "could not start its node", "DEADLINE": "reached its deadline"}
TAKE_OVER_WAIT = 30.0  # seconds a start taking a kept job over waits for Slurm to list it (then: again later)
PROGRESS_REPEAT = 10.0  # seconds: a start's unchanged progress is told again (its time waited) this often
FINAL_WAIT = 5.0  # seconds to wait for Slurm accounting to record how a COMPLETING job ended
# Seconds a stop waits for Slurm to take its cancel; a slurmctld down or hung gets it again in the background.
STOP_WAITS_FOR_SLURM = 10.0
# Seconds a port report that arrives while its start's sbatch has not returned waits for it.
REPORT_WAITS_FOR_SUBMISSION = 120.0


class SpawnFailed(SpawnException):
    """The session job was refused, or ended before JupyterLab answered; the message is for the user."""

    def __init__(self, message: str, *, reason: str = "job-failed", status_code: int = 500, private: str = "",
                 logged: str = ""):
        # The hub logs str(self): ``logged`` (else the message). ``private`` (the user's own log
        # lines) is shown to her alone, on the spawn page and in the progress stream.
        super().__init__(logged or message, reason=reason, status_code=status_code)
        self.jupyterhub_message = f"{message}{private}"


@dataclass(frozen=True)
class Extension:
    """What asking for more walltime did: ``done`` or not, and the message for the user."""

    done: bool
    message: str
    time_limit_s: int = 0


async def extend_walltime(slurm: Slurm, job_id: int | None, profile: Profile, minutes: int, user: str) -> Extension:
    """``minutes`` more for ``user``'s running session job, up to its profile's max_walltime
    (portal.hub.extend: the hub's service, a Slurm operator, asks on the session's owner's behalf)."""
    job = await slurm.job(int(job_id), max_age=0) if job_id else None
    if job is None or not job.running or job.user != user:
        return Extension(False, "Your session is not running, so there is nothing to extend.")
    most, whose = parse_walltime(profile.max_walltime) // 60, profile.display_name
    try:
        # The hub is a Slurm operator, whom Slurm lets past these: the portal keeps to them.
        ceiling, limit = await slurm.time_ceiling(profile.partition, profile.qos)
        if ceiling is not None and ceiling < most:
            most, whose = ceiling, limit
        if job.time_limit >= most:
            return Extension(False, f"Your session already has the longest walltime {whose} allows, "
                             f"{human_duration(most * 60)}; save your work before it ends.")
        wanted = min(job.time_limit + minutes, most)
        await slurm.set_time_limit(job.job_id, wanted)
    except SlurmError as error:
        return Extension(False, f"Slurm refused to extend your session: {error}")
    capped = f", the longest {whose} allows" if wanted == most else ""
    return Extension(True, f"Your session's walltime is now {human_duration(wanted * 60)}{capped} "
                     f"({human_duration((wanted - job.time_limit) * 60)} more).", wanted * 60)


class RequestRefused(SpawnFailed):
    """A request the profile does not allow: HTTP 400, nothing submitted."""

    def __init__(self, message: str):
        super().__init__(message, reason="invalid-request", status_code=400)


def _saved_in(run: list[str]) -> str:
    """What JupyterLab saved as the session was warned (the last such line of its log's run), in words; '' if none."""
    said = [line for line in run if line.startswith(sessionvars.WALLTIME_SAVED)]
    return f" As it ended, JupyterLab saved: {said[-1][len(sessionvars.WALLTIME_SAVED):].strip()}." if said else ""


def session_job_name(user: str, server: str) -> str:
    """The Slurm job name of ``user``'s session ``server`` (session.sbatch.j2's job_name)."""
    return f"dsportal-{user}" + (f":{server}" if server else "")


class SlurmGPUSpawner(batchspawner.SlurmSpawner):
    """Each trait that mirrors a portal.yaml key is made from it (portal/core/settingtraits.py: its kind, default and
    description, set by the hub's configuration from the loaded settings) and named after it (session.X -> X,
    slurm.X -> slurm_X or X; session_environment, as JupyterHub's Spawner has an environment of its own)."""

    hub_checking = False  # set by the wrapping PartitionSpawner, whose pending the hub's startup check flags
    on_submitted = None  # called once sbatch returned the job's id (PartitionSpawner stores the state then)
    starting = False  # submitted, not yet serving: kept in the state, so that a restarted hub knows
    kept = None  # {"job_id", "slice", "token_id"}: a start the hub's startup check found still queued, to be resumed
    resume_job_id = ""  # set by PartitionSpawner: this start takes over that queued job instead of submitting
    token_id = 0  # the id (JupyterHub's orm.APIToken.id) of the token the starting job was submitted with
    restarts = 0  # Slurm's restart count of the job's run that serves: more means Slurm requeued it (preemption)
    taken_over_token = -1  # while a start takes a kept job over: the token id its report may bring (0: unknown)
    token_adopted = False  # that report came: the session's token is the job's own (PartitionSpawner.start_polling)
    # not `environment`: JupyterHub's Spawner.environment is the job's environment variables
    session_environment = setting("session.environment")
    log_dir = setting("session.log_dir")
    workdir = setting("session.workdir")
    umask = setting("session.umask")

    slurm_conf = setting("slurm.conf")
    slurm_bin_dir = setting("slurm.bin_dir")
    mediator = setting("slurm.mediator")
    submit_as = setting("slurm.submit_as")
    squeue_interval = setting("slurm.squeue_interval")

    # portal.yaml's own models, validated once as the hub loaded it: never dumped and validated again here.
    profile = Instance(Profile, allow_none=True, help="The partition profile sessions run on.").tag(config=True)

    images = List(Instance(Image), help="Image catalog; each profile's share become kernels.").tag(config=True)
    data_mounts = List(Instance(DataMount), help="Folders bound into every container kernel.").tag(config=True)

    launch_profiles = List(
        Instance(Profile), help="Profiles the session's job launcher may use: the user's own."
    ).tag(config=True)

    templates = Dict(
        help="Template notebooks (portal.core.settings.TemplateSettings fields): every session shows the sources "
             "the user's groups see, read-only, in its templates folder."
    ).tag(config=True)

    sharing_groups = List(Unicode(), help="portal.yaml's sharing.groups: a session of a member of one of "
                          "them can be shared, and loads live co-editing (portal.session.sharing).").tag(config=True)

    log_tail_lines = Integer(25, help="Lines of the job log shown when a session fails.").tag(config=True)

    save_ahead = setting("session.save_ahead")
    activity_interval = setting("session.activity_interval")
    gpu_busy_percent = setting("session.gpu_busy_percent")
    code_server = setting("session.code_server")
    r_repository = setting("session.r_repository")

    # ------------------------------------------------------- runtime state
    slice = Instance(SessionSlice, allow_none=True,
                     help="The slice this session holds, validated once (by PartitionSpawner, or at submit); kept in "
                     "the hub's state, so a restarted hub neither re-derives nor re-judges it.")
    job = Instance(Job, allow_none=True, help="The session job as Slurm last listed it.")
    submitted_at = Float(0.0, help="time.monotonic() when sbatch returned: older squeue snapshots cannot list the job.")
    submitted_wall = Float(0.0, help="time.time() of the submission: the job's log must be newer.")
    awaiting_port = Bool(False, help="Whether the job being started may report its port now.")
    port_reported = Any(None, help="asyncio.Event set when the job's port report is accepted.")
    submitting = Any(None, help="asyncio.Event set once the start's sbatch has returned (or failed).")
    reported_job = Any(None, help="The Job Slurm showed running when this start's port report was taken; the "
                       "route goes to its batch host.")
    session_json = Unicode("", help="What the session job is told (portal.core.sessionspec, sessionvars.SESSION): made at "
                           "submit.")
    service_url = Unicode("", help="dsportal's JupyterHub service as sessions reach it (portal.hub.extend).").tag(
        config=True)
    request = Instance(SessionRequest, allow_none=True,
                       help="The start's request, judged once where it entered the hub (PartitionSpawner.judged): "
                       "what the job's script and the session's environment are made from.")
    last_end = Unicode("", help="Why the session ended without a stop through the portal; PartitionSpawner keeps it "
                       "in the hub's state for the user's next page.")
    submit_certs = Any(None, help="(folder, {name: text}): the session's certificates, written by the submission's "
                       "mediator run before sbatch (PartitionSpawner.move_certs hands them over, not linked as the "
                       "traits both spawners have); None: nothing to write.")

    # batchspawner's own startup loop polls every 0.5 s with one squeue each; ours reads the
    # shared snapshot, so the interval only decides how soon a change is noticed.
    @default("startup_poll_interval")
    def _startup_poll_default(self):
        return self.squeue_interval

    # ---------------------------------------------------------------- helpers
    @classmethod
    def shared_client(cls, config) -> Slurm:
        """The hub's shared Slurm client, from the hub's traitlets config of this class."""
        section = config["SlurmGPUSpawner"] if "SlurmGPUSpawner" in config else {}
        traits = cls.class_traits()

        def value(name):
            return section[name] if name in section else traits[name].default_value

        return shared_client(value("slurm_conf"), value("slurm_bin_dir"), value("submit_as"), value("squeue_interval"),
                             value("mediator"))

    @property
    def slurm(self) -> Slurm:
        return shared_client(self.slurm_conf, self.slurm_bin_dir, self.submit_as, self.squeue_interval, self.mediator)

    @property
    def home(self) -> str:
        return pwd.getpwnam(self.user.name).pw_dir

    def _expand(self, template: str) -> str:
        return template.format(home=self.home, user=self.user.name)

    @property
    def job_name(self) -> str:
        """``dsportal-<user>`` for her default session, ``dsportal-<user>:<name>`` for a named one (server
        names are JupyterHub 6's safe slugs: lowercase letters, digits and single hyphens)."""
        return session_job_name(self.user.name, self.name)

    def kernel_catalog(self, profile: str) -> str:
        """JSON for the kernelspecs the job writes (portal.session.singleuser): this profile's images, the data mounts."""
        images = [i.model_dump(mode="json") for i in self.images if not i.profiles or profile in i.profiles]
        if not images:
            return ""
        return json.dumps({"images": images, "data_mounts": [m.model_dump(mode="json") for m in self.data_mounts]},
                          separators=(",", ":"))

    def session_spec(self) -> SessionSpec:
        """What the session job is told (portal.core.sessionspec): made at submit, from the judged request and the
        settings; the session validates it once as it starts."""
        groups = unix_groups(self.user.name)
        shared = self.sharing_groups and self.request is not None and self.request.shared  # started shareable
        templates = Spec.for_user(self.templates, groups) if self.templates.get("sources") else None
        return SessionSpec(
            activity_interval=self.activity_interval, gpu_busy_percent=self.gpu_busy_percent,
            idle_limit=self.idle_limit() or 0, save_ahead=self.save_ahead, report_wait=int(self.start_timeout),
            service_url=self.service_url,
            tools={"offered": self.profile.tools, "code_server": self.code_server, "r_repository": self.r_repository},
            # the job launcher: the profiles this user may use, the images and data mounts (live node limits the
            # session reads itself)
            launch_policy=LaunchPolicy(profiles=self.launch_profiles or [self.profile],
                                       default_profile=self.profile.name, images=self.images,
                                       data_mounts=self.data_mounts, environment=self.session_environment),
            # the sharing groups she is a Unix member of now (portal.hub.sharing)
            sharing_groups=sorted(groups & set(self.sharing_groups)) if shared else [],
            templates=templates.as_dict() if templates is not None else None)

    def get_env(self):
        env = super().get_env()
        # JupyterHub's reporter's interval, for nodes still on a dsportal older than the hub's; a current session's config
        # turns that reporter off and reports as it is used (portal.session.usage.activity.Reports)
        env["JUPYTERHUB_ACTIVITY_INTERVAL"] = str(self.activity_interval)
        env[sessionvars.SESSION] = self.session_json
        return env

    # ------------------------------------------------------- the hub's state
    def get_state(self):
        state = super().get_state()
        if self.starting:  # a state stored between sbatch and the port report (PartitionSpawner._store_state)
            state["starting"] = True
        if self.token_id:  # the job's token: a take-over after a hub restart or a requeue checks its report by it
            state["token_id"] = self.token_id
        if self.slice is not None:
            state["slice"] = {"gpus": self.slice.gpus, "cpus": self.slice.cpus, "mem_mb": self.slice.mem_mb,
                              "walltime": self.slice.walltime, "shares": self.slice.shares}
        if self.restarts:  # the serving run of a job Slurm requeued: a further requeue is told apart
            state["restarts"] = self.restarts
        return state

    def load_state(self, state):
        super().load_state(state)
        self.starting = state.get("starting") is True
        self.token_id = state.get("token_id") if isinstance(state.get("token_id"), int) else 0
        self.restarts = state.get("restarts") if isinstance(state.get("restarts"), int) else 0
        if "slice" in state:  # as it was validated at the start, whatever the config says now
            self.slice = SessionSlice(profile=self.profile, **state["slice"])
        # (a session started before slices were kept, by 0.1.0: kept running, without an idle limit)

    def clear_state(self):
        super().clear_state()
        self.slice = None
        self.request = None
        self.job = None
        self.token_id = 0
        self.restarts = 0
        self.starting = False

    # ------------------------------------------------ batchspawner's job interface
    async def submit_batch_script(self):
        if self.request is None:  # fails closed: only PartitionSpawner, which judges the request, starts this one
            raise SpawnFailed("This session was started without a judged request: start it again from the spawn "
                              "page.", reason="not-judged", status_code=400)
        # The judged request's script, rendered and submitted here in one step: the GPU count goes from the
        # request to the #SBATCH line through this function and templating.render alone.
        request = self.request
        chosen = self.slice = request.slice
        profile = chosen.profile
        env_prefix = self.session_environment.rstrip("/")
        command = [f"{env_prefix}/bin/python", "-m", "portal.session.singleuser", f"{env_prefix}/bin/jupyterhub-singleuser"]
        try:
            script = render(
                "session.sbatch.j2",
                job_name=self.job_name,
                server_name=self.name,
                partition=profile.partition,
                gpus=chosen.gpus,
                shares=chosen.shares,
                cpus=chosen.cpus,
                mem_mb=chosen.mem_mb,
                walltime=chosen.walltime,
                log_path=f"{self._expand(self.log_dir)}/session-%j.log",
                workdir=self._expand(self.workdir),
                profile=profile.model_dump(),
                environment=env_prefix,
                umask=self.umask,
                command=command + self.get_args(),
                catalog=self.kernel_catalog(profile.name),
                mail_user=request.mail_user,
                # Not for a walltime that is hardly longer: Slurm would signal it as it starts.
                # A preemptible one always: Slurm sends the same signal as it preempts (preempt_send_user_signal).
                save_ahead=self.save_ahead if parse_walltime(chosen.walltime) > self.save_ahead + 60 else
                int(bool(profile.preemption)),
            )
        except ValueError as error:
            raise RequestRefused(f"Your session request was refused: {error}") from None
        self.session_json = self.session_spec().to_env()
        self.submitted_wall = time.time()
        try:
            # sbatch hands its umask to slurmstepd, which creates the job's log with it.
            job_id = await self.slurm.submit(self.user.name, script, self._expand(self.log_dir),
                                             env={**self.get_env(), "SLURM_UMASK": self.umask},
                                             certs=self.submit_certs)
            self.submit_certs = None
        except SlurmUnavailable as error:
            raise SpawnFailed(f"The cluster scheduler is not answering right now, please retry in a minute ({error})",
                              reason="scheduler-unavailable", status_code=503) from None
        except SlurmError as error:
            if home_full(str(error)):
                raise SpawnFailed("Your home folder is full: the session's files (its log and certificates, under "
                                  f"{self._expand(self.log_dir)}) cannot be written ({error}). Free some space, or ask "
                                  "your admin for more, then start again. Nothing was submitted.",
                                  reason="home-full", status_code=507) from None
            hint = refusal_hint(str(error), profile.account, profile.qos)
            raise SpawnFailed(f"Slurm refused the session job: {error}{hint}", reason="submit-refused",
                              status_code=400) from None
        self.log.info("Submitted session job %s for %s", job_id, self.user.name)
        self.job_id = str(job_id)
        self.job = None
        # Only a squeue started after sbatch returned is sure to list the job: an earlier one,
        # still running when sbatch returned, may not (the job then looked "ended" at once).
        self.submitted_at = time.monotonic()
        self.starting = True
        if self.on_submitted is not None:
            self.on_submitted()
        return self.job_id

    async def query_job_status(self, fresh_after: float | None = None, by_look: bool = False):
        """The job's status from the shared squeue snapshot (one taken after ``fresh_after``; None: after the
        submission). ``by_look``: a check that a look at the jobs' states alone answers while nothing changed
        (Slurm.running_job): a running session's, and a start's while it waits."""
        if not self.job_id:
            self.job_status = ""
            return JobStatus.NOTFOUND
        try:
            # A snapshot older than our own sbatch cannot know the job yet.
            if fresh_after is None:
                fresh_after = self.submitted_at
            look = self.slurm.running_job if by_look else self.slurm.job
            job = await look(int(self.job_id), fresh_after=fresh_after)
        except SlurmError as error:
            # One failed squeue must never drop a session: report UNKNOWN and look again later.
            self.log.warning("Job %s: squeue failed, keeping the session: %s", self.job_id, error)
            self.job_status = f"UNKNOWN {error}"
            return JobStatus.UNKNOWN
        self.job = job
        if job is None:
            self.job_status = ""
            return JobStatus.NOTFOUND
        self.job_status = f"{job.state} {job.batch_host}".strip()
        if job.ending:  # the session's server is gone with its batch script
            # A start waiting on a job its partition may requeue (a take-over of one Slurm is requeueing, a
            # preemption as it boots): Slurm either queues it again or ends it; the next look tells.
            requeueable = self.slice is not None and self.slice.profile.preemption == "requeue"
            return JobStatus.PENDING if self.starting and requeueable else JobStatus.NOTFOUND
        if job.running:
            return JobStatus.RUNNING
        if job.pending:
            return JobStatus.PENDING
        return JobStatus.NOTFOUND

    async def cancel_batch_job(self) -> bool:
        """scancel the job; whether Slurm took it within STOP_WAITS_FOR_SLURM s. A slurmctld that does
        not answer is asked again in the background until it does (Slurm.cancel_until_done)."""
        if not self.job_id:
            return True
        job_id = int(self.job_id)
        cancel = self.slurm.cancel_soon(self.user.name, job_id)

        def failed(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception():
                self.log.warning("scancel %s of %s failed: %s", job_id, self.user.name, done.exception())

        cancel.add_done_callback(failed)
        try:
            await asyncio.wait_for(asyncio.shield(cancel), STOP_WAITS_FOR_SLURM)
        except TimeoutError:
            self.log.warning("Slurm has not taken the cancel of job %s of %s in %.0f s: it is asked again until it "
                             "does", job_id, self.user.name, STOP_WAITS_FOR_SLURM)
            return False
        except SlurmError:
            return False  # logged by the callback
        return True

    async def stop(self, now=False):
        """Cancel the job, then wait (at most ~10 s) until Slurm no longer lists it running. A stop
        never waits out an outage of slurmctld: JupyterHub refuses the user's next start while one
        is pending ("... is pending stop"), so the cancel goes on in the background instead."""
        if not self.job_id:
            return
        self.log.info("Stopping session job %s of %s", self.job_id, self.user.name)
        if not await self.cancel_batch_job() or now:
            return
        for _ in range(10):
            if await self.query_job_status(fresh_after=time.monotonic()) != JobStatus.RUNNING:
                return
            await asyncio.sleep(1)
        self.log.warning("Session job %s of %s still runs 10 s after it was cancelled", self.job_id, self.user.name)

    def state_ispending(self):
        return bool(self.job and self.job.pending)

    def state_isrunning(self):
        return bool(self.job and self.job.running)

    def state_isunknown(self):
        return self.job_status.startswith("UNKNOWN")

    def state_gethost(self):
        return self.job.batch_host if self.job else ""

    # ------------------------------------------------------- the port report
    async def accept_port(self, port: int, job_id: str) -> str | None:
        """The session job's one port report. None when taken; else why it is refused (HTTP 409).

        Only while this spawner waits for it, only from the job being started, only once: a later
        post (any process of the user holds the session's token) cannot move the route. The same
        report again (the job asks again when the answer to the first was lost) changes nothing and
        is taken.
        """
        if self.port and self.port == port and str(job_id) == str(self.job_id):
            return None
        if self.submitting is not None and not self.submitting.is_set():
            # The job can run and report before sbatch has brought its id back to the hub: sbatch slows
            # while a whole class is being submitted, and a session's server can be serving before it
            # returns. The report waits for the submission, then is judged as any other.
            try:
                await asyncio.wait_for(self.submitting.wait(), REPORT_WAITS_FOR_SUBMISSION)
            except TimeoutError:
                return (f"the hub has not finished submitting {self.user.name}'s session job after "
                        f"{REPORT_WAITS_FOR_SUBMISSION:.0f} s")
        if not self.awaiting_port or self.port:
            return (f"session job {self.job_id or '-'} of {self.user.name} is not starting "
                    f"(its port {self.port or '-'} is already registered): port reports are accepted once")
        if str(job_id) != str(self.job_id):
            return f"the report names job {job_id or '(none)'}, but the session being started is job {self.job_id}"
        # Slurm's word on this job after the report arrived: asked for alone, which slurmctld answers without
        # packing every job of the cluster (a department's thousands) as the full listing does. A Slurm that
        # does not answer is the caller's 503 (portreport.py): the session asks again.
        arrived = time.monotonic()
        job = await self.slurm.job_alone(int(self.job_id), fresh_after=arrived)
        if job is None or not job.running:
            return f"Slurm does not show session job {self.job_id} running"
        self.job = self.reported_job = job  # the route goes to the batch host this answer names
        self.port = port
        self.awaiting_port = False
        self.port_reported.set()
        return None

    # ---------------------------------------------------------------- lifecycle
    def queue_limit(self) -> float:
        """Seconds the session may wait in Slurm's queue: its profile's queue_limit."""
        return parse_walltime(self.slice.profile.queue_limit)

    def _queued_too_long(self) -> SpawnFailed:
        job, chosen = self.job, self.slice
        reason = f" (Slurm's reason: {job.reason})" if job and job.reason not in ("None", "") else ""
        return SpawnFailed(
            f"Your session waited {human_duration(self.queue_limit())} in Slurm's queue for {chosen.describe()}"
            f"{reason}, the longest {chosen.profile.display_name} lets a "
            "session wait; it was taken out of the queue. Try fewer GPUs, another profile, or later.",
            reason="queue-limit", status_code=503)

    def session_log(self) -> str:
        """The session job's log (the batch script's --output, session-%j.log): the user's file."""
        return f"{self._expand(self.log_dir)}/session-{self.job_id}.log"

    async def _failure(self, job: Job | None, what: str) -> SpawnFailed:
        """A message a person understands: what happened, Slurm's reason, the job's last words."""
        job_id = self.job_id
        log_path = self.session_log()
        # Job ids come round again after a Slurm reset: a log from before this submission is another job's.
        job = await self._final(job)
        tail = (await self.slurm.read_as_user(self.user.name, log_path, int(self.log_tail_lines),
                                              not_before=self.submitted_wall or None)).strip()
        state = f"{job.state}, reason {job.reason}, exit code {job.exit_code}" if job else "no longer known to Slurm"
        message = f"Session job {job_id} {what} ({state})."
        if not tail:
            return SpawnFailed(message)
        # Her log's lines are hers: shown to her, while the hub's log names the file.
        return SpawnFailed(message, private=f" Last lines of {log_path}:\n{tail}",
                           logged=f"{message} Last lines of {log_path} shown to {self.user.name}.")

    async def start(self):
        self.last_end = ""
        self.ip = self.traits()["ip"].default_value
        self.port = 0
        if self.server:
            self.server.port = self.port
        self.port_reported = asyncio.Event()
        self.reported_job = None
        self.submitting = submitting = asyncio.Event()
        try:
            try:
                if self.resume_job_id:
                    await self._take_over_queued_job()
                else:
                    await self.submit_batch_script()
            finally:
                submitting.set()
            self.awaiting_port = True  # the job may report before we see it running
            try:
                serving = await self._wait_until_serving()
                self.starting = False
                return serving
            finally:
                self.awaiting_port = False
        except SpawnFailed as failure:
            metrics.SPAWN_FAILURES.labels(self.profile.name if self.profile else "", failure.reason).inc()
            raise

    async def _until_port_or(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.port_reported.wait(), seconds)
        except TimeoutError:
            pass

    async def _wait_until_serving(self):
        # Wait for the job to run. Only a definite end (not an unreachable scheduler) fails. A port
        # report (accepted only from the job Slurm shows running) ends each wait at once.
        while not self.port:
            status = await self.query_job_status(by_look=True)
            if status == JobStatus.RUNNING:
                break
            if status == JobStatus.NOTFOUND:
                # No clear_state(): JupyterHub calls stop() next, which scancels whatever is left.
                raise await self._failure(self.job, "ended before it started")
            if status == JobStatus.PENDING and time.monotonic() - self.submitted_at > self.queue_limit():
                raise self._queued_too_long()  # JupyterHub's stop() then takes the job out of the queue
            await self._until_port_or(self.startup_poll_interval)
        metrics.SPAWN_PENDING.labels(self.profile.name if self.profile else "").observe(
            time.monotonic() - self.submitted_at)

        # Wait for the job's server to report its port; a job that dies meanwhile fails now.
        while self.port == 0:
            await self._until_port_or(self.startup_poll_interval)
            if self.port:
                break
            status = await self.query_job_status(by_look=True)
            if status == JobStatus.NOTFOUND and self.port == 0:
                raise await self._failure(self.job, "ended before JupyterLab started")

        # The route goes to the host Slurm named when it showed the reporting job running (accept_port): a job
        # requeued onto another node while JupyterLab started reports from there, and a check's older record
        # must not send her browser to the node it left.
        self.job = self.reported_job or self.job
        self.ip = self.state_gethost()
        self.log.info("Session job %s of %s serves on %s:%s", self.job_id, self.user.name, self.ip, self.port)
        self.restarts = self.job.restarts if self.job is not None else 0  # the run that serves (a requeue: more)
        return self.ip, self.port

    async def poll(self):
        """None while the job runs (or Slurm cannot be asked); else 1, remembering why it ended.

        Reads the shared look at the running sessions' job states (Slurm.running_job; while starting, the
        shared squeue snapshot), so polling every few seconds costs no Slurm call of its own: a job ended
        outside the portal (scancel, node failure, walltime) is seen at once.
        """
        if not self.job_id:
            return 1
        checking = self.hub_checking or self.pending == "check"  # the hub's check of it after the hub's restart
        status = await self.query_job_status(by_look=bool(self.server) and not self.starting and not checking)
        job = self.job
        if (job is not None and self.server and not self.starting and job.restarts > self.restarts
                and (job.pending or job.running)):
            return await self._requeued(job)
        if checking and self.server and self.starting and status in (JobStatus.PENDING, JobStatus.RUNNING,
                                                                     JobStatus.UNKNOWN):
            return self._keep_for_resume(status)  # one that ended says how, below
        if status in (JobStatus.RUNNING, JobStatus.PENDING) and checking and self.server:
            status = await self._confirm_after_hub_restart()
        if status in (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.UNKNOWN):
            return None
        job = await self._final(self.job)
        self.last_end = self.end_message(job) + await self._saved_at_the_end(job)
        self.log.info("Session job %s of %s ended outside the portal: %s", self.job_id, self.user.name, self.last_end)
        metrics.SESSIONS_ENDED.labels(job.partition if job else "", job.state if job else "GONE").inc()
        self.clear_state()
        return 1

    async def _final(self, job: Job | None) -> Job | None:
        """How the job ended: squeue's record, or accounting's where slurmctld forgot it already
        (MinJobAge) or still shows it COMPLETING (which hides whether it was cancelled, failed...).
        A job that ends at once can be COMPLETING before slurmdbd has its end: then accounting and
        squeue (which shows the end state once the job's epilog is done) are asked again, for up
        to FINAL_WAIT seconds, and the last word is taken."""
        if job is None:
            return await self.slurm.accounting(int(self.job_id), self.user.name)
        if not job.ending:
            return job
        deadline = time.monotonic() + FINAL_WAIT
        while True:
            recorded = await self.slurm.accounting(int(self.job_id), self.user.name)
            if recorded is not None and recorded.finished:
                return recorded
            listed = await self.slurm.job(int(self.job_id), fresh_after=time.monotonic())
            if listed is not None and listed.finished:
                return listed
            if time.monotonic() >= deadline:
                return listed or job
            await asyncio.sleep(0.3)

    async def _requeued(self, job: Job) -> int:
        """Slurm preempted the running session's job and put it back in the queue (its partition's PreemptMode
        REQUEUE): the server it ran is gone, and the job runs it again later, maybe on another node. As for a
        start cut short by a hub restart (:meth:`_keep_for_resume`), the session ends here with its job kept,
        not cancelled, and dsportal's service starts it again (portal.hub.resume): that start takes the job
        over and waits, in her page's progress, until Slurm runs it."""
        run = await self._last_run_log()
        saved = _saved_in(run)
        # Told a preemption by Slurm's signal (the session wrote so); a requeue without it: its node failed, or
        # someone requeued it (scontrol requeue).
        why = ("was preempted: Slurm stopped it for higher-priority work (partition "
               f"{job.partition} is preemptible)" if any(line.startswith(sessionvars.PREEMPTED) for line in run) else
               "was stopped by Slurm and put back in its queue (no preemption was announced: its node may have "
               "failed, or it was requeued)")
        self.kept = {"job_id": self.job_id, "slice": self.get_state().get("slice"), "token_id": self.token_id}
        self.last_end = (f"Your session job {self.job_id} {why}.{saved} It waits in Slurm's queue and keeps its "
                         "place: the portal starts your session again by itself when Slurm runs it again (starting "
                         "it yourself takes the same job over).")
        self.log.info("Session job %s of %s was preempted and requeued (restart %d): kept, to be resumed",
                      self.job_id, self.user.name, job.restarts)
        metrics.SESSIONS_ENDED.labels(job.partition, "REQUEUED").inc()
        self.clear_state()  # nothing to cancel: JupyterHub's stop of this session finds no job
        return 1

    def _keep_for_resume(self, status) -> int:
        """The hub's startup check of a session whose start an earlier hub process began and never saw
        through (its job still queued, or just started and asking the hub to take its port). JupyterHub
        cannot go on with a start after its restart: the start ends here (1, so JupyterHub records no
        server), the job is kept, not cancelled, and PartitionSpawner keeps its id through JupyterHub's
        stop. dsportal's service then starts the session again (portal.hub.resume) and that start takes
        the job over (:meth:`_take_over_queued_job`): she keeps her place in the queue."""
        self.kept = {"job_id": self.job_id, "slice": self.get_state().get("slice"), "token_id": self.token_id}
        # On her home page until the session is started again (by the service, or by her: either takes it over).
        self.last_end = (f"Your session job {self.job_id} was waiting in Slurm's queue when the portal restarted: it "
                         "keeps its place, and the portal starts your session again by itself. Starting it yourself "
                         "takes the same job over.")
        self.log.info("Session job %s of %s was starting (%s) when the hub restarted: kept, to be resumed",
                      self.job_id, self.user.name, getattr(status, "name", status))
        self.clear_state()  # nothing to cancel: JupyterHub's stop of this start finds no job
        return 1

    async def _take_over_queued_job(self) -> None:
        """This start goes on with the session job an earlier hub process submitted (PartitionSpawner's
        kept job) rather than submit another: that job waits in the queue with its place, its token and
        certificates from its submission. Only this session's job (this user's, its name, its profile),
        still queued or running, is taken over; otherwise she is told in words, and a job of someone
        else's, or of another of her sessions (a job id Slurm gave again after a reset), is left alone."""
        job_id = self.resume_job_id
        # Not wait_for: the shared squeue snapshot is awaited by others too, and is not waited out here.
        lookup = asyncio.ensure_future(self.slurm.job(int(job_id), fresh_after=time.monotonic()))
        if not (await asyncio.wait({lookup}, timeout=TAKE_OVER_WAIT))[0]:
            lookup.cancel()
            raise SpawnFailed(f"The cluster scheduler is not answering right now: your session job {job_id} keeps its "
                              "place in the queue, and the portal tries again in a minute.",
                              reason="scheduler-unavailable", status_code=503)
        job = lookup.result()
        self.resume_job_id = ""  # Slurm answered: taken over, or gone (a start Slurm could not answer tries again)
        ours = job is not None and job.user == self.user.name and job.name == self.job_name
        if not ours or not (job.pending or job.running) or job.profile != self.slice.profile.name:
            ended = f" ({job.state})" if ours and not (job.pending or job.running) else ""
            if ours and (job.pending or job.running):  # this session's, but for another profile: not waited for
                self.slurm.cancel_soon(self.user.name, job.job_id)
                ended = f" (it was for profile {job.profile}, and was cancelled)"
            self.last_end = (f"Your session job {job_id}, kept in Slurm's queue for your session, is no longer "
                             f"waiting or running{ended}: start your session again.")
            raise SpawnFailed(self.last_end, reason="resume-gone")
        self.job_id, self.job = str(job.job_id), job
        self.token_id = max(0, self.taken_over_token)
        self.submitted_wall = float(job.submit_time or time.time())
        # The queue limit counts from the job's submission, not from this start.
        self.submitted_at = time.monotonic() - max(0.0, time.time() - self.submitted_wall)
        self.starting = True
        self.log.info("Session job %s of %s, kept through a hub restart, taken over (%s)", self.job_id,
                      self.user.name, job.state)
        if self.on_submitted is not None:
            self.on_submitted()

    async def _confirm_after_hub_restart(self):
        """The hub's startup check of a session it had running: is its server still there?

        JupyterHub would wait http_timeout for the server and ignore Slurm meanwhile. Here Slurm is
        asked again each second, so a job that died while the hub was down (or that Slurm put back
        in the queue after losing its state: a rerun cannot serve, its port report is refused) is
        seen as ended as soon as Slurm sees it.
        """
        deadline = time.monotonic() + self.http_timeout
        status = JobStatus.RUNNING if self.state_isrunning() else JobStatus.PENDING
        while True:
            if status == JobStatus.RUNNING:
                try:
                    connecting = asyncio.open_connection(self.server.ip, self.server.port)
                    _, writer = await asyncio.wait_for(connecting, 1)
                    writer.close()
                    return JobStatus.RUNNING
                except (TimeoutError, OSError):
                    pass
            if time.monotonic() > deadline:
                return status  # JupyterHub then gives up on the server and stops the job
            await asyncio.sleep(1)
            status = await self.query_job_status(fresh_after=time.monotonic())
            if status not in (JobStatus.RUNNING, JobStatus.PENDING):
                return status

    def idle_limit(self) -> int | None:
        """Seconds this session may stay unused (its profile's idle limit for its GPU count)."""
        return self.slice.idle_limit if self.slice is not None else None

    async def reclaim(self, idle_seconds: float) -> None:
        """Stop a session nobody used for longer than its profile allows: its GPUs go back."""
        chosen = self.slice
        if chosen is None:  # no idle limit known: never reclaimed
            return
        limit = chosen.profile.idle_timeout if chosen.gpus or chosen.shares else chosen.profile.idle_timeout_without_gpu
        held = (f"its share of a GPU ({share_name(chosen.profile.gpu_shares)})" if chosen.shares else
                f"its {chosen.gpus} GPU(s)" if chosen.gpus else "its CPUs")
        self.last_end = (f"Your session job {self.job_id} was stopped after {human_duration(idle_seconds)} "
                         f"without use, to give {held} back to others (partition {chosen.profile.partition} "
                         f"stops sessions unused for {human_duration(parse_walltime(limit))}). Your files are "
                         "kept: start a new session whenever you need one.")
        self.log.info("Reclaiming idle session job %s of %s: unused for %d s (limit %s)", self.job_id,
                      self.user.name, idle_seconds, limit)
        metrics.SESSIONS_ENDED.labels(chosen.profile.partition, "IDLE").inc()
        metrics.IDLE_GPUS_RECLAIMED.labels(chosen.profile.partition).inc(
            chosen.gpus or chosen.shares / max(1, chosen.profile.gpu_shares))  # a share: its part of a GPU
        await self.cancel_batch_job()
        self.clear_state()

    async def _saved_at_the_end(self, job: Job | None) -> str:
        """What JupyterLab saved as the walltime ended or Slurm preempted the job, from the session's log
        (portal.session.usage.walltime); for a
        node that failed, what is kept (nothing could be saved as it went)."""
        if job is not None and job.state == "NODE_FAIL":
            return (" Its node failed, so nothing could be saved as it ended: your files are as you last saved them "
                    "(JupyterLab saves an open notebook every 2 minutes), and your home folder is on shared storage, "
                    "not on that node. Start it again to continue.")
        if job is None or job.state not in ("TIMEOUT", "PREEMPTED"):
            return ""
        return _saved_in(await self._last_run_log())

    async def _last_run_log(self) -> list[str]:
        """The session log's last lines of the job's last run: a requeued job appends to its log, each run
        beginning with the batch script's line 'dsportal: session job N for ...'."""
        tail = await self.slurm.read_as_user(self.user.name, self.session_log(), 60,
                                             not_before=self.submitted_wall or None)
        lines = tail.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith(f"dsportal: session job {self.job_id} for ")]
        return lines[starts[-1]:] if starts else lines

    def end_message(self, job: Job | None) -> str:
        when = datetime.now().strftime("%Y-%m-%d %H:%M")
        if job is None:
            return f"Your session job {self.job_id} is no longer known to Slurm (seen at {when})."
        message = f"Your session job {job.job_id} {ENDINGS.get(job.state, 'ended')} (Slurm: {job.state}"
        if job.reason not in ("None", ""):
            message += f", reason {job.reason}"
        if job.exit_code:
            message += f", exit code {job.exit_code}"
        return message + f"; seen at {when})."

    async def progress(self):
        """What the start is at, for the pending page's stream: told when it changes, and again every
        PROGRESS_REPEAT seconds with the time waited (not every second: each line is an event the hub
        sends and the page's event log keeps)."""
        started, told, told_at = time.monotonic(), None, 0.0
        while True:
            now = time.monotonic()
            text = self._progress_text()
            if text is not None and (text != told or now - told_at >= PROGRESS_REPEAT):
                yield {"message": f"{text} ({int(now - started)} s)"}
                told, told_at = text, now
            await asyncio.sleep(1)

    def _progress_text(self) -> str | None:
        """Where the start is (without the time waited), from the last squeue snapshot."""
        job = self.job
        if job is None:
            return "Submitting your session to Slurm..."
        if job.pending:
            place, queued = self.slurm.queue_place(job)
            reason = f", place {place} of {queued} in its queue" if place else ""
            reason += "" if job.reason in ("None", "") else f": waiting for {job.reason}"
            estimate = ""
            if job.start_time > time.time():
                start = datetime.fromtimestamp(job.start_time)
                minutes = max(1, int((job.start_time - time.time()) // 60))
                estimate = f"; Slurm estimates it starts at {start:%H:%M} (in about {minutes} min)"
            queued_as = "was preempted for higher-priority work and waits to run again" if job.restarts else "queued"
            return f"Job {job.job_id} {queued_as} on partition {job.partition}{reason}{estimate}"
        if job.running:
            return f"Job {job.job_id} running on {job.batch_host}; starting JupyterLab"
        return None
