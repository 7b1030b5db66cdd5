"""PartitionSpawner: the user's chosen partition profile configures the Slurm child spawner.

A wrapspawner.WrapSpawner subclass, as the design card asks, with the gaps wrapspawner 1.0.1
leaves on JupyterHub 6 filled in here:
- ``progress`` raised before the child existed (the hub's progress stream then errored);
- the options form was static text: ours is rendered per user from portal.yaml and live ``sinfo``;
- options were not validated: ours refuse anything the profile does not allow, before JupyterHub
  stores them and before a job exists, for the form and the REST API alike (HTTP 400 with the reason;
  the hub asks for the REST API's: portal/hub/useroptions.py);
- the chosen profile is kept in the hub's state so a hub restart rebuilds the same child.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import replace
from datetime import UTC, datetime

from jupyterhub import orm
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import object_session
from traitlets import Any, Dict, Float, Instance, Integer, List, Unicode, default, directional_link, observe
from wrapspawner import WrapSpawner

from portal.core.images import building_detail
from portal.core.rules import (
    RequestError,
    SessionRequest,
    check_length,
    judge_request,
    may_use,
    plain_mail_address,
    share_name,
    slice_for,
    wants_mail,
)
from portal.core.settings import LdapSettings, Profile, parse_memory_mb, parse_walltime, shown
from portal.core.settingtraits import setting
from portal.core.templating import render
from portal.core.userjson import unix_groups
from portal.slurm.slurmclient import SlurmError
from spawner import certs, mailaddress, metrics
from spawner.gpuspawner import RequestRefused, SlurmGPUSpawner, SpawnFailed, session_job_name

# What the tokens a shareable session's visitors hold may carry besides access to it (JupyterHub intersects
# them with each holder's rights: only the owner's carry them).
SHARING_SCOPES = ("shares!server", "read:users:name", "read:groups:name")

# The last request each user's options were judged into, with what it was judged against (the profiles, her
# groups, the default profile, the sharing groups): the start that follows the form or the REST API's request
# takes it as it is, not judged again, while all of that is the same. At most JUDGED_USERS users are remembered.
JUDGED_USERS = 4096
_judged: OrderedDict[str, tuple[tuple, str, SessionRequest]] = OrderedDict()


def _options_key(options) -> str:
    return json.dumps(options, sort_keys=True, separators=(",", ":"), default=repr)


class PartitionSpawner(WrapSpawner):
    # portal.yaml's own models, validated once as the hub loaded it: never dumped and validated again here.
    profiles = List(Instance(Profile), help="Partition profiles offered to users.").tag(config=True)
    default_profile = Unicode(help="Profile used when a request names none.").tag(config=True)
    resources_interval = setting("slurm.resources_interval")
    ldap = Instance(LdapSettings, allow_none=True, help="The portal's LDAP settings: where the user's e-mail "
                    "address (her entry's `mail`) is read for Slurm's mail when her session starts. None: no "
                    "e-mail.").tag(config=True)

    sharing_groups = List(Unicode(), help="portal.yaml's sharing.groups: the browser tokens of a session whose "
                          "owner is in one of them may manage its shares (portal.hub.sharing).").tag(config=True)

    child_profile = Unicode()
    session_ended = Unicode("", help="Why the last session ended outside the portal, until the next start.")
    kept_job = Dict(help="{'job_id', 'slice'}: the session job of a start that a hub restart cut short, still queued "
                    "(or just started): the next start takes it over (portal.hub.resume starts it at once). Kept in "
                    "the hub's state and through JupyterHub's clearing of it, as session_ended is.")
    created_at = Float(help="time.monotonic() when the hub made this spawner (at its start, for running sessions).")
    boot_timeout = Integer(help="The configured start_timeout: the time to come up once Slurm runs the job (the "
                           "spawner's own start_timeout adds the profile's time in the queue).")
    mail_looked_up = Any(None, help="(options' key, her address or '') of the start under way: looked up by the form "
                         "or create_certs, taken by start() (one look-up a start).")
    certs_to_write = Any(None, help="(folder, {name: text}) of move_certs, for the start's submission to write.")
    session_scopes = Any(None, help="The OAuth client scopes a start taking a kept job over gave its session "
                         "(start_polling puts them back after JupyterHub's token re-use cleared them).")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.created_at = time.monotonic()

    @default("oauth_client_allowed_scopes")
    def _sharing_scopes(self):
        """The session's shares (and the names to share with), for the tokens of a session whose owner may
        share; JupyterHub's default (access to it alone) for anyone else's."""
        if self.sharing_groups and unix_groups(self.user.name) & set(self.sharing_groups):
            return list(SHARING_SCOPES)
        return []

    @default("boot_timeout")
    def _configured_start_timeout(self):
        return self.start_timeout  # read before the observer below first changes it

    @observe("user_options")
    def _set_start_timeout(self, change):
        """JupyterHub gives start() ``start_timeout``, read before start() runs (after it sets the
        options): the profile's time in Slurm's queue (the child withdraws a job that waits longer,
        in words), then the time to come up once it runs."""
        name = (change["new"] or {}).get("profile") or self.default_profile
        profile = next((p for p in self.profiles if p.name == name), None)
        if profile is None:  # an unknown profile: start() refuses it at once
            self.start_timeout = self.boot_timeout
            return
        self.start_timeout = parse_walltime(profile.queue_limit) + self.boot_timeout

    # ------------------------------------------------------------------ profiles
    def profile_models(self) -> list[Profile]:
        return list(self.profiles)

    def user_profiles(self) -> list[Profile]:
        groups = unix_groups(self.user.name)
        return [p for p in self.profile_models() if may_use(p, groups)]

    def judged(self, options: dict) -> SessionRequest:
        """The request ``options`` make, judged by the rules (portal.core.rules.judge_request, called here alone), or
        RequestRefused with the reason. A request is judged where it enters the hub (the form: options_from_form;
        the REST API: portal/hub/useroptions.py, before JupyterHub stores it); the start that follows takes that
        judgement (the user's spawners share it: the rules are hers and the portal's, not a session's)."""
        key = _options_key(options)
        against = (self.profile_models(), unix_groups(self.user.name),
                   self.default_profile or self.profile_models()[0].name, list(self.sharing_groups))
        known = _judged.get(self.user.name)
        if known is not None and known[1] == key and known[0] == against:
            return known[2]
        try:
            request = judge_request(options or {}, *against)
        except RequestError as error:
            raise RequestRefused(f"Your session request was refused: {error}") from None
        self._remember(against, key, request)
        return request

    def _remember(self, against: tuple, key: str, request: SessionRequest) -> None:
        _judged[self.user.name] = (against, key, request)
        _judged.move_to_end(self.user.name)
        while len(_judged) > JUDGED_USERS:
            _judged.popitem(last=False)

    def count_refusal(self, options) -> None:
        asked = options.get("profile") if isinstance(options, dict) else None
        known = {p.name for p in self.profiles}  # a label never takes what a user typed
        metrics.SPAWN_FAILURES.labels(asked if isinstance(asked, str) and asked in known else "(other)",
                                      "invalid-request").inc()

    # ---------------------------------------------------- e-mail when the session starts
    async def mail_address(self) -> str | None:
        """The user's address in LDAP, unchecked; None without one (or without LDAP settings)."""
        if not self.ldap:
            return None
        return await mailaddress.lookup(self.ldap, self.user.name)

    async def mail_user_for(self, options: dict) -> str:
        """The --mail-user of a request that asks for mail (validated options), else ''."""
        if not wants_mail(options or {}):
            return ""
        try:
            address = await self.mail_address()
        except mailaddress.DirectoryUnavailable as error:
            raise SpawnFailed(f"Your e-mail address could not be looked up: {error}. Start without the e-mail, "
                              "or retry in a minute.", reason="directory-unavailable", status_code=503) from None
        if address is None:
            raise RequestRefused("Your session request was refused: there is no e-mail address for your account in "
                                 "the directory, so Slurm cannot mail you when the session starts; start without the "
                                 "e-mail, or ask your admin to add your address")
        try:
            return plain_mail_address(address)
        except RequestError as error:
            raise RequestRefused(f"Your session request was refused: {error}") from None

    async def _mail_choice(self) -> dict:
        """What the form's e-mail checkbox shows: the address, or why it is off."""
        try:
            address = await self.mail_address()
        except mailaddress.DirectoryUnavailable as error:
            return {"address": "", "note": f"Your e-mail address could not be looked up right now: {error}."}
        if address is None and not self.ldap:  # portal.yaml's oidc: no directory to look addresses up in
            return {"address": "", "note": "This portal signs people in through single sign-on and looks no e-mail "
                                           "addresses up: e-mail when a session starts is off."}
        if address is None:
            return {"address": "", "note": "No e-mail address is known for your account in the directory: "
                                           "ask your admin to add one."}
        try:
            return {"address": plain_mail_address(address), "note": ""}
        except RequestError as error:
            return {"address": "", "note": f"No e-mail: {error}."}

    # ---------------------------------------------------------------- the form
    async def _options_form(self, spawner=None) -> str:
        mail = asyncio.ensure_future(self._mail_choice())  # LDAP answers while sinfo does
        resources = {}
        try:
            slurm = SlurmGPUSpawner.shared_client(self.config)
            resources = await slurm.resources(self.resources_interval)
        except SlurmError as error:
            self.log.warning("sinfo failed, form shows no live resources: %s", error)
        rows = []
        for profile in self.user_profiles():
            share = slice_for(profile, f"1/{profile.gpu_shares}") if profile.gpu_shares else None
            rows.append({
                "profile": profile,
                "share": share and {
                    "value": f"1/{profile.gpu_shares}", "name": share_name(profile.gpu_shares), "cpus": share.cpus,
                    "mem_gb": f"{share.mem_mb / 1024:.1f}".removesuffix(".0"),
                    "gpu_memory_gb": (round(parse_memory_mb(profile.gpu_memory) / 1024 / profile.gpu_shares)
                                      if profile.gpu_memory else None)},
                "mem_per_gpu_gb": parse_memory_mb(profile.mem_per_gpu) // 1024,
                "mem_without_gpu_gb": parse_memory_mb(profile.mem_without_gpu) // 1024,
                "resources": resources.get(profile.partition),
            })
        default = self.default_profile if any(r["profile"].name == self.default_profile for r in rows) else (
            rows[0]["profile"].name if rows else "")
        last = self.last_choice()
        if last and any(r["profile"].name == last["profile"] for r in rows):
            default = last["profile"]
        sharing = sorted(unix_groups(self.user.name) & set(self.sharing_groups))
        return render("spawn_form.html.j2", rows=rows, default=default, mail=await mail, last=last,
                      building=self._images_being_built(), sharing=sharing)

    def _images_being_built(self) -> list[tuple[str, str]]:
        """(display name, "being built, about N min") of the catalog's images a builder is making now
        (a new demo's, say): the form says so, and their kernels show it on the launcher."""
        catalog = self.config.SlurmGPUSpawner.get("images") or []
        found = {}
        for image in catalog if isinstance(catalog, list) else []:  # portal.core.settings.Image models (hub/config.py)
            try:
                detail = building_detail(image)
            except Exception as error:  # noqa: BLE001 - a note of the form: the form itself must render
                self.log.warning("could not tell whether image %s is being built: %s", image.name, error)
                continue
            if detail:
                found.setdefault(image.display_name, detail)
        return list(found.items())

    def last_choice(self) -> dict:
        """The options of the user's last start, as the rules read them today ({} if none, or if they no
        longer pass: a profile withdrawn, a walltime now too long): the form starts from them."""
        options = (self.orm_spawner.user_options if self.orm_spawner is not None else None) or {}
        if not options:
            return {}
        try:
            chosen = self.judged(options).slice
        except RequestRefused:
            return {}
        gpus = f"1/{chosen.profile.gpu_shares}" if chosen.shares else chosen.gpus
        return {"profile": chosen.profile.name, "gpus": gpus, "walltime": chosen.walltime,
                "mail": options.get("mail") is True, "shared": options.get("shared") is True}

    @default("options_form")
    def _options_form_default(self):
        return self._options_form

    @default("child_class")
    def _child_class_default(self):
        return SlurmGPUSpawner  # never wrapspawner's LocalProcessSpawner default

    def options_from_query(self, query_data):
        """JupyterHub starts a session straight from a GET /hub/spawn?... link: a stranger's link could
        start one in her name (a top-level GET carries no XSRF check). Sessions start from the form's
        POST alone; JupyterHub then shows the form with this message. A lecture link presets the form
        without starting anything (/hub/spawn#profile=...)."""
        raise RequestRefused("A link cannot start a session: check the choices below and press Start. "
                             "(A link may preset this form: /hub/spawn#profile=NAME&gpus=N&walltime=HH:MM:SS.)")

    async def options_from_form(self, formdata):
        """The form's fields read into options and judged, before JupyterHub stores them: a refusal brings the
        form back with the message. The chosen profile's own fields (each profile has its own 'gpus.NAME' and
        'walltime.NAME'), and the e-mail and sharing checkboxes ('mail', 'shared') shared by all profiles.
        Every field sent is measured first, those of the other profiles too."""
        try:
            for key, values in formdata.items():
                for value in values:
                    check_length(f"the form's field {shown(key)}", value)
        except RequestError as error:
            raise RequestRefused(f"Your session request was refused: {error}") from None
        profile = (formdata.get("profile") or [""])[0]
        options = {"profile": profile}
        for key in ("gpus", "walltime"):
            if values := formdata.get(f"{key}.{profile}"):
                options[key] = values[0].strip()
        for box in ("mail", "shared"):
            if ticked := formdata.get(box):
                # A ticked checkbox sends "on"; anything else goes on as sent, for the rules to refuse in words.
                options[box] = True if ticked[0] == "on" else ticked[0]
        request = self.judged(options)
        self.mail_looked_up = (_options_key(options), await self.mail_user_for(options))  # its start takes it
        self.check_session_limit(request.profile)
        return options

    # ------------------------------------------------- several sessions per user
    def sessions_on(self, profile: Profile) -> list:
        """The user's other sessions on ``profile`` that hold a slice or wait for one (named servers; a
        stopped one is JupyterHub's database row, never active)."""
        return [spawner for spawner in self.user.all_spawners(include_default=True)
                if spawner is not self and spawner.active and getattr(spawner, "child_profile", "") == profile.name]

    def check_session_limit(self, profile: Profile) -> None:
        """Refuse, in words, a session past the profile's sessions_per_user (nothing is submitted)."""
        others = self.sessions_on(profile)
        if len(others) < profile.sessions_per_user:
            return
        names = ", ".join(f"'{s.name or 'default'}'" for s in sorted(others, key=lambda s: s.name))
        metrics.SPAWN_FAILURES.labels(profile.name, "session-limit").inc()
        raise SpawnFailed(
            f"You already have {len(others)} session{'s' if len(others) != 1 else ''} on {profile.display_name} "
            f"({names}), the most it allows one user at once. Stop one of them on your home page, or choose "
            "another profile.", reason="session-limit", status_code=409)

    # ------------------------------------------------------ internal TLS (hub.internal_ssl)
    async def create_certs(self):
        await self.admit()  # a request that will be refused gets no key (and leaves no record in the store)
        # The session's node is not known yet when its certificate is made: it names every node.
        names = await certs.node_alt_names(SlurmGPUSpawner.shared_client(self.config))
        if self.user.settings.get("subdomain_host"):
            # The proxy reaches the session for the user's own host (alice.<hub host>, hub.subdomain_host)
            # and checks the certificate against that name, as JupyterHub's own certificates name it.
            names.append(f"DNS:{self.user.domain}")
        return await asyncio.to_thread(certs.session_pair, self.internal_certs_location, self.user.name, names,
                                       self.internal_trust_bundles["notebooks-ca"], self.name)

    async def delete_forever(self):
        """A named session deleted for good: its certificate's record and files leave the hub's store
        (each named session has its own; the default session's stays, reused at its next start), in a
        thread: the stores are written and synced to disk. JupyterHub awaits this before it answers."""
        super().delete_forever()
        if self.kept_job:  # its job waits in the queue for a session that is gone: out, its token revoked
            asyncio.ensure_future(self._let_kept_go(self.kept_job, "the session was deleted"))
        if self.name:
            await asyncio.to_thread(certs.forget_session, self.internal_certs_location, self.user.name, self.name)

    async def move_certs(self, paths):
        """The session's certificates, for the user's folder: written by start()'s submission, in the
        same mediator run (JupyterHub calls this just before start). Their paths there."""
        folder, files, delivered = await certs.prepare(self.user.name, paths, self.internal_certs_location, self.name)
        self.certs_to_write = (folder, files)
        return delivered

    # ----------------------------------------------------------- the child
    def select_profile(self, name: str) -> None:
        profile = next((p for p in self.profile_models() if p.name == name), None)
        if profile is None:
            raise RequestRefused(f"unknown partition profile {name!r}")
        self.child_profile = name
        self.child_class = SlurmGPUSpawner
        # The job launcher of the session may use every profile this user may (same rules).
        self.child_config = {"profile": profile, "launch_profiles": self.user_profiles()}

    def construct_child(self):
        """wrapspawner's construct_child, without handing the child the hub's database session
        (Spawner.db, deprecated in JupyterHub 6.1: neither spawner uses it), and with the user's
        options from the start (a restarted hub's child reads them as it loads its state)."""
        if self.child_spawner is None:
            self.child_spawner = self.child_class(
                user=self.user, hub=self.hub, authenticator=self.authenticator, oauth_client_id=self.oauth_client_id,
                server=self._server, config=self.config, user_options=self.user_options, **self.child_config)
            # Its initial state would be ours: cleared, then the child's own loaded.
            self.child_spawner.clear_state()
            if self.child_state:
                self.child_spawner.load_state(self.child_state)
            # Linked like wrapspawner's, but for Spawner.db: reading it is what JupyterHub warns about.
            for trait in set(self.trait_names()) & set(self.child_spawner.trait_names()) - set(self.child_config) - {"db"}:
                directional_link((self, trait), (self.child_spawner, trait))
        return self.child_spawner

    def load_child_class(self, state):
        # After a hub restart: rebuild the child the session was started with, without
        # re-judging the request (a running session is never dropped over a config change).
        name = state.get("profile") or ""
        known = {p.name for p in self.profile_models()}
        self.select_profile(name if name in known else (self.default_profile or self.profile_models()[0].name))

    def get_state(self):
        state = super().get_state()
        # The child's profile as the session started with it (wrapspawner keeps child_config in the state): JSON.
        state["child_conf"] = {key: [v.model_dump(mode="json") for v in value] if isinstance(value, list)
                               else value.model_dump(mode="json") for key, value in self.child_config.items()}
        state["profile"] = self.child_profile
        if self.session_ended:
            state["session_ended"] = self.session_ended
        if self.kept_job:
            state["kept_job"] = self.kept_job
        return state

    def load_state(self, state):
        # Read back from the hub's database, once per session as the hub starts (never again in memory).
        stored = state.get("child_conf") or {}
        child_conf = {}
        if isinstance(stored.get("profile"), dict):
            child_conf["profile"] = Profile.model_validate(stored["profile"])
        if isinstance(stored.get("launch_profiles"), list):
            child_conf["launch_profiles"] = [Profile.model_validate(p) for p in stored["launch_profiles"]]
        super().load_state({**state, "child_conf": child_conf})
        self.session_ended = state.get("session_ended", "")
        kept = state.get("kept_job")
        self.kept_job = kept if isinstance(kept, dict) and str(kept.get("job_id", "")).isdigit() else {}

    def clear_state(self):
        # A job that ended outside the portal (the child's poll saw it): say why on the next page.
        if self.child_spawner is not None and self.child_spawner.last_end:
            self.session_ended = self.child_spawner.last_end
        metrics.session_idle(id(self), "", 0, None)
        super().clear_state()
        self.child_profile = ""
        self.will_resume = False  # JupyterHub's stop has kept or dropped the token by now (set by poll alone)

    async def admit(self) -> str:
        """Whether the start may go on: its request judged (that of the form or the REST API, judged as it came
        in; else the options of an earlier start, which a start without options reuses, judged now), her address
        looked up if it asks for mail, and the profile's session limit counted. Returns the job's --mail-user ('':
        no mail). Raises with the reason; nothing is made for a request that is refused. JupyterHub makes a
        session's certificates before start(): create_certs asks first (no key made, no store record left for a
        refused request), start() again. The start takes the judged request from judged() itself."""
        key = _options_key(self.user_options)
        try:
            request = self.judged(self.user_options)  # the entry's judgement (the memo, checked against her groups)
            if self.mail_looked_up is None or self.mail_looked_up[0] != key:  # not by the form or create_certs
                self.mail_looked_up = (key, await self.mail_user_for(self.user_options))
        except RequestRefused:
            self.count_refusal(self.user_options)
            # JupyterHub keeps a start's options as the defaults of the next start (a plain one reuses
            # them): options refused now (a profile withdrawn, no e-mail address) must not stick.
            if self.orm_spawner is not None and (session := object_session(self.orm_spawner)) is not None:
                self.orm_spawner.user_options = {}
                session.commit()
            raise
        self.check_session_limit(request.profile)
        return self.mail_looked_up[1]

    async def start(self):
        # Validate before anything reaches Slurm: a refused request never constructs a child.
        # A kept job (kept_job) stays recorded until this start takes it over or lets it go: a start that
        # fails for now (the directory down, her session limit reached) leaves it for the next one.
        kept = self.kept_job
        try:
            mail_user = await self.admit()
        except RequestRefused:
            if kept:  # refused now (a profile withdrawn, a limit lowered): its queued job goes too
                await self._let_kept_go(kept, "its request is refused now")
                self.session_ended = (f"Your session job {kept['job_id']}, kept in Slurm's queue for your session, "
                                      "was taken out of the queue: its request is refused now. Start your session "
                                      "again.")
            raise
        # The limit was counted after admit's last await: from there to select_profile nothing else
        # runs on the hub's loop, so two starts at once cannot both take the last place.
        # The request admitted, from judged's memo: the GPU count goes from the judgement to the child through
        # this start alone.
        request = replace(self.judged(self.user_options), mail_user=mail_user)
        self.mail_looked_up = None
        self.session_ended = ""
        if self.child_spawner is not None and self.child_profile != request.profile.name:
            self.child_spawner = None
        self.select_profile(request.profile.name)
        self.construct_child()
        child = self.child_spawner
        child.request, child.slice = request, request.slice  # judged once: the child submits exactly this
        child.submit_certs, self.certs_to_write = self.certs_to_write, None
        child.on_submitted = self._store_state
        child.taken_over_token, child.token_adopted, self.session_scopes = -1, False, None
        if kept and kept.get("slice") == child.get_state().get("slice"):
            child.resume_job_id = str(kept["job_id"])
            child.taken_over_token = int(kept.get("token_id") or 0)
            # JupyterHub resets the session's OAuth client's scopes when it takes the job's token back:
            # put back in start_polling, right after.
            client = self.orm_spawner.oauth_client if self.orm_spawner is not None else None
            self.session_scopes = list(client.allowed_scopes) if client is not None else None
        elif kept:  # she asked for another slice since: that job is not the one she waits for any more
            await self._let_kept_go(kept, "a start asked for another slice")
        try:
            return await child.start()
        except BaseException:
            if child.taken_over_token >= 0 and not child.resume_job_id:  # Slurm answered about the kept job
                self.kept_job = {}
                if child.taken_over_token > 0 and not child.token_adopted:
                    self._forget_token(child.taken_over_token)  # the kept job's token: nothing uses it now
            raise

    def start_polling(self):
        """JupyterHub calls this right after a start returned and it took the session's token back (its
        Spawner.api_token re-use, jupyterhub/user.py), which leaves the session's OAuth client with no
        scopes: a taken-over job's session gets back those the start gave it (its sharing ones)."""
        child = self.child_spawner
        if child is not None and child.token_adopted and self.session_scopes is not None:
            client = self.orm_spawner.oauth_client if self.orm_spawner is not None else None
            if client is not None and list(client.allowed_scopes) != self.session_scopes:
                self.log.info("Session of %s took its job's token back: its OAuth client's scopes put back (%s, were %s)",
                              self.user.name, self.session_scopes, list(client.allowed_scopes))
                client.allowed_scopes = self.session_scopes
                object_session(client).commit()
        self.session_scopes = None
        super().start_polling()

    async def _let_kept_go(self, kept: dict, why: str) -> None:
        """Take a kept job (kept_job) out of the queue, for a start that will not take it over, and revoke
        its token; only that session's job (her name for it in Slurm: a job id Slurm gave again after a reset
        may be another's, or another of hers). The cancel goes on in the background until Slurm takes it."""
        self.kept_job = {}
        self._forget_token(int(kept.get("token_id") or 0))
        slurm = SlurmGPUSpawner.shared_client(self.config)
        job_id = int(kept["job_id"])
        job = await slurm.job(job_id, fresh_after=time.monotonic())
        if job is None or job.user != self.user.name or job.name != session_job_name(self.user.name, self.name) \
                or job.finished:
            return
        self.log.info("Session job %s of %s, kept through a hub restart, is cancelled: %s", job_id, self.user.name, why)
        slurm.cancel_soon(self.user.name, job_id).add_done_callback(
            lambda done: done.cancelled() or not done.exception() or self.log.warning(
                "scancel %s of %s failed: %s", job_id, self.user.name, done.exception()))

    def _forget_token(self, token_id: int) -> None:
        """Revoke the API token ``token_id`` of this user (a kept job's, which nothing will use)."""
        session = object_session(self.orm_spawner) if self.orm_spawner is not None else None
        if not token_id or session is None:
            return
        token = session.get(orm.APIToken, token_id)
        if token is not None and token.user is not None and token.user.name == self.user.name:
            session.delete(token)
            session.commit()

    def _store_state(self) -> None:
        """The session's job in the hub's database as soon as sbatch returns. JupyterHub stores a spawner's
        state once start() returns: a hub restarted while the session waited in the queue knew no job of
        it, and left that job queued for nobody (its port report refused once it ran)."""
        session = object_session(self.orm_spawner) if self.orm_spawner is not None else None
        if session is None:
            return
        try:
            child = self.child_spawner
            if child.taken_over_token >= 0:  # a kept job taken over: recorded as this start's own
                self.kept_job = {}
            elif self.api_token and (token := orm.APIToken.find(session, self.api_token)) is not None:
                child.token_id = token.id  # the token this job was submitted with (a restart's take-over checks it)
            self.orm_spawner.state = self.get_state()
            session.commit()
        except SQLAlchemyError as error:  # the start goes on: JupyterHub stores the state once it returns
            session.rollback()
            self.log.warning("Session job of %s not stored as it was submitted: %s", self.user.name, error)

    async def poll(self):
        # The hub's startup check is flagged on this wrapper; the child does the checking.
        if self.child_spawner is not None:
            self.child_spawner.hub_checking = self.pending == "check"
        status = await super().poll()
        if self.child_spawner is not None and self.child_spawner.kept:  # a hub restart, or Slurm requeued the job
            self.kept_job, self.child_spawner.kept = self.child_spawner.kept, None
            self.will_resume = True  # JupyterHub's stop keeps the job's token: the start that takes the job over lets it in
        idle = self.idle_seconds() if status is None else None
        self._report_idle(idle)
        if idle is not None and idle > (self.child_spawner.idle_limit() or float("inf")):
            await self.child_spawner.reclaim(idle)
            return 1
        return status

    def _report_idle(self, idle: float | None) -> None:
        """For the metric of GPUs held idle (spawner.metrics.session_idle)."""
        chosen = self.child_spawner.slice if idle is not None else None
        metrics.session_idle(id(self), chosen.profile.partition if chosen else "", chosen.gpus if chosen else 0,
                             idle if chosen else None)

    def idle_seconds(self) -> float | None:
        """How long the running session has been unused (JupyterHub's last activity: the browser
        through the proxy, the session's own reports), or None while it starts, stops or is checked."""
        if self.child_spawner is None or self.orm_spawner is None or not self.server or self.pending:
            return None
        # After a hub restart the sessions' reports of the downtime arrive within one interval:
        # until then the recorded last activity may be old for a session that was in use.
        if time.monotonic() - self.created_at < 2 * self.child_spawner.activity_interval + 5:
            return None
        last = self.orm_spawner.last_activity or self.orm_spawner.started
        if last is None:
            return None
        return (datetime.now(UTC).replace(tzinfo=None) - last.replace(tzinfo=None)).total_seconds()

    async def progress(self):
        while self.child_spawner is None:
            yield {"message": "Checking your request..."}
            await asyncio.sleep(0.5)
        async for event in self.child_spawner.progress():
            yield event
