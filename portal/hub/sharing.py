"""Sharing a session with named colleagues (portal.yaml's ``sharing``): JupyterHub's own sharing, bounded
by roles so that the hub itself refuses a share outside what the admin allows.

- Groups: at each login the authenticator puts the user in those of the sharing groups she is a Unix
  member of (``Authenticator.manage_groups``; groups nobody configured stay out of the hub).
- Roles: one per sharing group G, held by G's members: ``shares!user`` (grant and revoke access to
  her own sessions) and the names of G's members and of G (``read:users:name!group=G``,
  ``read:groups:name!group=G``). JupyterHub's share handler asks for ``read:users:name!user=<guest>``
  (or the group's), so she can share with members of a group she is in, and with nobody else.
- The tokens the OAuth client of a session whose owner may share gives its visitors
  (``oauth_client_allowed_scopes``: PartitionSpawner) may carry ``shares!server`` (that session's
  shares) and the names: the Share panel (portal.session.sharing) grants and takes back that one
  session's shares with the owner's own browser token. JupyterHub intersects each token's scopes with
  its holder's rights, so a guest's token never carries them, and the session's own token (which its
  kernels can read) gets nothing new.

The guest gets ``access:servers!server=<owner>/<session>``: the session's server lets her in, and
dsportal's session code keeps its owner-only pages (jobs, TensorBoards, the share panel, proxies) hers.
"""

from __future__ import annotations

from portal.hub.sessions import later, shareable, shared_with

ROLE_PREFIX = "dsportal-share-in-"


def not_shareable(owner: str, server_name: str) -> str:
    what = f"{owner}'s session {server_name}" if server_name else f"{owner}'s default session"
    return (f"{what} was not started shareable, so nobody could open it through a share: start it with \"Let me "
            "share this session with a colleague\" ticked, then share it.")


def refusing_unshareable(handler: type) -> type:
    """JupyterHub's share handler (a share, or a share code), whose POST refuses a session not started
    shareable in words, after JupyterHub's own scope check (nobody learns of another's sessions)."""
    from jupyterhub.scopes import needs_scope
    from tornado import web

    class Refusing(handler):
        @needs_scope("shares")
        async def post(self, user_name, server_name=None):
            if server_name is not None:
                spawner = self._lookup_spawner(user_name, server_name, raise_404=False)
                if spawner is not None and not shareable(spawner):
                    raise web.HTTPError(400, not_shareable(user_name, server_name))
            return await super().post(user_name, server_name)

    # Its name and module stay upstream's: the hub's logs and its metrics' handler labels do not change.
    Refusing.__name__, Refusing.__qualname__, Refusing.__module__ = handler.__name__, handler.__qualname__, handler.__module__
    Refusing.dsportal_refuses_unshareable = True
    return Refusing


def refuse_unshareable_on(hub) -> None:
    """The hub's share routes (JupyterHub's REST API: /api/shares/<user>/<server>, /api/share-codes/...)
    served by :func:`refusing_unshareable` subclasses, in place (PATCHES: unshareable-share-refused)."""
    from jupyterhub.apihandlers.shares import ServerShareAPIHandler, ServerShareCodeAPIHandler

    from portal.upstream.patchcheck import stands_aside

    if stands_aside("unshareable-share-refused"):  # the session still refuses such a guest (GuestGate)
        return
    for rule in hub.tornado_application.wildcard_router.rules:
        target = rule.target
        if target in (ServerShareAPIHandler, ServerShareCodeAPIHandler):
            rule.target = refusing_unshareable(target)


refuse_unshareable_on.refuses_unshareable = True  # PATCHES: unshareable-share-refused is applied


def roles(groups: list[str]) -> list[dict]:
    """``JupyterHub.load_roles``: a role per sharing group, held by that group."""
    return [{"name": f"{ROLE_PREFIX}{group}",
             "description": f"Share one's own sessions with members of {group} (portal.yaml sharing.groups)",
             "scopes": ["shares!user", f"read:users:name!group={group}", f"read:groups:name!group={group}"],
             "groups": [group]} for group in groups]


def configure(c, settings) -> None:
    groups = list(settings.sharing.groups)
    if not groups:
        return
    c.Authenticator.manage_groups = True
    c.PortalAuthenticator.sharing_groups = groups
    c.PortalOIDCAuthenticator.sharing_groups = groups
    c.JupyterHub.load_roles = roles(groups)
    from portal.upstream.hub import after_init_tornado_application

    after_init_tornado_application(refuse_unshareable_on)  # a share of a session not started shareable: refused
    c.PartitionSpawner.sharing_groups = groups
    c.SlurmGPUSpawner.sharing_groups = groups
    # The home page's "Shared with you", read when a page shows it (home.html only), not at every page.
    c.JupyterHub.template_vars = {**c.JupyterHub.template_vars, "shared_with_me": later(shared_with)}


