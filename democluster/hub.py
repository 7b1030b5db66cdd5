"""The demo's JupyterHub (with its configurable-http-proxy): started, restarted on new code, stopped.

With hub.account set (the demo's portal.yaml does), both run as that unprivileged system account,
which acts as users only through the root-owned mediator its one sudo rule allows; the account is a
Slurm operator, so that it sees every session job (slurm.conf's PrivateData hides them from users).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from democluster.accounting import ensure_slurm_operator
from democluster.base import DemoError, alive, paths, say, secret_file, stop_pid, wait_for
from portal.admin import hubaccount
from portal.core import settings as settings_module

# Where this Python (the portal's environment, as `make demo` runs it) has dsportal installed: the code the hub runs.
INSTALLED = Path(sysconfig.get_paths()["purelib"])


def hub_running(settings) -> bool:
    try:
        with urllib.request.urlopen(f"{settings.hub.bind_url.rstrip('/')}/hub/api", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def service_running(settings) -> bool:
    """dsportal's JupyterHub service (portal/hub/extend.py), which the hub starts after its API, listens."""
    url = urlparse(settings.hub.service_urls()[0])
    try:
        socket.create_connection((url.hostname, url.port), timeout=2).close()
        return True
    except OSError:
        return False


def hub_pidfile() -> Path:
    return paths().run / "dsportal-hub.pid"


def code_fingerprint() -> str:
    """Hash of the installed portal code and the config: a change means the hub must restart."""
    digest = hashlib.sha256()
    # The installed packages' folders, which the hub runs (not the checkout's, which the demo runs from).
    roots = [INSTALLED / "portal", INSTALLED / "spawner"]
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".j2", ".yaml", ".js") and path.is_file():  # .js: the proxy's wrapper
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_hub(config_path: Path | None = None) -> None:
    settings = settings_module.load(settings_module.config_path(config_path, demo=True))
    fingerprint = f"{code_fingerprint()}-{hashlib.sha256(settings.source.read_bytes()).hexdigest()[:8]}"
    stamp = paths().run / "dsportal-hub.code"
    if alive(hub_pidfile()) and hub_running(settings):
        if stamp.exists() and stamp.read_text() == fingerprint:
            return
        # New code or config: restart the hub. Sessions are Slurm jobs and survive it.
        say("portal code or config changed: restarting JupyterHub (running sessions are kept)")
        stop_hub()
    log_path = paths().log / "hub.log"
    hubaccount.install_mediator(settings)  # root's copy of the installed code's mediator
    command, env = hub_command(settings)
    if settings.hub.external_proxy:
        ensure_proxy(settings, command[:-1], env)
    with private_log(log_path) as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)
    hub_pidfile().write_text(str(process.pid))
    stamp.write_text(fingerprint)

    def up():
        if process.poll() is not None:
            raise DemoError(f"the hub exited ({process.returncode}); see {log_path}")
        return hub_running(settings) and service_running(settings)  # its API answers before its services start

    try:
        wait_for(up, "JupyterHub", timeout=60)
    except DemoError as error:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise DemoError(f"{error}\n{tail}") from None
    say(f"JupyterHub started (log {log_path})")


def hub_command(settings) -> tuple[list[str], dict[str, str]]:
    """`dsportal hub` and its environment, as the hub's account where portal.yaml names one."""
    command = [str(Path(sys.executable).parent / "dsportal"), "hub"]
    # The demo's hub (and its proxy) read the demo's settings on purpose: DSPORTAL_DEMO says so (settings.refuse_demo).
    env = {**os.environ, settings_module.CONFIG_ENV: str(settings.source), settings_module.DEMO_ENV: "1"}
    private_data_dir(Path(settings.hub.data_dir))
    if settings.hub.account:
        command, env = as_hub_account(settings, command, env)
    return command, env


def ensure_proxy_service(config_path: Path | None = None) -> None:
    """The proxy's service started again where it is not running, as systemd's Restart= does for
    dsportal-proxy.service; the hub is left as it is."""
    settings = settings_module.load(settings_module.config_path(config_path, demo=True))
    command, env = hub_command(settings)
    ensure_proxy(settings, command[:-1], env)


def as_hub_account(settings, command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The hub's command and environment as its account: which exists, owns the hub's data folder, may
    run the mediator as users (sudo), is a Slurm operator, and reads portal.yaml from a copy of its own
    (the checkout may be in a folder it cannot read)."""
    data_dir = Path(settings.hub.data_dir)
    account = hubaccount.ensure_system_account(settings.hub.account, data_dir)
    hubaccount.install_sudo_rule(account.pw_name, settings.slurm.mediator)
    ensure_slurm_operator(account.pw_name)
    for path in [data_dir, *data_dir.rglob("*")]:
        os.lchown(path, account.pw_uid, account.pw_gid)
    # Written by root into the account's own folder: a new file renamed over whatever the account left there (a link
    # it planted is replaced, never followed), then given to it.
    config = data_dir / "portal.yaml"
    fresh = data_dir / f".portal.yaml.{os.getpid()}"
    fresh.unlink(missing_ok=True)
    descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(settings.source.read_bytes())
        os.fchown(handle.fileno(), account.pw_uid, account.pw_gid)
    os.replace(fresh, config)
    proxy = alive(data_dir / "proxy.pid")
    if proxy and os.stat(f"/proc/{proxy}").st_uid != account.pw_uid:
        # A proxy an earlier root hub started: the hub starts its own, as its account, and adds every route.
        stop_pid(data_dir / "proxy.pid", "configurable-http-proxy (not the hub account's)")
    env = {**env, settings_module.CONFIG_ENV: str(config), "HOME": str(data_dir), "USER": account.pw_name,
           "LOGNAME": account.pw_name}
    return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--", *command], env


def private_log(path: Path):
    """The hub's log, opened for appending, readable by root only (an older one made so too):
    it names users, their jobs and what went wrong for them."""
    handle = open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab")
    os.fchmod(handle.fileno(), 0o600)
    return handle


def private_data_dir(path: Path) -> None:
    """The hub's data folder (database, cookie secret, internal CA) 0700, also if made before."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def stop_hub() -> None:
    """The hub; and the proxy where the hub started it (with hub.external_proxy the proxy is a service of
    its own, which a hub restart leaves alone: stop_proxy)."""
    stop_pid(hub_pidfile(), "JupyterHub")
    settings = _settings_or_none()
    if settings and not settings.hub.external_proxy:
        stop_pid(Path(settings.hub.data_dir) / "proxy.pid", "configurable-http-proxy")


def stop_proxy() -> None:
    settings = _settings_or_none()
    if settings:
        stop_pid(Path(settings.hub.data_dir) / "proxy.pid", "configurable-http-proxy")


def _settings_or_none():
    try:
        return settings_module.load(settings_module.config_path(demo=True))
    except settings_module.SettingsError:
        return None


def ensure_proxy(settings, dsportal: list[str], env: dict[str, str]) -> None:
    """configurable-http-proxy as its own service (hub.external_proxy), as systemd's dsportal-proxy.service
    runs it: `dsportal hub proxy`, as the hub's account (``dsportal``: the command up to `hub`). Its
    pid in hub.data_dir/proxy.pid, where JupyterHub keeps the one it starts; restarted only when its
    command changes (new proxy.js, new settings), never with the hub."""
    data_dir = Path(settings.hub.data_dir)
    owner = data_dir.stat()
    if settings.hub.proxy_token_file:
        secret_file(settings.hub.proxy_token_file, data_dir)
    if settings.hub.internal_ssl and not (data_dir / "internal-ssl/proxy-api/proxy-api.key").exists():
        # The hub makes the proxy's certificates; a proxy that starts first needs them made now.
        made = subprocess.run([*dsportal, "hub", "generate-certs"], env=env, capture_output=True, text=True, cwd="/")
        if made.returncode != 0:
            raise DemoError(f"dsportal hub generate-certs failed: {(made.stderr or made.stdout).strip()[-2000:]}")
    pidfile, stamp = data_dir / "proxy.pid", paths().run / "dsportal-proxy.code"
    fingerprint = hashlib.sha256(json.dumps(proxyservice_argv(settings)).encode()
                                 + (INSTALLED / "portal" / "hub" / "proxy.js").read_bytes()
                                 ).hexdigest()[:16]
    pid = alive(pidfile)
    if pid and stamp.exists() and stamp.read_text() == fingerprint and os.stat(f"/proc/{pid}").st_uid == owner.st_uid:
        return
    stop_pid(pidfile, "configurable-http-proxy")  # an older one, or one an earlier hub started
    with private_log(paths().log / "proxy.log") as log:
        process = subprocess.Popen([*dsportal, "hub", "proxy"], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd="/")
    pidfile.write_text(str(process.pid))
    stamp.write_text(fingerprint)

    def listening():
        if process.poll() is not None:
            raise DemoError(f"the proxy exited ({process.returncode}); see {paths().log / 'proxy.log'}")
        api = urlparse(settings.hub.proxy_api_url)
        try:
            socket.create_connection((api.hostname, api.port or 8001), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(listening, "configurable-http-proxy", timeout=30)
    say(f"configurable-http-proxy started as its own service (log {paths().log / 'proxy.log'})")


def proxyservice_argv(settings) -> list[str]:
    """What `dsportal hub proxy` runs (portal/hub/proxyservice.py), to notice a change of it."""
    return [settings.hub.bind_url, settings.hub.proxy_api_url, str(settings.hub.hub_connect_url or settings.hub.hub_bind_url),
            str(settings.hub.internal_ssl), str(settings.hub.subdomain_host), *settings.hub.proxy_command]
