"""configurable-http-proxy as a service of its own (hub.external_proxy): the command the hub would run
itself (JupyterHub's ConfigurableHTTPProxy.start), built from portal.yaml, for `dsportal hub proxy`,
which systemd's dsportal-proxy.service and the demo run. The hub then never starts or stops it, so a
hub restart drops no route (JupyterHub #5107). Its token is in hub.proxy_token_file, read by both."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

from portal.core import settings as settings_module
from portal.hub.routeowner import proxy_command

TOKEN_ENV = "CONFIGPROXY_AUTH_TOKEN"  # how configurable-http-proxy takes its token


class ProxyServiceError(RuntimeError):
    """Why the proxy cannot start as configured; the message says what to change."""


def read_token(path: Path) -> str:
    """The proxy's token: a file of the hub account's alone."""
    try:
        token = settings_module.read_secret(path, "the proxy token file")
    except settings_module.SettingsError as error:
        raise ProxyServiceError(str(error)) from None
    if len(token) < 32:
        raise ProxyServiceError(f"{path} holds no token (32 characters or more: openssl rand -hex 32 > {path})")
    return token


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or default_port


def proxy_argv(settings) -> list[str]:
    """What JupyterHub 6.1 would run (proxy.py's ConfigurableHTTPProxy.start) for these settings."""
    hub = settings.hub
    command = [shutil.which(hub.proxy_command[0]) or hub.proxy_command[0], *hub.proxy_command[1:]]
    public_ip, public_port = _host_port(hub.bind_url, 443 if hub.bind_url.startswith("https") else 80)
    api_ip, api_port = _host_port(hub.proxy_api_url, 8001)
    hub_host, hub_port = _host_port(hub.hub_connect_url or hub.hub_bind_url, 8081)
    scheme = "https" if hub.internal_ssl else "http"
    argv = [*(proxy_command(command) if hub.internal_ssl else command),
            "--ip", public_ip, "--port", str(public_port), "--api-ip", api_ip, "--api-port", str(api_port),
            "--error-target", f"{scheme}://{hub_host}:{hub_port}/hub/error", "--log-level", "info"]
    if hub.subdomain_host:
        argv.append("--host-routing")
    if hub.internal_ssl:
        certs = Path(hub.data_dir) / "internal-ssl"
        argv += ["--api-ssl-key", f"{certs}/proxy-api/proxy-api.key", "--api-ssl-cert", f"{certs}/proxy-api/proxy-api.crt",
                 "--api-ssl-ca", f"{certs}/proxy-api-ca_trust.crt", "--api-ssl-request-cert",
                 "--api-ssl-reject-unauthorized",
                 "--client-ssl-key", f"{certs}/proxy-client/proxy-client.key",
                 "--client-ssl-cert", f"{certs}/proxy-client/proxy-client.crt",
                 "--client-ssl-ca", f"{certs}/proxy-client-ca_trust.crt", "--client-ssl-request-cert",
                 "--client-ssl-reject-unauthorized"]
    return argv


def certificates_missing(settings) -> bool:
    """The proxy's internal-ssl certificates are made by the hub (`dsportal hub generate-certs`)."""
    return bool(settings.hub.internal_ssl) and not (
        Path(settings.hub.data_dir) / "internal-ssl" / "proxy-api" / "proxy-api.key").exists()


def exec_proxy(settings) -> None:
    """Become configurable-http-proxy (systemd and the demo then hold its pid), its token in its
    environment only: never on its command line."""
    if not settings.hub.proxy_token_file:
        raise ProxyServiceError("hub.proxy_token_file is not set: the proxy and the hub share the token it holds")
    if certificates_missing(settings):
        raise ProxyServiceError("the proxy's certificates are not made yet: run `dsportal hub generate-certs` "
                                "as the hub's account first")
    token = read_token(settings.hub.proxy_token_file)
    argv = proxy_argv(settings)
    os.execve(argv[0], argv, {**os.environ, TOKEN_ENV: token})
