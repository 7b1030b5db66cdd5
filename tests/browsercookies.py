"""The cookie policy of a browser for the demo's dotless hosts, shared by the tests' client
(hubclient.py) and the bench's load users (bench/locustfile.py, which runs in its own environment
without JupyterHub): the standard library only."""

from __future__ import annotations

from http.cookiejar import DefaultCookiePolicy
from urllib.parse import urlparse


class BrowserCookies(DefaultCookiePolicy):
    """Cookies as a browser keeps them for hosts without a dot (the demo's hub at localhost):
    http.cookiejar reads such a host as 'localhost.local', so the hub's session id cookie (Domain=
    localhost) would never go back to localhost itself; browsers send it there, and only there
    ('localhost' is a public suffix for them, not a domain its subdomains share)."""

    def _dotless(self, domain: str, request) -> bool | None:
        if "." in domain.lstrip("."):
            return None
        return domain.lstrip(".") == urlparse(request.get_full_url()).hostname

    def domain_return_ok(self, domain, request):
        ok = self._dotless(domain, request)
        return super().domain_return_ok(domain, request) if ok is None else ok

    def return_ok_domain(self, cookie, request):
        ok = self._dotless(cookie.domain, request)
        return super().return_ok_domain(cookie, request) if ok is None else ok
