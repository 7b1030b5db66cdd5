"""Each user's server on a web origin of its own (JupyterHub's subdomain_host), and the hub's pages on
the hub's own host.

With one origin for everybody, a page alice's server serves runs in bob's browser with bob's cookies
for the hub and for his own server: it can read his files, start his kernels and mint his tokens.
With subdomain_host, alice's server is http(s)://alice.<hub host>/user/alice/ and bob's cookies for
the hub and for his server are never sent with, or readable by, her pages.

JupyterHub then serves its pages at subdomain_host. A browser that opens the hub at another host
(the demo's http://127.0.0.1:8000, what README and `make demo` print) would get the hub's login
cookies for that host, and be asked to log in again once its server's OAuth sends it to the hub's
own host: the hub's pages, opened at any other host, redirect to the same path on the hub's host.
The hub API (/hub/api/, token or OAuth) and any request with a token (/hub/metrics) answer on every
host, as scripts use them.

On a machine where users have shells (the demo), the hub also holds [::1]:<port> for localhost names
(hold_ipv6_loopback_port)."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

from jupyterhub.app import JupyterHub
from tornado import web
from tornado.routing import Matcher, Rule

from portal.upstream import hub as upstream


class HubPageOnAnotherHost(Matcher):
    """A browser's GET of a hub page (not the API), through the proxy, at a host that is not the
    hub's. (The proxy's own requests, for the error page it shows when a server does not answer,
    come straight to the hub: they get the page.)"""

    def __init__(self, hub_host: str, hub_prefix: str):
        self.hub_host_name = urlparse(hub_host).hostname
        self.hub_prefix = hub_prefix
        self.api_prefix = hub_prefix + "api/"

    def match(self, request):
        if request.method not in ("GET", "HEAD") or request.host_name == self.hub_host_name:
            return None
        if "X-Forwarded-For" not in request.headers or "Authorization" in request.headers:
            return None  # the proxy's own requests, and scripts with a token (Prometheus' /hub/metrics)
        path = request.path
        if not (path + "/").startswith(self.hub_prefix) or (path + "/").startswith(self.api_prefix):
            return None
        return {}


class ToTheHubsHost(web.RequestHandler):
    """Sends the browser to the same page at the hub's own host (subdomain_host)."""

    def initialize(self, hub_host: str):
        self.hub_host = hub_host

    def get(self):
        self.redirect(self.hub_host + self.request.uri)

    head = get


_RESERVED = []  # the sockets below, held as long as the hub runs


def hold_ipv6_loopback_port(subdomain_host: str, bind_url: str) -> None:
    """Browsers (and libnss-myhostname) resolve localhost and *.localhost to ::1 first, then to
    127.0.0.1. The proxy listens on 127.0.0.1 only: any user of this machine could listen on
    [::1]:<port> and be sent everybody's logins and sessions. The hub holds that address itself,
    bound without listening (no SO_REUSEADDR: nobody else can bind it, not even [::]): a browser's
    connection there is refused at once and it goes on to 127.0.0.1. If someone holds it already,
    the hub does not start."""
    host = urlparse(subdomain_host)
    if not (host.hostname == "localhost" or host.hostname.endswith(".localhost")):
        return
    if urlparse(bind_url).hostname in ("::1", "::", "localhost"):
        return  # the proxy listens there itself
    port = host.port or (443 if host.scheme == "https" else 80)
    reserved = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        reserved.bind(("::1", port))
    except OSError as error:
        reserved.close()
        raise RuntimeError(f"[::1]:{port} is taken ({error}): browsers would send {subdomain_host} and its "
                           "users' hosts there before 127.0.0.1. Find who listens there: ss -ltnp") from None
    _RESERVED.append(reserved)


def _redirect_hub_pages_to_hub_host(hub: JupyterHub) -> None:
    """After JupyterHub built its tornado application (portal/upstream/hub.py)."""
    if hub.subdomain_host:
        hold_ipv6_loopback_port(hub.subdomain_host, hub.bind_url)
        router = hub.tornado_application.wildcard_router
        rule = Rule(HubPageOnAnotherHost(hub.subdomain_host, hub.hub_prefix), ToTheHubsHost,
                    {"hub_host": hub.subdomain_host})
        router.rules.insert(0, router.process_rule(rule))


def configure_user_origins(c, subdomain_host: str | None) -> None:
    """Each user's own origin when portal.yaml's hub.subdomain_host is set; over https, the hub's and
    the servers' login cookies are host-locked too (__Host-: no subdomain can set one for the hub's
    host, no cookie tossing), which browsers accept only on secure connections."""
    if not subdomain_host:
        return
    c.JupyterHub.subdomain_host = subdomain_host
    c.JupyterHub.cookie_host_prefix_enabled = urlparse(subdomain_host).scheme == "https"
    upstream.after_init_tornado_application(_redirect_hub_pages_to_hub_host)
