"""The spawners' whole life, from the form to the stop, against a Slurm in memory (tests/fakeslurm.py): no cluster.

The real PartitionSpawner and SlurmGPUSpawner, built as JupyterHub builds them (jupyterhub/user.py: an ORM
spawner in an in-memory database, the user, the hub) and driven as it drives them (:class:`Hub`: the form's
or the REST API's options, start within start_timeout, stop after a failed start, the check of every
session at the hub's start). Their Slurm is tests/fakeslurm.py's, handed over through the Slurm layer's seam
(slurmclient.share_client): the hub's shared client, its squeue snapshot and cache included, over a cluster
the tests play. The same life on the real cluster: tests/test_spawn.py, test_failfast.py, test_long_queue.py,
test_named_sessions.py, test_reliability.py.

The user is the account running the tests (the spawners read her home and groups from the system).
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import time
from datetime import UTC, datetime, timedelta

import pytest
from jupyterhub import orm
from jupyterhub.objects import Server
from traitlets.config import Config

from fakeslurm import FakeSlurm, client_key, sbatch_options
from portal.core import sessionspec, sessionvars
from portal.core.settings import Profile
from portal.slurm import slurmclient
from portal.slurm.slurmclient import SlurmError, SlurmUnavailable, share_client
from spawner import gpuspawner
from spawner.gpuspawner import RequestRefused, SpawnFailed, extend_walltime
from spawner.partitionspawner import PartitionSpawner

pytestmark = [
    pytest.mark.quick,
    # PartitionSpawner.construct_child hands the child server=, as wrapspawner's does: no trait of the child, so
    # traitlets drops it with this warning (the child reads its server through the linked orm_spawner).
    pytest.mark.filterwarnings(r"ignore:Passing unrecognized arguments to super\(SlurmGPUSpawner\):DeprecationWarning"),
]

try:
    _account = pwd.getpwuid(os.getuid())
except KeyError:  # a uid without an account (some containers): the spawners read the user's home and groups
    pytest.skip("the tests' user has no account", allow_module_level=True)
ME = _account.pw_name
MY_GROUP = grp.getgrgid(_account.pw_gid).gr_name
NOBODYS_GROUP = "dsportal-test-no-member"

PROFILES = [
    Profile(name="gpu", partition="gpu", display_name="GPU partition", gpu_choices=[0, 1, 2, 4], default_gpus=1,
            queue_limit="00:30:00", idle_timeout="02:00:00", max_walltime="12:00:00"),
    Profile(name="cpu", partition="cpu", display_name="CPU partition", gpu_choices=[0], default_gpus=0,
            default_walltime="02:00:00", max_walltime="04:00:00", sessions_per_user=2),
    Profile(name="share", partition="gpu", display_name="A quarter of a GPU", gpu_choices=[0], default_gpus=0,
            gpu_shares=4, default_share=True, groups=[MY_GROUP]),
    Profile(name="staff", partition="gpu", display_name="GPU partition, staff", groups=[NOBODYS_GROUP]),
    Profile(name="scavenger", partition="scavenger", display_name="GPU partition, scavenger", gpu_choices=[1],
            default_gpus=1, preemption="requeue"),
]
GPU_FORM = {"profile": ["gpu"], "gpus.gpu": ["2"], "walltime.gpu": ["04:00:00"]}
START_TIMEOUT = 60  # the hub's start_timeout: the time to come up once Slurm runs the job
PORT = 8888


def hub_config(conf: str) -> Config:
    """What portal/hub/config.py sets of the spawners, for these profiles; squeue read every 20 ms."""
    c = Config()
    c.PartitionSpawner.profiles = list(PROFILES)
    c.PartitionSpawner.default_profile = "gpu"
    c.Spawner.start_timeout = START_TIMEOUT
    c.Spawner.http_timeout = 5
    c.Spawner.default_url = "/lab"
    c.SlurmGPUSpawner.slurm_conf = conf  # the shared client's key: this test's own
    c.SlurmGPUSpawner.squeue_interval = 0.02
    return c


class User:
    """What the spawners read of JupyterHub's User: her name, URL, settings and spawners."""

    def __init__(self, db, name: str):
        self.name = self.escaped_name = name
        self.url = self.base_url = f"/user/{name}/"
        self.settings: dict = {}
        self.domain = ""
        self.orm_user = orm.User.find(db, name)
        if self.orm_user is None:
            self.orm_user = orm.User(name=name)
            db.add(self.orm_user)
            db.commit()
        self.spawners: dict[str, PartitionSpawner] = {}

    def all_spawners(self, include_default: bool = True):
        return [s for name, s in self.spawners.items() if name or include_default]


class HubObject:
    """JupyterHub's Hub (jupyterhub.objects.Hub): where a session reaches the hub."""

    public_host = ""
    base_url = "/hub/"
    url = "http://127.0.0.1:8081/hub/"
    api_url = "http://127.0.0.1:8081/hub/api"


class Hub:
    """JupyterHub around the spawners, in miniature: what jupyterhub/user.py's spawn and stop, its spawn
    handlers and app.py's check of every session at the hub's start do to them, in that order."""

    def __init__(self, slurm: FakeSlurm, conf: str, db=None):
        self.slurm, self.conf = slurm, conf
        self.db = db or orm.new_session_factory("sqlite:///:memory:")()
        if self.db.query(orm.OAuthClient).filter_by(identifier="jupyterhub").one_or_none() is None:
            self.db.add(orm.OAuthClient(identifier="jupyterhub"))  # the hub's own: every token names a client
            self.db.commit()
        self.config = hub_config(conf)
        self.users: dict[str, User] = {}

    def spawner(self, name: str = "", user: str = ME) -> PartitionSpawner:
        """The user's spawner of session ``name`` (User._new_spawner: its stored state loaded)."""
        if user not in self.users:
            self.users[user] = User(self.db, user)
        owner = self.users[user]
        if name in owner.spawners:
            return owner.spawners[name]
        orm_spawner = owner.orm_user.orm_spawners.get(name)
        if orm_spawner is None:
            orm_spawner = orm.Spawner(user=owner.orm_user, name=name)
            self.db.add(orm_spawner)
            self.db.commit()
        spawner = PartitionSpawner(user=owner, hub=HubObject(), orm_spawner=orm_spawner, config=self.config,
                                   oauth_client_id=f"jupyterhub-user-{user}" + (f"-{name}" if name else ""),
                                   user_options=orm_spawner.user_options or {})
        spawner.load_state(orm_spawner.state or {})
        owner.spawners[name] = spawner
        assert spawner.child_spawner is None or spawner.child_spawner.slurm is self.slurm
        return spawner

    async def spawn(self, spawner: PartitionSpawner, form: dict | None = None, options: dict | None = None):
        """A start from the form (its fields, judged by options_from_form) or the REST API (its options,
        judged first: portal/hub/useroptions.py); then User.spawn. Returns start()'s (host, port)."""
        spawner._spawn_pending = True  # the spawn handler's
        try:
            if form is not None:
                options = await spawner.options_from_form(form)
            elif options is not None:
                self.spawner("", spawner.user.name).judged(options)
            orm_server = orm.Server(base_url=f"{spawner.user.base_url}{spawner.name}/".replace("//", "/"))
            self.db.add(orm_server)
            self.db.commit()
            spawner.server = server = Server(orm_server=orm_server)
            if options is None:
                options = spawner.orm_spawner.user_options or {}
            else:
                spawner.orm_spawner.user_options = options
                self.db.commit()
            spawner.user_options = options
            spawner.clear_state()
            api_token = spawner.api_token = orm.APIToken.new(user=spawner.user.orm_user, note=f"Server at {orm_server.base_url}",
                                                               scopes=["inherit"])
            spawner._start_pending = True
            try:
                host, port = await asyncio.wait_for(spawner.start(), timeout=spawner.start_timeout)
            except Exception:
                spawner._start_pending = False
                await self.stop(spawner)
                raise
            server.ip, server.port = host, port
            if spawner.api_token != api_token:  # the spawner took a token of its own back: the new one is dropped
                self.db.delete(orm.APIToken.find(self.db, api_token))
                assert orm.APIToken.find(self.db, spawner.api_token).user.name == spawner.user.name
            self.db.commit()
            spawner.start_polling()
            spawner._start_pending = False
            spawner.orm_spawner.state = spawner.get_state()
            self.db.commit()
            return host, port
        finally:
            spawner._spawn_pending = False

    def spawn_soon(self, spawner, form: dict | None = None, options: dict | None = None) -> asyncio.Task:
        return asyncio.ensure_future(self.spawn(spawner, form=form, options=options))

    async def stop(self, spawner: PartitionSpawner) -> None:
        """User.stop: poll, stop() if it runs, the state cleared and stored, the server gone."""
        spawner._stop_pending = True
        try:
            if await spawner.poll() is None:
                await spawner.stop()
            if not spawner.will_resume and spawner.api_token:  # the session's token goes with it, unless kept
                if (token := orm.APIToken.find(self.db, spawner.api_token)) is not None:
                    self.db.delete(token)
        finally:
            spawner.orm_spawner.server = None
            spawner.clear_state()
            spawner.orm_spawner.state = spawner.get_state()
            self.db.commit()
            spawner._stop_pending = False

    async def check(self, spawner: PartitionSpawner):
        """The hub's check of a session it had at its start (app.py's check_spawner): poll, pending 'check'."""
        spawner._check_pending = True
        try:
            return await spawner.poll()
        finally:
            spawner._check_pending = False

    def restart(self) -> Hub:
        """A new hub process on the same database and cluster: its own Slurm client (no snapshot yet),
        its spawners made anew from their stored state."""
        client = self.slurm.new_hub_process()
        share_client(client, *client_key(self.config))  # the fixture's slurm.installed takes it away after the test
        return Hub(client, self.conf, db=self.db)


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def hub(slurm, tmp_path):
    conf = str(tmp_path / "slurm.conf")  # never read: this test's own key of the shared client
    portal = Hub(slurm, conf)
    with slurm.installed(portal.config):
        yield portal


def run(scenario):
    """A test's scenario on an event loop of its own, as the hub's; a hang fails it in 10 s."""
    return asyncio.run(asyncio.wait_for(scenario, 10))


async def until(predicate, seconds: float = 2.0):
    """predicate()'s first true value, asked every 5 ms."""
    deadline = time.monotonic() + seconds
    while not (value := predicate()):
        assert time.monotonic() < deadline, "still not the case after 2 s"
        await asyncio.sleep(0.005)
    return value


async def submitted(slurm: FakeSlurm, count: int = 1) -> int:
    """The id of the ``count``th job submitted, once it is."""
    jobs = await until(lambda: len(slurm.submitted()) >= count and slurm.submitted())
    return jobs[count - 1].job_id


async def serve(hub: Hub, spawner: PartitionSpawner, starting: asyncio.Task, job: int, node: str = "node1",
                port: int = PORT) -> None:
    """The submitted ``job`` of a start under way run on ``node``, its port reported, the start over."""
    hub.slurm.start(job, node)
    assert await spawner.child_spawner.accept_port(port, str(job)) is None
    assert await starting == (node, port)


async def running_session(hub: Hub, name: str = "", form: dict = GPU_FORM, node: str = "node1",
                          port: int = PORT) -> tuple[PartitionSpawner, int]:
    """A session started from the form, its job run on ``node``, its port reported: (spawner, job id)."""
    spawner = hub.spawner(name)
    starting = hub.spawn_soon(spawner, form=form)
    job = await submitted(hub.slurm, len(hub.slurm.submitted()) + 1)
    await serve(hub, spawner, starting, job, node, port)
    return spawner, job


# ---------------------------------------------------------------------------------------- the request
def test_the_form_shows_the_users_profiles_with_the_free_gpus_slurm_reports(hub, slurm):
    async def scenario():
        slurm.go_down()
        form = await hub.spawner()._options_form()  # the form still comes, without live resources
        assert form.count("Live resources are unavailable right now (the scheduler did not answer).") == 4
        slurm.come_back()
        await running_session(hub)  # 2 of node1's 4 GPUs
        form = await hub.spawner("prep")._options_form()
        assert "GPU partition" in form and "A quarter of a GPU" in form and "CPU partition" in form
        assert "GPU partition, staff" not in form  # reserved for a group she is not in
        assert "<b>6 of 8 GPUs</b> (4 on one node)" in form, form
        # Which profiles Slurm may preempt, and what then happens: the scavenger's alone.
        assert form.count("dsportal-preemptible") == 1
        assert ("<b>Preemptible:</b> Slurm may stop a session\n        here for higher-priority work. JupyterLab then "
                "warns you and saves your open notebooks first, and the portal starts the session again by itself "
                "when Slurm runs it\n        again.") in form, form

    run(scenario())


def test_a_form_asking_for_what_the_profile_does_not_offer_is_refused_and_nothing_is_submitted(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        for form, words in (
                ({"profile": ["gpu"], "gpus.gpu": ["3"]}, "3 GPUs is not offered on GPU partition: choose one of 0, 1, 2, 4"),
                ({"profile": ["gpu"], "walltime.gpu": ["13:00:00"]}, "walltime 13:00:00 is longer than the 12:00:00"),
                ({"profile": ["staff"]}, f"GPU partition, staff is reserved for members of {NOBODYS_GROUP}"),
                ({"profile": ["nope"]}, "unknown partition profile 'nope': choose one of gpu, cpu, share, scavenger")):
            with pytest.raises(RequestRefused) as refused:
                await hub.spawn(spawner, form=form)
            assert refused.value.status_code == 400 and words in refused.value.jupyterhub_message, refused.value
            assert refused.value.jupyterhub_message.startswith("Your session request was refused: ")
        assert slurm.submissions == [] and "sbatch" not in slurm.commands
        assert not spawner.active and spawner.child_spawner.job_id == ""

    run(scenario())


def test_the_rest_apis_options_are_judged_by_the_same_rules_and_none_refused_is_kept(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        for options, words in (({"profile": "gpu", "gpus": "2; id"}, "GPU count"),
                               ({"profile": "gpu", "cores": 64}, "unknown option(s) 'cores'"),
                               ({"profile": "gpu", "mail": True}, "there is no e-mail address for your account")):
            with pytest.raises(RequestRefused, match=".") as refused:
                await hub.spawn(spawner, options=options)
            assert words in refused.value.jupyterhub_message, refused.value.jupyterhub_message
        assert spawner.orm_spawner.user_options in (None, {})  # nothing the rules refused is kept
        assert slurm.submissions == []

    run(scenario())


def test_options_judged_only_at_the_start_are_refused_there_and_not_kept_for_the_next(hub, slurm):
    """Options JupyterHub stored before (a start without options reuses them) are judged again at the
    start: a profile withdrawn since is refused, nothing made, and the stored options are forgotten."""
    async def scenario():
        spawner = hub.spawner()
        spawner.orm_spawner.user_options = {"profile": "gpu", "gpus": 8}
        hub.db.commit()
        with pytest.raises(RequestRefused, match="8 GPUs is not offered"):
            await hub.spawn(spawner)
        assert spawner.orm_spawner.user_options == {} and slurm.submissions == []

    run(scenario())


def test_a_request_is_judged_once_where_it_enters_and_its_start_submits_that_judgement(hub, slurm, monkeypatch):
    """The form's request is judged by options_from_form, the REST API's before JupyterHub stores it; the
    certificates' check and the start take that judgement as it is (portal.core.rules.judge_request, once each)."""
    from portal.core import rules
    from spawner import partitionspawner

    judged = []

    def counted(options, *against):
        judged.append(dict(options))
        return rules.judge_request(options, *against)

    monkeypatch.setattr(partitionspawner, "judge_request", counted)

    async def scenario():
        for form, options in ((GPU_FORM, None), (None, {"profile": "cpu", "walltime": "01:00:00"})):
            judged.clear()
            spawner = hub.spawner("one" if form else "two")
            starting = hub.spawn_soon(spawner, form=form, options=options)
            job = await submitted(slurm, len(slurm.submitted()) + 1)
            assert len(judged) == 1, judged  # the entry's judgement only: the start took it
            request = spawner.child_spawner.request
            assert request is not None and request.slice is spawner.child_spawner.slice
            assert slurm.submissions[-1].sbatch.get("--gres") == (f"gpu:{request.slice.gpus}" if request.slice.gpus
                                                                 else None)
            await serve(hub, spawner, starting, job)
            await hub.stop(spawner)

    run(scenario())


def test_her_address_is_looked_up_once_a_start_and_reaches_the_jobs_mail_line(hub, slurm, monkeypatch):
    """A start asking for Slurm's mail looks her address up once: at the form (which says so if there is none),
    or, for the REST API's request, at the start; the job's script has it."""
    looked_up = []

    async def address(self):
        looked_up.append(self.name)
        return "me@example.org"

    monkeypatch.setattr(PartitionSpawner, "mail_address", address)

    async def scenario():
        for name, form, options in (("one", {**GPU_FORM, "mail": ["on"]}, None),
                                    ("two", None, {"profile": "cpu", "mail": True})):
            looked_up.clear()
            spawner = hub.spawner(name)
            starting = hub.spawn_soon(spawner, form=form, options=options)
            job = await submitted(slurm, len(slurm.submitted()) + 1)
            assert looked_up == [name], looked_up
            assert slurm.submissions[-1].sbatch.get("--mail-user") == "me@example.org"
            await serve(hub, spawner, starting, job)
            await hub.stop(spawner)

    run(scenario())


def test_the_forms_checkbox_becomes_the_mail_option(hub, monkeypatch):
    """The e-mail checkbox ticked ("on") is the option mail: true, left unticked no option; anything else goes on
    as sent, for the rules to refuse in words (test_session_mail.py: the rules of the option)."""
    async def address(self):
        return "me@example.org"

    monkeypatch.setattr(PartitionSpawner, "mail_address", address)
    base = {"profile": ["cpu"], "gpus.cpu": ["0"], "walltime.cpu": ["01:00:00"]}

    async def scenario():
        spawner = hub.spawner()
        assert (await spawner.options_from_form({**base, "mail": ["on"]}))["mail"] is True
        assert "mail" not in await spawner.options_from_form(base)
        with pytest.raises(RequestRefused, match="mail must be true or false"):
            await spawner.options_from_form({**base, "mail": ["eve@evil.test"]})

    run(scenario())


def test_a_judgement_is_taken_again_only_for_the_same_options_rules_and_groups(hub, slurm, monkeypatch):
    """A judgement is reused only while what it was made from is the same: other options, or her groups changed
    (she left a group a profile is reserved for), are judged anew."""
    from spawner import partitionspawner

    spawner = hub.spawner()
    first = spawner.judged({"profile": "share"})
    assert spawner.judged({"profile": "share"}) is first
    assert spawner.judged({"profile": "share", "walltime": "01:00:00"}) is not first
    monkeypatch.setattr(partitionspawner, "unix_groups", lambda name: set())  # she left MY_GROUP
    with pytest.raises(RequestRefused, match=f"reserved for members of {MY_GROUP}"):
        spawner.judged({"profile": "share"})


def test_the_rules_judge_a_request_in_one_place():
    """portal.core.rules.judge_request is called from PartitionSpawner.judged alone: the bar of one call site of the
    judge (which reads the options itself, with no helper of its own: the GPU count's path stays short)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    calls: dict[str, list[str]] = {"judge_request": []}
    for folder in ("portal", "spawner"):
        for path in (root / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for function in ast.walk(tree):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.Call):
                        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                        if name in calls:
                            calls[name].append(f"{path.relative_to(root)}:{function.name}")
    assert calls == {"judge_request": ["spawner/partitionspawner.py:judged"]}, calls


def test_the_gpu_count_goes_from_the_form_to_gres_through_at_most_seven_functions(hub, slurm):
    """The GPU count's path, measured (issue 68's bar: at most 7 functions, never back to a module it has left).

    A form asking for 4 GPUs is submitted and started as JupyterHub does; a profile hook (sys.setprofile) sees
    every call into the project's own code (a function defined under portal/ or spawner/: not jinja, pydantic,
    traitlets, JupyterHub, batchspawner, nor this test's FakeSlurm) from the form's submission until FakeSlurm's
    sbatch receives the batch script holding ``#SBATCH --gres=gpu:4``, where the path ends.

    - What carries the count: the form's fields (``{"gpus.gpu": ["4"]}``), a dict whose ``gpus`` carries it (the
      options; the template's context), a SessionSlice or SessionRequest of 4 GPUs, the batch script's text with
      its --gres line, and the count as the form sent it, "4". A bare number 4 cannot be told from any other 4
      (an hour of a walltime): it carries the count only as the value a call holding "4" returns (its reading).
    - The count is in a call when one of the call's own variables is a carrier (its arguments as it is called;
      its locals each time it returns or awaits, and as sbatch is called for the calls then running), or when
      the call returns one. What lies on an object is not looked into: the start hands the judged request to its
      child as an attribute, and the count is in the methods that hold it in a variable (PartitionSpawner.start,
      submit_batch_script), not in SlurmGPUSpawner.start between them, which never holds it.
    - The count goes on from a call when the call returns a carrier, or when the script reaches sbatch from it
      or from a call below it. A call that returns the count to the one that made it takes it no further: that
      one must hand it on itself.
    - A call is on the path when the count is in it and goes on from it. A function that only looks at the
      count (check_length, wants_mail, the memo's key, share_of's "is it a share?") or reads it for something
      else (the session's idle limit, admit's session limit) is not: the count does not travel through it.
      Property getters and validators are not set apart: one is on the path if it returns a carrier (none does;
      the dataclasses' generated __init__ is no file of the project's).
    - A function is counted once, however often it is called (a coroutine's every resumption; judged, at the
      form and again at the start).
    - The path has two legs, JupyterHub's two calls into the spawner: the form's submission (its fields judged)
      and the start (that judgement submitted). They meet in what the hub keeps between them (the options, the
      judgement's memo), and both begin in PartitionSpawner, which JupyterHub calls. Within each leg, the
      modules of the path's functions, in the order the count first reaches them, never come back to one it
      has left.
    """
    import sys
    from pathlib import Path

    from portal.core.rules import SessionRequest, SessionSlice

    count = 4
    gres = f"\n#SBATCH --gres=gpu:{count}\n"
    root = Path(__file__).resolve().parent.parent
    own = tuple(f"{root / folder}{os.sep}" for folder in ("portal", "spawner"))
    sbatch = FakeSlurm.submit.__code__

    def carries(value) -> bool:
        if isinstance(value, (SessionRequest, SessionSlice)):
            chosen = value.slice if isinstance(value, SessionRequest) else value
            return chosen.gpus == count and not chosen.shares
        if isinstance(value, dict):
            return any(carries(dict.get(value, key)) if key == "gpus" else
                       isinstance(key, str) and key.startswith("gpus.") and carries((dict.get(value, key) or [0])[0])
                       for key in list(value))
        return isinstance(value, str) and (value.strip() == str(count) or gres in value)

    calls: dict = {}  # frame -> its record, in the order the calls began

    def holds(frame) -> bool:
        return any(carries(value) for value in list(frame.f_locals.values()))

    def caller(frame):
        frame = frame.f_back
        while frame is not None and frame not in calls:
            frame = frame.f_back
        return frame

    def hook(frame, event, arg):
        code = frame.f_code
        if event == "call" and code is sbatch and gres in frame.f_locals.get("script", ""):
            sys.setprofile(None)  # the script is Slurm's: the path ends
            running = caller(frame)
            calls[running]["sbatch"] = True
            while running is not None:
                calls[running]["in"] |= holds(running)
                running = caller(running)
        elif event == "call" and frame not in calls and code.co_filename.startswith(own):
            calls[frame] = {"function": f"{Path(code.co_filename).relative_to(root)}:{code.co_qualname}",
                            "caller": caller(frame), "in": holds(frame), "returns": False, "sbatch": False}
        elif event == "return" and frame in calls:
            record = calls[frame]
            record["in"] |= holds(frame) or carries(arg)
            record["returns"] |= carries(arg) or (record["in"] and type(arg) is int and arg == count)

    def onward(frame) -> bool:
        """Whether the script reaches sbatch from this call or from one below it."""
        return calls[frame]["sbatch"] or any(onward(below) for below, record in calls.items() if record["caller"] is frame)

    async def scenario():
        spawner = hub.spawner()
        sys.setprofile(hook)
        try:
            starting = hub.spawn_soon(spawner, form={"profile": ["gpu"], "gpus.gpu": [str(count)],
                                                     "walltime.gpu": ["01:30:00"]})
            job = await submitted(slurm)
        finally:
            sys.setprofile(None)
        await serve(hub, spawner, starting, job)
        await hub.stop(spawner)

    run(scenario())
    assert slurm.submissions[-1].sbatch.get("--gres") == f"gpu:{count}"
    path: dict[str, list[str]] = {}  # leg (the function JupyterHub called) -> its functions, first reached first
    for frame, record in calls.items():
        if record["in"] and (record["returns"] or onward(frame)):
            leg = frame
            while calls[leg]["caller"] is not None:
                leg = calls[leg]["caller"]
            functions = path.setdefault(calls[leg]["function"], [])
            if record["function"] not in functions:
                functions.append(record["function"])
    shown = "\n".join(f"{leg}:\n  " + "\n  ".join(functions) for leg, functions in path.items())
    distinct = {function for functions in path.values() for function in functions}
    assert len(path) == 2 and len(distinct) <= 7, f"{len(distinct)} functions:\n{shown}"
    for functions in path.values():
        modules = [function.split(":")[0] for function in functions]
        visited = [module for i, module in enumerate(modules) if i == 0 or module != modules[i - 1]]
        assert len(visited) == len(set(visited)), f"the count comes back to a module it has left:\n{shown}"


def test_a_link_cannot_start_a_session(hub, slurm):
    with pytest.raises(RequestRefused, match="A link cannot start a session"):
        hub.spawner().options_from_query({"profile": ["gpu"]})
    assert slurm.submissions == []


# ------------------------------------------------------------------------------------------ the start
def test_a_start_submits_exactly_one_job_as_the_user_with_the_slice_she_asked_for(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        [submission] = slurm.submissions
        assert (submission.user, submission.job_id) == (ME, job)
        home = pwd.getpwnam(ME).pw_dir
        assert submission.log_dir == f"{home}/.dsportal/logs"
        assert submission.sbatch == {
            "--job-name": f"dsportal-{ME}", "--partition": "gpu", "--nodes": "1", "--ntasks": "1",
            "--cpus-per-task": "16", "--mem": "98304M", "--time": "04:00:00", "--gres": "gpu:2",
            "--output": f"{home}/.dsportal/logs/session-%j.log", "--chdir": home, "--export": "ALL",
            "--comment": "dsportal-profile=gpu", "--no-requeue": "", "--signal": "B:USR1@120"}
        # The job's environment: the session's token, its umask for the log; never the hub's secrets.
        assert submission.env["JUPYTERHUB_API_TOKEN"] == spawner.api_token
        assert submission.env["SLURM_UMASK"] == "077" and "JUPYTERHUB_CRYPT_KEY" not in submission.env
        # What the session is told: one spec, validated as the session reads it (portal.core.sessionspec).
        assert [k for k in submission.env if k.startswith("DSPORTAL_")] == [sessionvars.SESSION]
        spec = sessionspec.parse(submission.env[sessionvars.SESSION])
        # report_wait: the profile's queue limit and the hub's start_timeout
        assert (spec.idle_limit, spec.report_wait, spec.sharing_groups) == (7200, 30 * 60 + START_TIMEOUT, [])
        assert spec.launch_policy.default_profile == "gpu" and spec.templates is None
        assert [p.name for p in spec.launch_policy.profiles] == ["gpu", "cpu", "share", "scavenger"]  # not staff's
        assert slurm.commands.count("sbatch") == 1
        assert spawner.child_spawner.job_id == str(job) and spawner.server.port == PORT

    run(scenario())


def test_a_pending_starts_progress_is_told_when_it_changes_not_every_second(hub, slurm, monkeypatch):
    """The pending page's stream: a line when the start's state changes, and the same state again only every
    PROGRESS_REPEAT seconds (each line is an event the hub sends and the page's event log keeps)."""
    monkeypatch.setattr(gpuspawner, "PROGRESS_REPEAT", 3.0)

    async def scenario():
        spawner = hub.spawner()
        spawner.clear_state()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        slurm.hold(job, "Resources")
        await until(lambda: spawner.child_spawner.job and spawner.child_spawner.job.reason == "Resources")
        told = []

        async def follow():
            async for event in spawner.child_spawner.progress():
                told.append((time.monotonic(), event["message"]))

        following = asyncio.ensure_future(follow())
        await until(lambda: told)
        await asyncio.sleep(2.2)  # unchanged, for less than PROGRESS_REPEAT: told once
        assert len(told) == 1 and "queued on partition gpu" in told[0][1], told
        slurm.start(job, "node2")
        await until(lambda: len(told) == 2, seconds=3)  # changed: told within a second
        assert told[1][1].startswith(f"Job {job} running on node2; starting JupyterLab ("), told
        await until(lambda: len(told) == 3, seconds=8)  # unchanged: told again after PROGRESS_REPEAT, not before
        assert told[2][0] - told[1][0] >= 3.0 - 0.05 and told[2][1].startswith(f"Job {job} running on node2"), told
        following.cancel()
        await spawner.child_spawner.accept_port(PORT, str(job))
        assert await starting == ("node2", PORT)

    run(scenario())


def test_a_share_of_a_gpu_and_a_cpu_session_ask_slurm_for_just_that(hub, slurm):
    async def scenario():
        await running_session(hub, "quarter", form={"profile": ["share"]})
        await running_session(hub, "prep", form={"profile": ["cpu"]}, node="node3", port=PORT + 1)
        quarter, prep = (s.sbatch for s in slurm.submissions)
        assert (quarter["--gres"], quarter["--cpus-per-task"], quarter["--mem"]) == ("shard:1", "2", "12288M")
        assert "--gres" not in prep and (prep["--cpus-per-task"], prep["--mem"], prep["--partition"]) == (
            "4", "16384M", "cpu")
        # Each named session is a job of its own, named for it.
        assert (quarter["--job-name"], prep["--comment"]) == (f"dsportal-{ME}:quarter",
                                                              "dsportal-profile=cpu,dsportal-session=prep")

    run(scenario())


def test_a_pending_session_shows_its_place_in_the_queue_and_slurms_reason(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        spawner.clear_state()  # as JupyterHub does before a start: its child is made once the request is judged
        assert (await anext(spawner.progress()))["message"] == "Checking your request..."
        ahead = slurm.queue_other("bob", "gpu", priority=5000)
        slurm.queue_other("carol", "gpu", priority=10)  # behind hers
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        slurm.hold(job, "Resources")
        await until(lambda: spawner.child_spawner.job and spawner.child_spawner.job.reason == "Resources")
        message = (await anext(spawner.progress()))["message"]
        assert message.startswith(f"Job {job} queued on partition gpu, place 2 of 3 in its queue: waiting for "
                                  "Resources ("), message
        slurm.end(ahead.job_id, "COMPLETED")
        slurm.start(job, "node2")
        await until(lambda: spawner.child_spawner.state_isrunning())
        message = (await anext(spawner.child_spawner.progress()))["message"]
        assert message.startswith(f"Job {job} running on node2; starting JupyterLab ("), message
        assert not starting.done()  # until the port is reported
        await spawner.child_spawner.accept_port(PORT, str(job))
        assert await starting == ("node2", PORT)

    run(scenario())


# ---------------------------------------------------------------------------------- the port report
def test_the_port_report_is_taken_once_from_the_job_being_started_while_slurm_shows_it_running(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        child = spawner.child_spawner
        assert await child.accept_port(PORT, str(job)) == f"Slurm does not show session job {job} running"
        slurm.start(job, "node1")
        assert await child.accept_port(PORT, str(job + 1)) == (
            f"the report names job {job + 1}, but the session being started is job {job}")
        assert await child.accept_port(PORT, str(job)) is None
        assert await starting == ("node1", PORT)
        assert await child.accept_port(PORT, str(job)) is None  # the same report again (its answer was lost)
        moved = await child.accept_port(PORT + 1, str(job))  # any process of hers holds the token
        assert moved == (f"session job {job} of {ME} is not starting (its port {PORT} is already registered): "
                         "port reports are accepted once"), moved
        assert spawner.server.port == PORT

    run(scenario())


def test_a_report_that_comes_before_sbatch_returns_waits_for_it(hub, slurm):
    async def scenario():
        slurm.latency["sbatch"] = 0.2  # a class submitting at once: the job runs before sbatch answers
        slurm.start_on = "node2"
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await until(lambda: next(iter(slurm.records), None))
        assert spawner.child_spawner.job_id == ""  # the hub does not know the id yet
        assert await spawner.child_spawner.accept_port(PORT, str(job)) is None
        assert await starting == ("node2", PORT)

    run(scenario())


# ----------------------------------------------------------------------------------------- the poll
def test_poll_keeps_a_running_session_and_one_squeue_serves_every_session(hub, slurm):
    async def scenario():
        sessions = [await running_session(hub, name, form={"profile": ["cpu"]}, node="node3", port=PORT + i)
                    for i, name in enumerate(("a", "b"))]
        for _ in range(3):
            await slurm.later()
            before = len(slurm.commands)
            assert await asyncio.gather(*(s.poll() for s, _ in sessions)) == [None, None]
            assert len(slurm.commands) - before == 1, slurm.commands[before:]

    run(scenario())


def test_sessions_running_untouched_are_checked_by_their_states_alone_and_a_change_by_asking_for_it(hub, slurm):
    """A department's thousands of jobs are not listed every second for a class at rest: the checks look at the
    running sessions' job states alone (squeue --only-job-state), ask for a job alone when its state changed, and
    list every job only when the newest record is FULL_AT_REST seconds old."""
    async def scenario():
        sessions = [await running_session(hub, name, form={"profile": ["cpu"]}, node="node3", port=PORT + i)
                    for i, name in enumerate(("a", "b"))]
        jobs = [job for _, job in sessions]
        await slurm.later()
        before = len(slurm.commands)
        for _ in range(3):
            assert await asyncio.gather(*(s.poll() for s, _ in sessions)) == [None, None]
            await slurm.later()
        assert slurm.commands[before:] == ["squeue states"] * 3
        slurm.end(jobs[0], "CANCELLED")  # scancel from her shell
        await slurm.later()
        before = len(slurm.commands)
        assert await asyncio.gather(*(s.poll() for s, _ in sessions)) == [1, None]
        assert slurm.commands[before:before + 2] == ["squeue states", "squeue job"], slurm.commands[before:]
        assert sessions[0][0].child_spawner.last_end.startswith(f"Your session job {jobs[0]} was cancelled")
        slurm.records_age(slurmclient.FULL_AT_REST)  # half a minute untouched
        sessions[1][0].child_spawner.submitted_at -= slurmclient.FULL_AT_REST
        before = len(slurm.commands)
        assert await sessions[1][0].poll() is None
        assert slurm.commands[before:] == ["squeue"]

    run(scenario())


def test_a_start_waits_for_jupyterlab_by_looks_at_its_jobs_state_and_its_report_asks_for_the_job_alone(hub, slurm):
    """While a class starts beside a department's queue, its starts do not list every job each second: a new job
    is asked for alone (squeue --jobs=ID), and while JupyterLab starts in it, its state is looked at with the
    others'; the port report is judged by Slurm's word on that job alone, asked after the report arrived."""
    async def scenario():
        other, _ = await running_session(hub, "prep", form={"profile": ["cpu"]}, node="node3")  # already looked at
        await asyncio.sleep(0.1)
        assert await other.poll() is None
        slurm.start_on = "node1"  # the queue is empty: it runs as it is submitted
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm, 2)
        await until(lambda: spawner.child_spawner.job and spawner.child_spawner.job.running)
        await asyncio.sleep(0.2)  # ten of the start's checks
        looked = slurm.commands[len(slurm.commands) - slurm.commands[::-1].index("sbatch"):]
        # Asked for alone once; its first look is one taken after it was watched, not the other session's last.
        assert looked[0] == "squeue job" and looked.count("squeue states") >= 3, looked
        assert "squeue" not in looked and looked.count("squeue job") == 1, looked
        assert slurm.last_jobs[job].running  # what the hub's metrics count: the job as last told, alone here
        before = len(slurm.commands)
        assert await spawner.child_spawner.accept_port(PORT, str(job)) is None
        reported = slurm.commands[before:]  # the report's question (the start's looks may go on meanwhile)
        assert reported.count("squeue job") == 1 and "squeue" not in reported, reported
        assert await starting == ("node1", PORT)

    run(scenario())


def test_a_job_requeued_onto_another_node_while_jupyterlab_starts_is_routed_where_it_reported_from(hub, slurm):
    """The route goes to the host Slurm named when it showed the reporting job running, not the node the job
    ran on when the start first saw it: whoever listens on that port there is not her JupyterLab."""
    async def scenario():
        slurm.start_on = "node1"
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=SCAVENGER_FORM)
        job = await submitted(slurm)
        await until(lambda: spawner.child_spawner.job and spawner.child_spawner.job.batch_host == "node1")
        slurm.requeue(job)
        slurm.start(job, "node2")  # preempted as JupyterLab started, and run again elsewhere
        assert await spawner.child_spawner.accept_port(PORT, str(job)) is None
        assert await starting == ("node2", PORT)

    run(scenario())


def test_a_port_report_is_judged_by_an_answer_asked_after_it_arrived_and_a_silent_slurm_is_not_a_refusal(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        slurm.latency["squeue job"] = 0.3
        asked_before = asyncio.ensure_future(slurm.job_alone(job))  # a check's question, still under way
        await asyncio.sleep(0.05)
        slurm.start(job, "node2")  # the job runs and reports meanwhile
        assert await spawner.child_spawner.accept_port(PORT, str(job)) is None  # not judged by the older answer
        assert (await asked_before).pending and slurm.commands.count("squeue job") >= 2
        assert await starting == ("node2", PORT)
        slurm.latency.clear()

        second = hub.spawner("prep")
        starting = hub.spawn_soon(second, form={"profile": ["cpu"]})
        job = await submitted(slurm, 2)
        slurm.start(job, "node3")
        slurm.go_down()  # the hub's portreport.py answers 503, and the session asks again
        with pytest.raises(SlurmUnavailable):
            await second.child_spawner.accept_port(PORT + 1, str(job))
        slurm.come_back()
        assert await second.child_spawner.accept_port(PORT + 1, str(job)) is None
        assert await starting == ("node3", PORT + 1)

    run(scenario())


def test_a_job_that_ends_while_jupyterlab_starts_is_seen_by_the_look_and_told(hub, slurm):
    async def scenario():
        slurm.start_on = "node1"
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        await until(lambda: "squeue states" in slurm.commands)
        slurm.end(job, "FAILED", exit_code=1, reason="NonZeroExitCode")
        at_end = len(slurm.commands)
        with pytest.raises(Exception, match="ended before JupyterLab started"):
            await starting
        seen = slurm.commands[at_end:]  # the look, then the job alone: no full listing (then the log's last lines)
        assert seen[:seen.index("squeue job") + 1] in (["squeue job"], ["squeue states", "squeue job"]), seen

    run(scenario())


def test_many_jobs_changed_at_once_are_served_by_one_full_listing(hub, slurm, monkeypatch):
    """A node gone with many sessions: one full listing tells every one of them, not a squeue of each."""
    monkeypatch.setattr(slurmclient, "ONE_BY_ONE", 1)

    async def scenario():
        sessions = [await running_session(hub, name, form={"profile": ["cpu"]}, node="node3", port=PORT + i)
                    for i, name in enumerate(("a", "b"))]
        sessions.append(await running_session(hub, "c", node="node1", port=PORT + 2))  # a GPU session beside them
        await slurm.later()
        assert await asyncio.gather(*(s.poll() for s, _ in sessions)) == [None] * 3
        for _, job in sessions[:2]:
            slurm.end(job, "NODE_FAIL", reason="NodeDown")
        await slurm.later()
        before = len(slurm.commands)
        assert await asyncio.gather(*(s.poll() for s, _ in sessions)) == [1, 1, None]
        assert slurm.commands[before:].count("squeue") == 1 and "squeue job" not in slurm.commands[before:], \
            slurm.commands[before:]

    run(scenario())


def test_a_requeue_the_state_look_missed_is_seen_with_the_next_full_listing(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub, form=SCAVENGER_FORM)
        await slurm.later()
        assert await spawner.poll() is None
        slurm.requeue(job)
        slurm.start(job, "node2")  # run again within the second: RUNNING before and after
        await slurm.later()
        assert await spawner.poll() is None  # the look at its state alone cannot tell
        slurm.records_age(slurmclient.FULL_AT_REST)
        spawner.child_spawner.submitted_at -= slurmclient.FULL_AT_REST
        assert await spawner.poll() == 1
        assert "put back in its queue" in spawner.child_spawner.last_end

    run(scenario())


@pytest.mark.parametrize("release", ["22.05.8", None])
def test_commands_that_cannot_tell_states_alone_are_asked_for_the_full_listing(release):
    slurm = FakeSlurm(release=release)
    hub = Hub(slurm, f"/nonexistent/{release}/slurm.conf")

    async def scenario():
        spawner, _ = await running_session(hub, form={"profile": ["cpu"]}, node="node3")
        for _ in range(2):
            await slurm.later()
            before = len(slurm.commands)
            assert await spawner.poll() is None
            assert slurm.commands[before:] == ["squeue"]

    with slurm.installed(hub.config):
        run(scenario())


def test_a_state_look_slurmctld_does_not_answer_is_not_followed_by_a_full_listing(hub, slurm):
    """A hung slurmctld is waited for once, not twice: JupyterHub polls a session before it stops it, and a stop
    while slurmctld hangs must not wait out two command timeouts (tests/test_reliability.py on the cluster)."""
    async def scenario():
        spawner, _ = await running_session(hub)
        await slurm.later()
        slurm.go_down()
        before = len(slurm.commands)
        assert await spawner.poll() is None
        assert slurm.commands[before:] == ["squeue states"]
        assert spawner.child_spawner.job_status.startswith("UNKNOWN slurm_load_jobs error: Unable to contact")

    run(scenario())


def test_a_failed_state_look_falls_back_to_the_full_listing(hub, slurm, monkeypatch):
    async def scenario():
        spawner, job = await running_session(hub)
        await slurm.later()

        async def refused(argv):
            raise SlurmError("squeue: unrecognized option '--only-job-state'")

        monkeypatch.setattr(slurm, "_job_states", refused)
        slurm.end(job, "TIMEOUT")
        await slurm.later()
        assert await spawner.poll() == 1
        assert slurm.commands[-3:-1] == ["squeue states", "squeue"]

    run(scenario())


@pytest.mark.parametrize(("state", "reason", "exit_code", "words"), [
    ("CANCELLED", "None", 0, "was cancelled (Slurm: CANCELLED; seen at "),
    ("NODE_FAIL", "NodeDown", 0, "lost its node (Slurm: NODE_FAIL, reason NodeDown; seen at "),
    ("FAILED", "NonZeroExitCode", 1, "failed (Slurm: FAILED, reason NonZeroExitCode, exit code 1; seen at "),
    ("OUT_OF_MEMORY", "OutOfMemory", 0, "ran out of memory (Slurm: OUT_OF_MEMORY, reason OutOfMemory; seen at "),
])
def test_a_job_ended_outside_the_portal_is_told_in_words_on_her_next_page(hub, slurm, state, reason, exit_code,
                                                                          words):
    async def scenario():
        spawner, job = await running_session(hub)
        slurm.end(job, state, exit_code, reason)  # an scancel of hers, the node lost, ...
        await slurm.later()
        assert await spawner.poll() == 1
        await hub.stop(spawner)  # what JupyterHub does when poll says it ended
        assert spawner.session_ended.startswith(f"Your session job {job} {words}"), spawner.session_ended
        if state == "NODE_FAIL":  # what was kept: nothing could be saved as the node went
            assert "Its node failed, so nothing could be saved as it ended" in spawner.session_ended
        assert slurm.cancels == []  # nothing left to cancel
        assert hub.restart().spawner().session_ended == spawner.session_ended  # kept in the hub's state

    run(scenario())


def test_the_walltimes_end_says_what_jupyterlab_saved(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        slurm.write_log(job, f"starting\n{sessionvars.WALLTIME_SAVED} 3 notebooks (analysis.ipynb, ...)\nbye\n")
        slurm.end(job, "TIMEOUT", reason="TimeLimit")
        await slurm.later()
        assert await spawner.poll() == 1
        said = spawner.child_spawner.last_end
        assert said.startswith(f"Your session job {job} reached its time limit (Slurm: TIMEOUT, reason TimeLimit;")
        assert said.endswith(" As it ended, JupyterLab saved: 3 notebooks (analysis.ipynb, ...)."), said

    run(scenario())


SCAVENGER_FORM = {"profile": ["scavenger"], "gpus.scavenger": ["1"], "walltime.scavenger": ["00:02:00"]}


def test_a_preempted_session_whose_job_slurm_requeued_is_kept_and_taken_over_when_started_again(hub, slurm):
    """A session of a partition that preempts by requeueing: its job is submitted requeueable, with its log
    appended to and the warning's signal even for a short walltime. Slurm preempts it and puts it back in the
    queue: the hub's poll ends the session with its job kept (not cancelled, its token kept), says what
    JupyterLab saved, and the start that dsportal's service makes again takes the same job over."""
    async def scenario():
        spawner, job = await running_session(hub, form=SCAVENGER_FORM, node="node2")
        sbatch = slurm.submitted()[-1].sbatch
        assert sbatch.get("--requeue") == "" and sbatch.get("--open-mode") == "append" and "--no-requeue" not in sbatch
        assert sbatch.get("--signal", "").startswith("B:USR1@"), sbatch  # a 2-minute walltime: still warned
        token = spawner.api_token
        slurm.write_log(job, f"dsportal: session job {job} for {ME} on node2: 1 GPU(s)\n"
                             f"{sessionvars.PREEMPTED} for higher-priority work in about 58 s\n"
                             f"{sessionvars.WALLTIME_SAVED} work.ipynb\n")
        slurm.requeue(job)
        await slurm.later()
        assert await spawner.poll() == 1 and spawner.will_resume  # JupyterHub's stop keeps the job's token
        await hub.stop(spawner)
        assert slurm.cancels == []  # the job waits in the queue, its place kept
        assert spawner.kept_job["job_id"] == str(job) and not spawner.will_resume  # for the stops to come
        assert orm.APIToken.find(hub.db, token) is not None  # the job's token, for its report when it runs again
        said = spawner.session_ended
        assert said.startswith(f"Your session job {job} was preempted: Slurm stopped it for higher-priority work "
                               "(partition scavenger is preemptible). As it ended, JupyterLab saved: work.ipynb."), said
        assert "the portal starts your session again by itself when Slurm runs it again" in said
        resumed = hub.spawn_soon(spawner)  # dsportal's service: the REST API's start with her stored options
        await until(lambda: spawner.child_spawner is not None and spawner.child_spawner.job_id == str(job))
        assert len(slurm.submitted()) == 1 and not spawner.kept_job and not spawner.will_resume
        slurm.start(job, "node1")  # Slurm runs it again, elsewhere
        assert await spawner.child_spawner.accept_port(PORT, str(job)) is None
        assert await resumed == ("node1", PORT)
        assert spawner.child_spawner.restarts == 1 and spawner.session_ended == ""
        # Requeued again, with no preemption announced (its node failed, or an scontrol requeue): told apart from
        # the run it took over, and in other words; the first run's save is not quoted again.
        first_run = slurm.logs[slurm.record(job).output].text
        slurm.write_log(job, first_run + f"dsportal: session job {job} for {ME} on node1: 1 GPU(s)\n")  # appended
        slurm.requeue(job)
        await slurm.later()
        assert await spawner.poll() == 1 and spawner.kept_job["job_id"] == str(job)
        assert spawner.child_spawner.last_end.startswith(
            f"Your session job {job} was stopped by Slurm and put back in its queue (no preemption was announced: "
            "its node may have failed, or it was requeued). It waits in Slurm's queue"), spawner.child_spawner.last_end

    run(scenario())


def test_a_session_preempted_and_cancelled_is_told_so_with_what_jupyterlab_saved(hub, slurm):
    """A partition that preempts by cancelling (PreemptMode=CANCEL): the job ends PREEMPTED; her next page says
    so, with what JupyterLab saved as it was warned."""
    async def scenario():
        spawner, job = await running_session(hub)
        slurm.write_log(job, f"dsportal: session job {job} for {ME} on node1: 2 GPU(s)\n"
                             f"{sessionvars.PREEMPTED} for higher-priority work in about 58 s\n"
                             f"{sessionvars.WALLTIME_SAVED} work.ipynb\n")
        slurm.end(job, "PREEMPTED")
        await slurm.later()
        assert await spawner.poll() == 1
        said = spawner.child_spawner.last_end
        assert said.startswith(f"Your session job {job} was preempted (Slurm: PREEMPTED;"), said
        assert said.endswith(" As it ended, JupyterLab saved: work.ipynb."), said
        assert slurm.cancels == [] and not spawner.kept_job  # nothing kept: it will not run again

    run(scenario())


def test_a_session_that_is_not_preemptible_is_submitted_not_requeueable(hub, slurm):
    async def scenario():
        await running_session(hub)
        sbatch = slurm.submitted()[-1].sbatch
        assert "--no-requeue" in sbatch and "--requeue" not in sbatch and "--open-mode" not in sbatch

    run(scenario())


def test_a_job_slurm_no_longer_lists_is_told_from_accounting_or_as_unknown(hub, slurm):
    async def scenario():
        first, job = await running_session(hub, "a", form={"profile": ["cpu"]}, node="node3")
        slurm.end(job, "FAILED", 2, "NonZeroExitCode")
        slurm.forget(job)  # MinJobAge passed while nobody polled
        await slurm.later()
        assert await first.poll() == 1
        assert first.child_spawner.last_end.startswith(f"Your session job {job} failed (Slurm: FAILED, reason "
                                                       "NonZeroExitCode, exit code 2;")
        slurm.keeps_accounting = False
        second, job = await running_session(hub, "b", form={"profile": ["cpu"]}, node="node3")
        slurm.end(job, "COMPLETED")
        slurm.forget(job)
        await slurm.later()
        assert await second.poll() == 1
        assert second.child_spawner.last_end.startswith(f"Your session job {job} is no longer known to Slurm")

    run(scenario())


def test_a_completing_job_is_told_as_accounting_recorded_it(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        slurm.completing(job, "CANCELLED")  # squeue: COMPLETING, which hides how it ended
        await slurm.later()
        assert await spawner.poll() == 1
        assert spawner.child_spawner.last_end.startswith(f"Your session job {job} was cancelled (Slurm: CANCELLED;")

    run(scenario())


def test_a_failed_squeue_never_drops_a_session(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        slurm.go_down()
        await slurm.later()
        assert await spawner.poll() is None
        assert spawner.child_spawner.job_status.startswith("UNKNOWN slurm_load_jobs error: Unable to contact")
        slurm.come_back()
        await slurm.later()
        assert await spawner.poll() is None and spawner.child_spawner.job_status == "RUNNING node1"

    run(scenario())


# ----------------------------------------------------------------------------------------- the stop
def test_stop_cancels_the_job_and_forgets_it(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        await hub.stop(spawner)
        assert slurm.cancels == [(ME, job)] and slurm.record(job).state == "CANCELLED"
        assert spawner.session_ended == ""  # stopped through the portal: nothing to explain
        assert "job_id" not in spawner.orm_spawner.state.get("child_state", {})
        assert slurm.active() == []

    run(scenario())


def test_a_stop_while_slurm_is_down_does_not_wait_it_out(hub, slurm, monkeypatch):
    monkeypatch.setattr(gpuspawner, "STOP_WAITS_FOR_SLURM", 0.1)  # 10 s in the hub

    async def scenario():
        spawner, job = await running_session(hub)
        slurm.go_down()
        started = time.monotonic()
        await spawner.stop()
        assert time.monotonic() - started < 2  # STOP_WAITS_FOR_SLURM, not the outage
        assert slurm.cancels == [(ME, job)]  # asked once, and again in the background every 10 s
        assert slurm.record(job).state == "RUNNING"

    run(scenario())


# ----------------------------------------------------------------------------- limits and fail-fast
def test_a_session_waiting_past_its_profiles_queue_limit_is_withdrawn_in_words(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form={"profile": ["gpu"]})
        job = await submitted(slurm)
        await until(lambda: spawner.child_spawner.job_id == str(job))  # sbatch has returned: its time counts
        # JupyterHub gives the start the profile's time in the queue, then its own start_timeout.
        assert spawner.start_timeout == 30 * 60 + START_TIMEOUT
        slurm.hold(job, "QOSMaxGRESPerUser")
        # The spawner has seen the reason (a snapshot taken before the hold still says Priority) ...
        await until(lambda: spawner.child_spawner.job and spawner.child_spawner.job.reason == "QOSMaxGRESPerUser")
        spawner.child_spawner.submitted_at -= 31 * 60  # ... then half an hour in the queue, without waiting it
        with pytest.raises(SpawnFailed) as withdrawn:
            await starting
        assert (withdrawn.value.status_code, withdrawn.value.reason) == (503, "queue-limit")
        assert withdrawn.value.jupyterhub_message == (
            "Your session waited 30 min in Slurm's queue for 1 GPU, 8 CPUs, 48 GB, 08:00:00 on gpu (Slurm's reason: "
            "QOSMaxGRESPerUser), the longest GPU partition lets a session wait; it was taken out of the queue. Try "
            "fewer GPUs, another profile, or later.")
        assert slurm.cancels == [(ME, job)] and slurm.record(job).state == "CANCELLED"

    run(scenario())


def test_a_job_that_dies_as_it_starts_is_reported_with_its_reason_and_its_logs_last_lines(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        slurm.start(job, "node1")
        await until(lambda: spawner.child_spawner.state_isrunning())  # the hub waits for the port now
        log = slurm.write_log(job, "dsportal: session job started\nTraceback (most recent call last):\n"
                                   "ModuleNotFoundError: No module named 'jupyterhub'\n")
        slurm.end(job, "FAILED", 1, "NonZeroExitCode")
        with pytest.raises(SpawnFailed) as failed:
            await starting
        said = f"Session job {job} ended before JupyterLab started (FAILED, reason NonZeroExitCode, exit code 1)."
        assert failed.value.jupyterhub_message == (  # shown to her alone
            f"{said} Last lines of {log}:\ndsportal: session job started\nTraceback (most recent call last):\n"
            "ModuleNotFoundError: No module named 'jupyterhub'"), failed.value.jupyterhub_message
        assert "ModuleNotFoundError" not in str(failed.value)  # the hub's log names the file only
        assert f"Last lines of {log} shown to {ME}." in str(failed.value)

    run(scenario())


def test_a_job_ended_before_it_ran_is_reported_without_another_jobs_log(hub, slurm):
    """Job ids come round again after a Slurm reset: a log older than the submission is another job's."""
    async def scenario():
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        slurm.write_log(job, "an older job's last words\n", mtime=time.time() - 3600)
        slurm.end(job, "CANCELLED", reason="None")  # an admin's scancel while it waited
        with pytest.raises(SpawnFailed) as failed:
            await starting
        assert failed.value.jupyterhub_message == f"Session job {job} ended before it started (CANCELLED, reason None, exit code 0)."
        assert slurm.cancels == []

    run(scenario())


def test_a_submission_slurm_refuses_is_told_with_what_to_do(hub, slurm):
    async def scenario():
        slurm.refuse_next_submit("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
                                 "(job submit limit, user's size and/or time limits)")
        with pytest.raises(SpawnFailed) as refused:
            await hub.spawn(hub.spawner(), form=GPU_FORM)
        assert (refused.value.status_code, refused.value.reason) == (400, "submit-refused")
        assert refused.value.jupyterhub_message.endswith("The limits of the Slurm QoS do not allow this request (they "
                                                        "count everything you run): ask for fewer GPUs or less time, "
                                                        "or ask your admin.")
        assert slurm.active() == [] and slurm.cancels == []

    run(scenario())


def test_a_start_while_slurm_is_down_is_refused_in_words_and_leaves_nothing_behind(hub, slurm):
    async def scenario():
        slurm.go_down()
        spawner = hub.spawner()
        with pytest.raises(SpawnFailed) as refused:
            await hub.spawn(spawner, form=GPU_FORM)
        assert (refused.value.status_code, refused.value.reason) == (503, "scheduler-unavailable")
        assert refused.value.jupyterhub_message.startswith(
            "The cluster scheduler is not answering right now, please retry in a minute (sbatch: error: Batch job "
            "submission failed: Unable to contact slurm controller")
        assert slurm.records == {} and slurm.cancels == []
        assert spawner.orm_spawner.state == {"child_conf": {}, "profile": ""} and spawner.server is None
        slurm.come_back()  # and the next start goes through
        spawner, job = await running_session(hub)
        assert slurm.active() == [slurm.record(job)]

    run(scenario())


# ------------------------------------------------------------------------------------- several sessions
def test_a_profiles_sessions_per_user_are_capped_naming_those_she_has(hub, slurm):
    async def scenario():
        await running_session(hub)  # her default session, on gpu (1 a user)
        with pytest.raises(SpawnFailed) as capped:
            await hub.spawn(hub.spawner("second"), form={"profile": ["gpu"]})
        assert (capped.value.status_code, capped.value.reason) == (409, "session-limit")
        assert capped.value.jupyterhub_message == (
            "You already have 1 session on GPU partition ('default'), the most it allows one user at once. Stop one "
            "of them on your home page, or choose another profile.")
        assert len(slurm.submissions) == 1
        # Another profile's session runs beside it.
        await running_session(hub, "prep", form={"profile": ["cpu"]}, node="node3", port=PORT + 1)
        assert len(slurm.active(ME)) == 2

    run(scenario())


def test_two_starts_at_once_cannot_both_take_a_profiles_last_place(hub, slurm):
    async def scenario():
        starts = [hub.spawn_soon(hub.spawner(name), options={"profile": "gpu"}) for name in ("x", "y")]
        job = await submitted(slurm)
        slurm.start(job, "node1")
        await hub.users[ME].spawners["x"].child_spawner.accept_port(PORT, str(job))
        results = await asyncio.gather(*starts, return_exceptions=True)
        assert results[0] == ("node1", PORT)
        assert isinstance(results[1], SpawnFailed) and results[1].reason == "session-limit", results[1]
        assert len(slurm.submissions) == 1

    run(scenario())


# -------------------------------------------------------------------------------------- the hub's restart
def test_a_restarted_hub_finds_the_running_session_and_keeps_it(hub, slurm):
    async def scenario():
        listening = await asyncio.start_server(lambda reader, writer: writer.close(), "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        async with listening:
            spawner, job = await running_session(hub, node="127.0.0.1", port=port)  # its server listens there
            restarted = hub.restart()
            again = restarted.spawner()
            child = again.child_spawner
            assert (child.job_id, child.slice.gpus, child.slice.walltime) == (str(job), 2, "04:00:00")
            assert child.slurm is restarted.slurm is not slurm
            assert await restarted.check(again) is None  # the hub keeps it
            assert again.pending is None and child.job.batch_host == "127.0.0.1"
            # A report now would move a running session's route: refused.
            assert "port reports are accepted once" in await child.accept_port(port + 1, str(job))
            await restarted.stop(again)
            assert slurm.cancels == [(ME, job)] and slurm.record(job).state == "CANCELLED"

    run(scenario())


async def cut_short_by_a_restart(hub: Hub, slurm: FakeSlurm, form: dict = GPU_FORM) -> tuple[Hub, PartitionSpawner, int]:
    """A start whose job waits in the queue when the hub restarts, and the restarted hub's check of it:
    (the restarted hub, its spawner, the job)."""
    spawner = hub.spawner()
    starting = hub.spawn_soon(spawner, form=form)
    job = await submitted(slurm)
    slurm.hold(job, "Resources")
    stored = await until(lambda: (spawner.orm_spawner.state or {}).get("child_state", {}).get("job_id") and
                         spawner.orm_spawner.state)
    assert stored["child_state"]["starting"] is True, stored
    restarted = hub.restart()  # the old hub process is gone with its start still waiting
    starting.cancel()
    again = restarted.spawner()
    assert again.child_spawner.job_id == str(job) and again.child_spawner.starting
    assert await restarted.check(again) == 1  # JupyterHub records no server for it...
    await restarted.stop(again)
    assert slurm.cancels == [] and slurm.record(job).state == "PENDING"  # ...and its job keeps its place
    kept = again.orm_spawner.state["kept_job"]
    assert kept["job_id"] == str(job) and kept["token_id"] > 0, again.orm_spawner.state  # the job's token, by id
    assert again.session_ended == (  # her home page, until the session is started again
        f"Your session job {job} was waiting in Slurm's queue when the portal restarted: it keeps its place, and "
        "the portal starts your session again by itself. Starting it yourself takes the same job over.")
    return restarted, again, job


def test_a_session_still_queued_when_the_hub_restarts_is_resumed_and_takes_over_its_job(hub, slurm):
    """JupyterHub stores a spawner's state once start() returns and cannot go on with a start after a restart:
    the job's id is stored as sbatch returns, the restarted hub keeps that job, and the start that dsportal's
    service makes again (portal.hub.resume: the stored options) takes it over: no second job, her place kept."""
    async def scenario():
        restarted, again, job = await cut_short_by_a_restart(hub, slurm)
        resumed = restarted.spawn_soon(again)  # the REST API's start with {"user_options": null}
        await until(lambda: again.child_spawner is not None and again.child_spawner.job_id == str(job))
        assert len(slurm.submitted()) == 1  # nothing submitted again
        assert again.orm_spawner.state["child_state"]["starting"] is True  # kept again, should the hub restart again
        assert "kept_job" not in again.orm_spawner.state and again.session_ended == ""
        slurm.start(job, "node1")
        assert await again.child_spawner.accept_port(PORT, str(job)) is None
        assert await resumed == ("node1", PORT)
        assert again.child_spawner.slice.gpus == 2 and again.session_ended == ""
        await restarted.stop(again)
        assert slurm.cancels == [(ME, job)]

    run(scenario())


def test_a_kept_job_that_ended_before_its_session_was_resumed_is_told_in_words_and_nothing_else_is_cancelled(
        hub, slurm):
    async def scenario():
        restarted, again, job = await cut_short_by_a_restart(hub, slurm)
        slurm.end(job, "CANCELLED", reason="None")  # she cancelled it herself meanwhile
        with pytest.raises(SpawnFailed) as failed:
            await restarted.spawn(again)
        message = f"Your session job {job}, kept in Slurm's queue for your session, is no longer waiting or running"
        assert failed.value.jupyterhub_message.startswith(message) and failed.value.reason == "resume-gone", failed.value
        assert again.session_ended.startswith(message), again.session_ended
        assert len(slurm.submitted()) == 1 and slurm.cancels == []
        assert "kept_job" not in again.orm_spawner.state  # her next start is a new one
        starting = restarted.spawn_soon(again, form=GPU_FORM)
        await submitted(slurm, 2)
        starting.cancel()

    run(scenario())


def test_a_start_refused_for_now_keeps_the_kept_job_for_the_next_start(hub, slurm, monkeypatch):
    """A start that fails for now (here the directory not answering her e-mail address) lets the kept job keep
    its place: only a request refused for good lets it go."""
    async def scenario():
        restarted, again, job = await cut_short_by_a_restart(hub, slurm)

        async def directory_down(options):
            raise SpawnFailed("Your e-mail address could not be looked up", reason="directory-unavailable",
                              status_code=503)

        monkeypatch.setattr(again, "mail_user_for", directory_down)
        with pytest.raises(SpawnFailed):
            await restarted.spawn(again)
        monkeypatch.undo()
        assert slurm.cancels == [] and slurm.record(job).state == "PENDING"
        assert again.orm_spawner.state["kept_job"]["job_id"] == str(job), again.orm_spawner.state
        resumed = restarted.spawn_soon(again)
        await until(lambda: again.child_spawner is not None and again.child_spawner.job_id == str(job))
        assert len(slurm.submitted()) == 1
        resumed.cancel()

    run(scenario())


def test_a_kept_job_id_that_slurm_gave_another_job_is_neither_taken_over_nor_cancelled(hub, slurm):
    """After a Slurm reset a job id comes round again: a job of someone else's, or another of her own jobs, with
    the kept id is left alone, and she is told her queued job is gone."""
    async def scenario():
        restarted, again, job = await cut_short_by_a_restart(hub, slurm)
        record = slurm.record(job)
        record.name = f"dsportal-{ME}:other"  # now the job of another of her sessions
        with pytest.raises(SpawnFailed) as failed:
            await restarted.spawn(again)
        assert failed.value.reason == "resume-gone" and slurm.cancels == [] and record.state == "PENDING"

    run(scenario())


def test_a_start_that_asks_for_another_slice_cancels_the_kept_job_and_submits_its_own(hub, slurm):
    async def scenario():
        restarted, again, job = await cut_short_by_a_restart(hub, slurm)
        starting = restarted.spawn_soon(again, form={**GPU_FORM, "gpus.gpu": ["1"]})
        second = await submitted(slurm, 2)
        assert second != job
        await until(lambda: (ME, job) in slurm.cancels)
        assert slurm.record(job).state == "CANCELLED"
        starting.cancel()

    run(scenario())


def test_a_start_whose_job_failed_while_the_hub_was_down_says_how_it_ended_not_that_it_was_withdrawn(hub, slurm):
    async def scenario():
        spawner = hub.spawner()
        starting = hub.spawn_soon(spawner, form=GPU_FORM)
        job = await submitted(slurm)
        await until(lambda: (spawner.orm_spawner.state or {}).get("child_state", {}).get("starting"))
        slurm.end(job, "FAILED", reason="NonZeroExitCode", exit_code=1)
        restarted = hub.restart()
        again = restarted.spawner()
        assert await restarted.check(again) == 1
        await restarted.stop(again)
        assert slurm.cancels == [] and "was still starting" not in again.session_ended, again.session_ended
        assert again.session_ended.startswith(f"Your session job {job} failed"), again.session_ended
        starting.cancel()

    run(scenario())


def test_a_session_that_ended_while_the_hub_was_down_is_told_at_its_restart(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        slurm.end(job, "NODE_FAIL", reason="NodeDown")
        restarted = hub.restart()
        again = restarted.spawner()
        assert await restarted.check(again) == 1
        await restarted.stop(again)
        assert again.session_ended.startswith(f"Your session job {job} lost its node (Slurm: NODE_FAIL, reason "
                                              "NodeDown;"), again.session_ended
        assert slurm.cancels == []

    run(scenario())


# ------------------------------------------------------------------------- walltime and idle sessions
def test_more_walltime_is_given_up_to_the_lower_of_the_profiles_and_slurms_limits(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)  # 04:00:00
        profile = spawner.child_spawner.slice.profile
        done = await extend_walltime(slurm, job, profile, 60, ME)
        assert (done.done, done.time_limit_s, slurm.record(job).time_limit) == (True, 5 * 3600, 300)
        assert done.message == "Your session's walltime is now 5 h (1 h more)."
        slurm.time_limits["gpu"] = 6 * 60  # the partition's MaxTime, below the profile's 12 h
        done = await extend_walltime(slurm, job, profile, 600, ME)
        assert done.message == "Your session's walltime is now 6 h, the longest partition gpu allows (1 h more)."
        assert not (await extend_walltime(slurm, job, profile, 60, "mallory")).done  # hers alone
        slurm.end(job, "COMPLETED")
        assert (await extend_walltime(slurm, job, profile, 60, ME)).message == (
            "Your session is not running, so there is nothing to extend.")

    run(scenario())


def test_a_gpu_session_unused_past_its_profiles_idle_limit_is_stopped_in_words(hub, slurm):
    async def scenario():
        spawner, job = await running_session(hub)
        assert await spawner.poll() is None
        spawner.created_at -= 3600  # the hub has been up an hour: the sessions' activity reports are in
        spawner.orm_spawner.last_activity = (datetime.now(UTC) - timedelta(hours=3)).replace(tzinfo=None)
        assert await spawner.poll() == 1
        assert slurm.cancels == [(ME, job)] and slurm.record(job).state == "CANCELLED"
        await hub.stop(spawner)
        assert spawner.session_ended.startswith(f"Your session job {job} was stopped after 3 h without use, to "
                                                "give its 2 GPU(s) back to others (partition gpu stops sessions "
                                                "unused for 2 h)."), spawner.session_ended

    run(scenario())


def test_the_fake_never_runs_a_real_command(slurm):
    """A client method the fake does not answer fails the test rather than run Slurm."""
    with pytest.raises(AssertionError, match="the fake does not answer"):
        asyncio.run(slurm.run(["squeue"]))
    with pytest.raises(SlurmUnavailable):
        slurm.go_down()
        asyncio.run(slurm.jobs())
    assert sbatch_options("#!/bin/bash\n#SBATCH --time=1:00\necho\n#SBATCH --mem=1M\n") == {"--time": "1:00"}


def test_her_groups_are_asked_anew_at_each_start_their_names_learnt_once(monkeypatch):
    """Who is in which group is asked at every call (a colleague removed from a group loses its profiles at her
    next start); a group's name by gid is looked up once per GROUP_NAME_SECONDS, not with its whole member list at
    every call (a login group of thousands, on the hub's event loop)."""
    from portal.core import userjson

    looked_up = []
    real = grp.getgrgid
    monkeypatch.setattr(userjson, "_group_names", {})
    monkeypatch.setattr(userjson.grp, "getgrgid", lambda gid: looked_up.append(gid) or real(gid))
    assert MY_GROUP in userjson.unix_groups(ME)
    first = len(looked_up)
    assert first and userjson.unix_groups(ME) == userjson.unix_groups(ME) and len(looked_up) == first
    monkeypatch.setattr(userjson.os, "getgrouplist", lambda name, gid: [])  # she left every group
    assert userjson.unix_groups(ME) == set()
    assert userjson.unix_groups("dsportal-no-such-account") == set()
