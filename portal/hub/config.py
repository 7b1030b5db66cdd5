"""JupyterHub configuration built from portal.yaml; jupyterhub_config.py only calls :func:`configure`."""

from __future__ import annotations

import ipaddress
import os
import shutil
import sqlite3
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from sqlalchemy import event
from sqlalchemy.engine import Engine
from traitlets.log import get_logger

from portal.core import hubdatabase, settings as settings_module, templating
from portal.core.settingtraits import hand_down
from portal.hub import (
    databasedown,
    extend,
    loadshed,
    metrics,
    pacing,
    proxyservice,
    proxywatch,
    sessions,
    sharing,
    useroptions,
)
from portal.hub.auth import configure_ldap
from portal.hub.oidc import configure_oidc
from portal.hub.origins import configure_user_origins
from portal.hub.portreport import install_port_handler
from portal.hub.routeowner import check_sessions_by_their_certificate, proxy_command
from portal.upstream import hub as upstream, patchcheck
from spawner.gpuspawner import SlurmGPUSpawner
from spawner.partitionspawner import PartitionSpawner


def _proxy_command(command: list[str]) -> list[str]:
    found = shutil.which(command[0]) or command[0]
    return [found, *command[1:]]


def configure_internal_ssl(c, hub, data_dir: Path) -> None:
    """TLS between hub, proxy and sessions: JupyterHub's internal_ssl, its certificates under the
    hub's data folder. The hub's certificate also names the address the compute nodes reach it at;
    each session's names its node (spawner/gpuspawner.py) and its user: the proxy and the hub's checks
    talk to a user's route only if its certificate is that user's (portal/hub/routeowner.py)."""
    c.JupyterHub.internal_ssl = True
    check_sessions_by_their_certificate()
    c.ConfigurableHTTPProxy.command = proxy_command(_proxy_command(hub.proxy_command))
    c.JupyterHub.internal_certs_location = str(data_dir / "internal-ssl")
    names = {urlparse(url).hostname for url in (hub.hub_bind_url, hub.hub_connect_url) if url}
    c.JupyterHub.trusted_alt_names = sorted(f"{'IP' if _is_address(n) else 'DNS'}:{n}" for n in names
                                            if n and n not in ("0.0.0.0", "::"))
    c.ConfigurableHTTPProxy.api_url = urlunparse(urlparse(hub.proxy_api_url)._replace(scheme="https"))


def _sqlite_wal(dbapi_connection, _record) -> None:
    """The hub's SQLite in write-ahead-log mode, synced at checkpoints rather than at every commit.

    JupyterHub commits on nearly every request and spawn step, on its event loop; with SQLite's
    default rollback journal each commit waits for the disk (fsync of journal and database), and
    every API call waits behind them, most of all while a class starts. With WAL +
    synchronous=NORMAL a commit is an append, and the database stays consistent; a crash of the hub
    loses nothing, only a crash of the login node's operating system (or power) can lose the last
    commits."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


def configure_database(c, hub) -> None:
    """SQLite in data_dir, or the server database of hub.db_url, its password given to the driver
    (portal/core/hubdatabase.py). Upgrades run JupyterHub's own: for a server database before the hub
    opens it (hubdatabase.prepare), for SQLite by JupyterHub itself, which backs the file up first."""
    url = hubdatabase.hub_database_url(hub)
    try:
        c.JupyterHub.db_kwargs = hubdatabase.engine_arguments(url, hub.db_password_file)
        hubdatabase.prepare(url, hub.db_password_file)
    except hubdatabase.DatabaseError as error:
        raise SystemExit(f"dsportal: the hub's database: {error}") from None
    c.JupyterHub.db_url = url
    c.JupyterHub.upgrade_db = True
    if hubdatabase.is_sqlite(url) and not event.contains(Engine, "connect", _sqlite_wal):
        event.listen(Engine, "connect", _sqlite_wal)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def configure(c, settings=None) -> None:
    """Fill the traitlets config ``c`` from portal.yaml. Exits first, in one line, where a patch of
    upstream internals that guards users no longer fits the installed upstream (portal/upstream/hub.py)."""
    patchcheck.check_at_start(upstream.PATCHES, get_logger().warning)
    settings = settings or settings_module.load()
    for notice in settings.notices:
        get_logger().warning("portal.yaml: %s", notice)
    hub = settings.hub
    data_dir = Path(hub.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    c.JupyterHub.bind_url = hub.bind_url
    c.JupyterHub.hub_bind_url = hub.hub_bind_url
    if hub.hub_connect_url:
        c.JupyterHub.hub_connect_url = hub.hub_connect_url
    configure_database(c, hub)
    c.JupyterHub.cookie_secret_file = str(data_dir / "cookie_secret")
    c.JupyterHub.pid_file = str(data_dir / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(data_dir / "proxy.pid")
    c.ConfigurableHTTPProxy.command = _proxy_command(hub.proxy_command)
    c.ConfigurableHTTPProxy.api_url = hub.proxy_api_url
    if hub.external_proxy:  # its own service (proxyservice.py): the hub never starts or stops it
        c.ConfigurableHTTPProxy.should_start = False
        if hub.proxy_token_file:
            c.ConfigurableHTTPProxy.auth_token = proxyservice.read_token(hub.proxy_token_file)
        proxywatch.install()  # a proxy restarted by systemd gets every session's route back within seconds
    databasedown.install()  # the hub's database not answering: 503 in words, nobody logged out
    configure_user_origins(c, hub.subdomain_host)
    if hub.internal_ssl:
        configure_internal_ssl(c, hub, data_dir)
    c.JupyterHub.log_level = hub.log_level
    # Batch sessions outlive the hub: a hub restart must not cancel anybody's job.
    c.JupyterHub.cleanup_servers = False
    # Several sessions per user (a CPU one preparing data beside a GPU one training): JupyterHub's named
    # servers, each its own Slurm job; each profile caps how many of its sessions run (PartitionSpawner).
    c.JupyterHub.allow_named_servers = hub.session_names_per_user > 0
    c.JupyterHub.named_server_limit_per_user = hub.session_names_per_user
    c.JupyterHub.shutdown_on_logout = False
    c.JupyterHub.template_vars = {"portal_name": "dsportal", "session_ended": sessions.later(sessions.ended),
                                   "relaunch": sessions.Relaunch, "sessions": sessions.later(sessions.rows),
                                   "shared_with_me": ()}  # portal.yaml sharing: sharing.configure
    # The stock pages, plus session_ended and the sessions' rows.
    c.JupyterHub.template_paths = [str(templating.folder() / "hub")]

    if settings.oidc:  # one or the other (settings.Settings)
        configure_oidc(c, settings)
    else:
        configure_ldap(c, settings)
    c.Authenticator.admin_users = set(hub.admin_users)
    sharing.configure(c, settings)  # sessions shared with named colleagues, within portal.yaml's groups

    install_port_handler()
    # An overloaded hub answers page views and polling 429 + Retry-After, never a session's lifeline.
    if hub.shed_after_lag:
        loadshed.install(loadshed.LoopLag(threshold=hub.shed_after_lag))
    # Logins, tokens and starts one per turn of the loop: a class's burst never stalls everything else.
    pacing.install(pacing.Pacer())
    # More walltime for a running session: dsportal's service, which the hub starts and stops (extend.py).
    c.SlurmGPUSpawner.service_url = extend.configure(c, settings)
    c.JupyterHub.spawner_class = PartitionSpawner
    c.PartitionSpawner.profiles = list(settings.profiles)  # the models themselves: validated once, here
    c.PartitionSpawner.default_profile = settings.profile().name
    c.PartitionSpawner.ldap = settings.ldap  # the user's e-mail address, for Slurm's mail
    c.Spawner.start_timeout = hub.start_timeout
    # Starts beyond the limit: HTTP 429 with Retry-After, nothing submitted; the form and the REST API say
    # so in the portal's words (pacing.spawn_limit_words).
    c.JupyterHub.concurrent_spawn_limit = hub.concurrent_spawn_limit
    # Not a configurable trait of JupyterHub 6.1: its handlers read it from the tornado settings.
    c.JupyterHub.tornado_settings = {"spawn_throttle_retry_range": tuple(hub.spawn_retry_seconds)}
    # The REST API's options are judged by the portal's rules before JupyterHub stores them.
    useroptions.judge_before_storing()
    c.Spawner.http_timeout = hub.http_timeout
    c.Spawner.default_url = "/lab"
    # A user's ~/.jupyter (and ~/.local) config and extensions do not change what her server serves:
    # with it she could add pages that answer without login (portal/session/singleuser.py).
    c.Spawner.disable_user_config = True
    hand_down(c, settings, PartitionSpawner, SlurmGPUSpawner)  # every setting trait (portal/core/settingtraits.py)
    if any(p.idle_timeout or p.idle_timeout_without_gpu for p in settings.profiles):
        # The proxy counts every request as activity, an open tab's polling included; idle limits
        # go by the sessions' own reports instead (portal/session/usage/activity.py: what changes or computes).
        c.JupyterHub.last_activity_interval = 0
    c.SlurmGPUSpawner.images = list(settings.images)
    c.SlurmGPUSpawner.data_mounts = list(settings.data_mounts)
    c.SlurmGPUSpawner.templates = settings.templates.model_dump(mode="json")
    c.Spawner.poll_interval = hub.poll_interval
    # /hub/metrics: the portal's own metrics beside JupyterHub's (portal/hub/metrics.py)
    metrics.register_slurm(SlurmGPUSpawner.shared_client(c))
    # JupyterHub measures its event loop's lag (jupyterhub_event_loop_interval_seconds); a stall of
    # half a second, when every request waits, is worth a line in the log.
    c.PeriodicMetricsCollector.event_loop_interval_log_threshold = 0.5
    # The hub's own environment (SLURM_CONF included) reaches sbatch; the job gets the
    # user-side PATH from the batch script.
    os.environ.update(settings.slurm_env())
    c.Spawner.env_keep = ["LANG", "LC_ALL", "SLURM_CONF"]
