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

ROLE_PREFIX = "dsportal-share-in-"


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
    c.JupyterHub.load_roles = roles(groups)
    c.PartitionSpawner.sharing_groups = groups
    c.SlurmGPUSpawner.sharing_groups = groups
    # The home page's "Shared with you", read when a page shows it (home.html only), not at every page.
    c.JupyterHub.template_vars = {**c.JupyterHub.template_vars, "shared_with_me": lambda user: _Lazy(user)}


class _Lazy:
    """sessions.shared_with(user), computed the first time a template reads it."""

    def __init__(self, user):
        self._user, self._rows = user, None

    def _get(self):
        if self._rows is None:
            from .sessions import shared_with

            self._rows = shared_with(self._user)
        return self._rows

    def __bool__(self):
        return bool(self._get())

    def __iter__(self):
        return iter(self._get())
