"""A user's sessions as her hub pages show them: each one's slice, node, state and time left.

With several sessions per user (JupyterHub's named servers: a CPU session preparing data beside a
GPU session training), the home page lists them all, the default one first; each row says what
the session holds and for how long, read from what the hub already knows (the spawner's slice and
the job as the shared squeue snapshot last listed it): rendering a page asks Slurm nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from portal.core.settings import human_duration


@dataclass(frozen=True)
class SessionRow:
    name: str  # JupyterHub's server name; '' for the default session
    label: str
    active: bool
    ready: bool
    url: str
    profile: str = ""
    held: str = ""  # "1 GPU, 8 CPUs, 48 GB, 08:00:00 on gpu"
    state: str = "stopped"
    node: str = ""
    time_left: str = ""
    ended: str = ""  # why its last job ended outside the portal, until its next start


def _state(spawner, job) -> str:
    if spawner.pending == "stop":
        return "stopping"
    if job is None:
        return "running" if spawner.ready else "submitting"
    if job.pending:
        return f"queued (job {job.job_id})"
    return f"{'running' if spawner.ready else 'starting'} (job {job.job_id})"


def _ended(spawner) -> str:
    """Why its last job ended outside the portal. A session not running may be JupyterHub's database
    row (``User.all_spawners`` gives those for stopped named servers): then it is read from its state."""
    if hasattr(spawner, "session_ended"):
        return spawner.session_ended or ""
    return str((spawner.state or {}).get("session_ended") or "")


def row(user, spawner) -> SessionRow:
    common = {"name": spawner.name, "label": spawner.name or "default", "active": spawner.active,
              "ready": spawner.ready, "url": user.server_url(spawner.name)}
    if not spawner.active:
        return SessionRow(**common, ended=_ended(spawner))
    child = getattr(spawner, "child_spawner", None)
    chosen, job = getattr(child, "slice", None), getattr(child, "job", None)
    node, left = "", ""
    if job is not None and job.running:
        node = job.batch_host
        if job.start_time and job.time_limit:
            left = human_duration(max(0, job.start_time + job.time_limit * 60 - time.time()))
    return SessionRow(**common, profile=chosen.profile.display_name if chosen else "",
                      held=chosen.describe() if chosen else "", state=_state(spawner, job), node=node, time_left=left)


def rows(user) -> list[SessionRow]:
    """Template variable ``sessions``: the user's sessions, the default first, then by name."""
    if user is None:
        return []
    spawners = sorted(user.all_spawners(include_default=True), key=lambda s: (s.name != "", s.name))
    return [row(user, spawner) for spawner in spawners]


def ended(user) -> dict[str, str]:
    """Template variable ``session_ended``: server name -> why its last session ended outside the
    portal (scancel, node failure, walltime, idle reclaim), for the sessions not running now."""
    if user is None:
        return {}
    return {s.name: _ended(s) for s in user.all_spawners(include_default=True) if not s.active and _ended(s)}


def relaunch_choices(user) -> dict[str, dict]:
    """For each session of ``user`` that ended outside the portal, the choices of its last start as the rules
    allow them today (PartitionSpawner.last_choice; none where they no longer pass)."""
    found = {}
    if user is None:
        return found
    for stopped in user.all_spawners(include_default=True):
        if stopped.active or not _ended(stopped):
            continue
        spawner = user.spawners[stopped.name]  # the user's spawner of that session (JupyterHub makes it once)
        choice = spawner.last_choice() if hasattr(spawner, "last_choice") else {}
        if choice:
            found[stopped.name] = choice
    return found


class Later:
    """``compute(user)`` (a list or a dict), computed the first time a template reads it: JupyterHub calls a
    template variable's function for every page it renders, the token page and the spawn form's included,
    and only the home page and a stopped session's page read these."""

    def __init__(self, compute, user):
        self._compute, self._user, self._value = compute, user, None

    def _get(self):
        if self._value is None:
            self._value = self._compute(self._user)
        return self._value

    def __bool__(self):
        return bool(self._get())

    def __len__(self):
        return len(self._get())

    def __iter__(self):
        return iter(self._get())

    def __getitem__(self, key):
        return self._get()[key]

    def get(self, key, default=None):
        return self._get().get(key, default)

    def items(self):
        return self._get().items()


def later(compute):
    """A template variable's function: ``compute`` for the user, when a template first reads it."""
    return lambda user: Later(compute, user)


class Relaunch(Later):
    """Template variable ``relaunch``: the logged-in user's (``owner``) ended sessions' last choices, by session
    name, for the notice's button that starts one again with them through the spawn form's own POST. Computed
    the first time a page reads it (the home page, a stopped session's page), not for every page."""

    def __init__(self, user):
        super().__init__(relaunch_choices, user)
        self.owner = user.name if user is not None else ""


@dataclass(frozen=True)
class SharedRow:
    owner: str
    name: str  # the owner's server name; '' for her default session
    label: str  # "alice's session train"
    active: bool
    url: str


def shareable(spawner) -> bool:
    """Whether a session (JupyterHub's orm.Spawner) was started shareable: the form's "Let me share this
    session with a colleague" ticked (its user_options' ``shared``), as the session itself judges."""
    return (getattr(spawner, "user_options", None) or {}).get("shared") is True


def shared_with(user) -> list[SharedRow]:
    """Template variable ``shared_with_me``: the sessions others shared with her, by name or through a
    group (JupyterHub's shares; portal.yaml sharing), the running ones first. Read from the hub's own
    records: rendering the page asks Slurm nothing."""
    if user is None:
        return []
    orm_user = getattr(user, "orm_user", None)
    shares = list(getattr(orm_user, "all_shared_with_me", None) or [])
    users = getattr(user, "settings", {}).get("users")
    rows = {}
    for share in shares:
        if share.user is None:  # a group's share: JupyterHub 6.1 lets its members in by their own shares only
            continue
        spawner = share.spawner
        owner = spawner.user if spawner is not None else None
        if owner is None or owner.name == user.name or users is None:
            continue
        if not shareable(spawner):  # shared before it was started without the box ticked: it would refuse him
            continue
        wrapper = users[owner]
        active = bool(spawner.server)
        label = f"{owner.name}'s session {spawner.name}" if spawner.name else f"{owner.name}'s default session"
        rows[(owner.name, spawner.name)] = SharedRow(owner.name, spawner.name, label, active,
                                                     wrapper.server_url(spawner.name))
    return sorted(rows.values(), key=lambda r: (not r.active, r.owner, r.name))
