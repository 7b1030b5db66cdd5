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
import json
import shutil
from pathlib import Path

from portal.upstream import hub as upstream
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


async def _issued_certificate(certs_location: str, user: str, server: str = "") -> bytes | None:
    return await asyncio.to_thread(certs.issued_certificate, certs_location, user, server)


def check_sessions_by_their_certificate() -> None:
    """The hub's checks of a session (``jupyterhub.user.make_ssl_context`` is used for nothing
    else) accept only the user's own session certificate (portal/upstream/hub.py). Idempotent."""
    upstream.pin_session_certificates(_issued_certificate)
