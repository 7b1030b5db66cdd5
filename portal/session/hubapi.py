"""The session's requests to its hub's API: as the session (its token), over the hub's internal TLS."""

from __future__ import annotations

import json

from jupyterhub.services.auth import HubAuth
from jupyterhub.utils import url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse

from portal.core import sessionspec
from portal.upstream.session import hub_tls_context


async def post(path: str, body: dict, timeout: float = 60) -> HTTPResponse:
    """POST ``body`` to the hub's API at ``path`` (e.g. "batchspawner"); the response, whatever its code
    (599: the hub did not answer)."""
    return await request("POST", path, body, timeout)


async def service_post(path: str, body: dict, timeout: float = 60) -> HTTPResponse:
    """POST ``body`` to dsportal's JupyterHub service (portal.hub.extend) at ``path``, as the session,
    over the same TLS as to the hub (the service shows the hub's certificate); 599 where it did not
    answer, or where the hub gave this session no address of it (the caller checks :func:`has_service`
    first, to say so in words): never the hub's own API in its place."""
    base = sessionspec.current().service_url
    if not base:
        return HTTPResponse(HTTPRequest(path), 599, error=RuntimeError("no address of dsportal's service"))
    return await request("POST", path, body, timeout, base=base)


def has_service() -> bool:
    """Whether the hub told this session where dsportal's service is (a hub older than it did not)."""
    return bool(sessionspec.current().service_url)


async def request(method: str, path: str, body: dict | None = None, timeout: float = 60,
                  token: str | None = None, base: str | None = None) -> HTTPResponse:
    """``method`` on the hub's API at ``path`` (or at ``base``), as the session (or with ``token``: as
    its holder); the response, whatever its code (599: the hub did not answer)."""
    hub_auth = HubAuth()
    ssl = None
    if hub_auth.certfile and hub_auth.keyfile:
        ssl = hub_tls_context(hub_auth.keyfile, hub_auth.certfile, cafile=hub_auth.client_ca or None)
    request = HTTPRequest(
        url_path_join(base or hub_auth.api_url, path), method=method, ssl_options=ssl,
        headers={"Authorization": f"token {token or hub_auth.api_token}", "Content-Type": "application/json"},
        body=None if body is None else json.dumps(body), request_timeout=timeout,
    )
    try:
        return await AsyncHTTPClient().fetch(request, raise_error=False)
    except Exception as error:  # noqa: BLE001 - refused, reset, timed out, TLS: the hub did not answer
        # tornado raises these even with raise_error=False; callers tell the user instead of failing.
        return HTTPResponse(request, 599, error=error)


def message_of(response: HTTPResponse) -> str:
    """The hub's ``message`` (its errors and dsportal's answers carry one), else the body's text."""
    if response.code == 599:
        return str(response.error)
    try:
        return json.loads(response.body or b"{}").get("message") or ""
    except (ValueError, AttributeError):
        return (response.body or b"").decode(errors="replace").strip()
