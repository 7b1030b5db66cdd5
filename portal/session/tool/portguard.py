"""A session's ``/proxy/<port>/`` opens only its own user's services.

jupyter-server-proxy forwards ``/user/NAME/proxy/<port>/`` to whatever listens on that port of
the node. On a node shared by several users' slices that is anybody's web app, TensorBoard or
notebook: bob's own proxy URL would hand him alice's. Here every proxied request first looks
up who owns the listening socket (``/proc/net/tcp`` and ``tcp6`` carry each socket's owner
uid) and refuses, with 403 and a sentence, ports that belong to another user, as well as other
hosts. Unix sockets (the portal's TensorBoards, socket-based named servers) are the session's
own by construction.

jupyter-server-proxy's own hook, a ``host_allowlist`` callable, is consulted only for
``/proxy/<host>:<port>/``; ``/proxy/<port>/`` and ``/proxy/absolute/<port>/`` always allow
localhost. So :func:`install` (called by the session's server extension) puts guarded
subclasses in place of both handler classes in the server's routes, whatever the order in which
the extensions load.
"""

from __future__ import annotations

import os
import socket

from tornado import web

from portal.upstream import session as upstream

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
_LISTEN = "0A"
# Addresses a connection to "localhost" can reach: loopback and the wildcard (any address).
_REACHABLE_V4 = {"0100007F", "00000000"}
_REACHABLE_V6 = {"00000000000000000000000000000000", "00000000000000000000000001000000",
                 "0000000000000000FFFF00000100007F"}


def listener_uids(port: int, proc_net: str = "/proc/net") -> set[int]:
    """The owner uids of the sockets listening on ``port`` that localhost reaches."""
    owners = set()
    for name, reachable in (("tcp", _REACHABLE_V4), ("tcp6", _REACHABLE_V6)):
        try:
            with open(os.path.join(proc_net, name)) as table:
                next(table, None)  # header
                for line in table:
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != _LISTEN:
                        continue
                    address, _, hex_port = fields[1].partition(":")
                    if int(hex_port, 16) == port and address in reachable:
                        owners.add(int(fields[7]))
        except FileNotFoundError:
            continue
    return owners


def _account(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def refusal(handler, host: str) -> str | None:
    """None when the request may go through; else why not, for the person who asked."""
    if getattr(handler, "unix_socket", None):
        return None
    if host not in LOCAL_HOSTS:
        return (f"Only services of your own session on this node can be opened here, not {host!r}.")
    port = upstream.proxy_target_port(handler)
    owners = listener_uids(port)
    me = os.getuid()
    if not owners:
        return f"Nothing of yours listens on port {port} on {socket.gethostname()}."
    strangers = owners - {me}
    if strangers:
        return (f"Port {port} on {socket.gethostname()} belongs to another user "
                f"({', '.join(sorted(_account(u) for u in strangers))}): your session opens only your own services.")
    return None


def host_allowlist(handler, host: str) -> bool:
    """A jupyter-server-proxy ``host_allowlist`` callable: the owner check."""
    why = refusal(handler, host)
    if why is None:
        return True
    handler.log.warning("dsportal: refused proxy to %s: %s", handler.request.path, why)
    if handler.request.headers.get("Upgrade", "").lower() == "websocket":
        return False  # jupyter-server-proxy answers a refused websocket with 403 itself
    raise web.HTTPError(403, why)


def install(web_app, base_url: str, log) -> None:
    """Guard every ``/proxy/...`` route of the session's server (see the module's docstring)."""
    swapped = upstream.guard_proxy_routes(web_app, base_url, host_allowlist)
    if swapped:
        log.info("dsportal: /proxy/ opens only this user's own services (%d routes guarded)", swapped)
        return
    log.info("dsportal: /proxy/ routes registered, guarded (only this user's own services)")
