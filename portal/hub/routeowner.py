"""A route reaches its own user only (hub.internal_ssl).

Every session's certificate comes from the same CA and names every node (spawner/certs.py), so
when bob's session ends, alice could bind his port on that node before the hub drops his route and,
presenting her own certificate, be taken for him. Two places talk to a session over TLS:

- the proxy, for every request: it runs as :func:`proxy_command`, configurable-http-proxy started
  through ``proxy.js``, which accepts a session on ``/user/<name>/`` only if its certificate names
  ``<name>`` (502 otherwise, before anything is sent);
- the hub, when it waits for a started session to answer and when it checks the running sessions
  after a restart (JupyterHub's ``User._wait_up``): :func:`check_sessions_by_their_certificate`
  makes that check accept only the very certificate the hub issued to the session's user, again
  failing the handshake before the request goes out.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import shutil
import ssl
from pathlib import Path

import jupyterhub.user

from spawner import certs

WRAPPER = Path(__file__).with_name("proxy.js")
CHP_PACKAGE = "configurable-http-proxy"


def proxy_command(command: list[str]) -> list[str]:
    """``command`` (configurable-http-proxy and its options) run through proxy.js with Node."""
    script = Path(shutil.which(command[0]) or command[0]).resolve()
    package = script.parent.parent / "package.json"
    try:
        name = json.loads(package.read_text()).get("name")
    except (OSError, ValueError):
        name = None
    if name != CHP_PACKAGE or script.parent.name != "bin":
        raise ValueError(f"hub.proxy_command {command[0]!r} is not {CHP_PACKAGE}'s bin script "
                         f"({script}): with hub.internal_ssl the portal runs that proxy with its own "
                         "route owner check (portal/hub/proxy.js)")
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        raise ValueError("Node.js (node) is not on PATH: configurable-http-proxy needs it")
    return [node, str(WRAPPER), str(script), *command[1:]]


# The certificate the session being checked must present (DER): set around User._wait_up.
_EXPECTED_CERTIFICATE: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "dsportal_expected_session_certificate", default=None)


class _PinnedSessionSSLObject(ssl.SSLObject):
    """asyncio's TLS to a session the hub checks: after the usual checks (the CA, the node's
    name), the certificate must be the one in :data:`_EXPECTED_CERTIFICATE` when the connection
    was made; else the handshake fails and no request is written."""

    @classmethod
    def _create(cls, *args, **kwargs):
        sslobj = super()._create(*args, **kwargs)
        sslobj.expected_certificate = _EXPECTED_CERTIFICATE.get()
        return sslobj

    def do_handshake(self):
        super().do_handshake()
        if self.expected_certificate is None or self.getpeercert(binary_form=True) != self.expected_certificate:
            raise ssl.SSLCertVerificationError(
                "the session's certificate is not the one the hub issued to its user: another "
                "user's server on the session's address (dsportal: a route reaches its own user only)")


def _pinning(make_ssl_context):
    def pinned(*args, **kwargs):
        context = make_ssl_context(*args, **kwargs)
        if context is not None:
            context.sslobject_class = _PinnedSessionSSLObject
        return context

    pinned.original = make_ssl_context
    pinned.pins_session_certificates = True
    return pinned


def _waiting_for_the_users_own_certificate(wait_up):
    async def wait_up_pinned(self, spawner):
        expected = await asyncio.to_thread(certs.issued_certificate, spawner.internal_certs_location, self.name)
        token = _EXPECTED_CERTIFICATE.set(expected or b"")  # none issued: nothing is accepted
        try:
            return await wait_up(self, spawner)
        finally:
            _EXPECTED_CERTIFICATE.reset(token)

    wait_up_pinned.pins_session_certificates = True
    return wait_up_pinned


def check_sessions_by_their_certificate() -> None:
    """The hub's checks of a session (``jupyterhub.user.make_ssl_context`` is used for nothing
    else) accept only the user's own session certificate. Idempotent."""
    if not getattr(jupyterhub.user.make_ssl_context, "pins_session_certificates", False):
        jupyterhub.user.make_ssl_context = _pinning(jupyterhub.user.make_ssl_context)
    if not getattr(jupyterhub.user.User._wait_up, "pins_session_certificates", False):
        jupyterhub.user.User._wait_up = _waiting_for_the_users_own_certificate(jupyterhub.user.User._wait_up)
