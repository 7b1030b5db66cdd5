"""The session's calls to its hub made with tornado's HTTP client: jupyterhub.httpclient's ``fetch``.

jupyterhub-singleuser calls its hub (the version check, activity, every token and OAuth check)
through jupyterhub.httpclient, built on aiohttp. Importing aiohttp costs ~0.2 CPU-s of every
session's start, a fifth of it (its connector module, for one, loads the system's CA certificates
for a default TLS context at import, which calls to the hub never use: they carry the hub's
internal CA).
Tornado's client, loaded already as the server's own, makes the same calls.
upstream.call_the_hub_through_tornado puts this module in jupyterhub.httpclient's place before
jupyterhub-singleuser is imported; aiohttp then loads only if something else uses it.

Only what jupyterhub's session side passes and reads is supported (upstream.PATCHES fingerprints
those callers): ``method``, ``headers``, ``data``, ``ssl``, ``raise_for_status``; the response's
``status``, ``ok``, ``reason``, ``headers``, ``text()``, ``json()``, ``raise_for_status()``. Any other
option fails in words rather than being dropped. Redirects are not followed (the hub's API answers
without them; tornado would carry the session's token along to wherever one points).
"""

from __future__ import annotations

import json
import ssl as ssl_module

from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse

TIMEOUT = 60.0  # seconds for one call; aiohttp's default is 300, a hub that slow is down for the session
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class HubResponseError(Exception):
    """A call answered with an error status, for ``raise_for_status`` (as aiohttp's ClientResponseError)."""

    def __init__(self, response: Response):
        self.status, self.message, self.headers = response.status, response.reason, response.headers
        super().__init__(f"{response.status}, message={response.reason!r}, url={response.url!r}")


class Response:
    """The parts of aiohttp's ClientResponse that jupyterhub's session side reads."""

    def __init__(self, response: HTTPResponse):
        self._response = response
        self.status: int = response.code
        self.reason: str = response.reason or ""
        self.headers = response.headers  # case-insensitive, as aiohttp's
        self.url: str = response.effective_url

    @property
    def ok(self) -> bool:
        return self.status < 400

    async def read(self) -> bytes:
        return self._response.body or b""

    async def text(self, encoding: str | None = None) -> str:
        return (self._response.body or b"").decode(encoding or "utf-8", errors="replace")

    async def json(self, **_):
        return json.loads(self._response.body or b"null")

    def raise_for_status(self) -> None:
        if not self.ok:
            raise HubResponseError(self)

    def release(self) -> None:
        """Nothing to give back: the body is read already."""

    close = release

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *_) -> None:
        return None


async def fetch(url: str, *, method: str = "GET", raise_for_status: bool = True, headers=None, data=None,
                ssl: ssl_module.SSLContext | bool | None = None, **unsupported) -> Response:
    """Make an HTTP request to the hub, as jupyterhub.httpclient.fetch does. A request that gets no
    answer raises (the refused connection, the timeout), as aiohttp does."""
    if unsupported:
        raise TypeError(f"dsportal's hub client (portal.session.hubhttp) does not support {sorted(unsupported)}")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"dsportal's hub client calls the hub over http or https only, not {url.split(':')[0]}")
    method = method.upper()
    body = data.encode() if isinstance(data, str) else data
    if body is None and method in BODY_METHODS:
        body = b""
    request = HTTPRequest(url, method=method, headers=dict(headers or {}), body=body,
                          ssl_options=ssl if isinstance(ssl, ssl_module.SSLContext) else None,
                          validate_cert=ssl is not False, request_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                          follow_redirects=False)  # tornado would send the token on to wherever a redirect points
    # raise_error=False spares only answers with an error status: no answer at all still raises.
    response = Response(await AsyncHTTPClient().fetch(request, raise_error=False))
    if raise_for_status:
        response.raise_for_status()
    return response
