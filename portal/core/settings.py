"""Load and validate ``portal.yaml``: the one file an admin edits.

Everything else (hub configuration, batch scripts, the demo cluster) is derived from the
typed model below. A bad file fails loudly, naming the key and why, at hub start and in
``dsportal check``.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
from importlib import resources
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from portal.core import defaults
from portal.core.userjson import json_kind

CONFIG_ENV = "DSPORTAL_CONFIG"
# The file of every production command (the hub, check, images, templates, usage) given neither --config nor
# $DSPORTAL_CONFIG. Only the demo (`make demo`: python -m democluster) falls back to the demo's own file (demo_config).
PRODUCTION_CONFIG = Path("/etc/dsportal/portal.yaml")
# "1": this machine runs the demo, and a production command may read the demo's settings (its file, its
# state folder). The Makefile exports it (make demo, make test, make check), as do the demo's hub and
# scripts/build-extras.sh; nothing else sets it.
DEMO_ENV = "DSPORTAL_DEMO"
# Where the demo keeps its state (democluster/base.py: $DSPORTAL_DEMO_DIR, this by default).
DEMO_STATE = Path("/var/lib/dsportal-demo")


def demo_config() -> Path:
    """The demo's portal.yaml: the repo's config/portal.yaml when run from a checkout, else the packaged copy."""
    checkout = Path(__file__).resolve().parents[2] / "config" / "portal.yaml"
    if checkout.exists():
        return checkout
    return packaged_demo_config()


def packaged_demo_config() -> Path:
    return Path(str(resources.files("dsportal_config") / "portal.yaml"))


def config_path(path: str | os.PathLike | None = None, *, demo: bool = False) -> Path:
    """The portal.yaml a command reads: ``path`` (--config), else $DSPORTAL_CONFIG, else
    /etc/dsportal/portal.yaml, or the demo's own file for the demo's commands (``demo``)."""
    if path:
        return Path(path)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return demo_config() if demo else PRODUCTION_CONFIG

# ASCII digits only ([0-9], not \d): "٢" (Arabic-Indic two) is a \d and int() takes it as 2.
_WALLTIME = re.compile(r"(?:([0-9]+)-)?([0-9]{1,2}):([0-9]{2}):([0-9]{2})")
_MEMORY = re.compile(r"([0-9]+)\s*([KMGT]?)B?", re.IGNORECASE)
_WHOLE = re.compile(r"-?[0-9]+")
# A value that may appear on an #SBATCH line or in a Slurm name: no blanks, quotes or shell syntax.
SLURM_TOKEN = re.compile(r"^[A-Za-z0-9_.:@%+=,/-]+$")


class SettingsError(ValueError):
    """portal.yaml is missing, unreadable or invalid; the message names each bad key."""


def ldap_server(server: str, port: int) -> tuple[str, int]:
    """(host, port) of "host", "host:port", "[IPv6]" or "[IPv6]:port" (``port`` where none is given)."""
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else port
    host, _, given = server.rpartition(":")
    return (host, int(given)) if host and given.isdigit() else (server, port)


def read_secret(path: Path, what: str) -> str:
    """The secret in a file portal.yaml names (``what``: 'the database password file'), refused unless
    it is a plain file only its owner (the hub's account) can read."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise SettingsError(f"{what} {path} is not a plain file")
        if info.st_mode & 0o077:
            raise SettingsError(f"{what} {path} may be read by other accounts (mode "
                                f"{stat.S_IMODE(info.st_mode):04o}): make it the hub account's alone (chmod 600 {path})")
        secret = Path(path).read_text().strip()
    except FileNotFoundError:
        raise SettingsError(f"{what} {path} does not exist") from None
    except PermissionError:
        raise SettingsError(f"{what} {path} cannot be read by this account (uid {os.geteuid()}): it must belong "
                            "to the hub's account") from None
    if not secret:
        raise SettingsError(f"{what} {path} is empty")
    return secret


def parse_walltime(text: str) -> int:
    """'D-HH:MM:SS' or 'HH:MM:SS' -> seconds."""
    match = _WALLTIME.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a walltime like 08:00:00 or 1-12:00:00")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    if minutes > 59 or seconds > 59:
        raise ValueError(f"{text!r}: minutes and seconds must be below 60")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def whole_number(text: str) -> int | None:
    """'12' -> 12, '-3' -> -3 (blanks around ignored); None for anything else. ASCII digits only:
    '²' passes str.isdigit() and then fails int(), and int() takes '٢' (Arabic-Indic) as 2."""
    text = text.strip() if isinstance(text, str) else ""
    return int(text) if _WHOLE.fullmatch(text) else None


def format_walltime(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def human_duration(seconds: float) -> str:
    """42 -> '42 s', 300 -> '5 min', 7500 -> '2 h 05 min', for messages to people."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"


def shown(value) -> str:
    """A value someone sent, quoted for a message and cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def described(value) -> str:
    """A value someone sent, for 'must be ..., not <this>': 'deepspeed', or a list (['x'])."""
    return shown(value) if isinstance(value, str) else f"{json_kind(value)} ({shown(value)})"


def parse_memory_mb(text: str | int) -> int:
    """'48G', '512M', '1T' or a bare number of megabytes -> megabytes."""
    match = _MEMORY.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a memory size like 48G or 4096M")
    number, unit = int(match.group(1)), match.group(2).upper()
    factor = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return int(number * factor)


DATABASE_BACKENDS = ("sqlite", "mysql", "mariadb", "postgresql")
# The drivers dsportal installs (pyproject.toml); psycopg is psycopg 3, SQLAlchemy 2.1's own default.
_DEFAULT_DRIVERS = {"mysql": "pymysql", "mariadb": "pymysql", "postgresql": "psycopg"}


def database_url(text: str) -> str:
    """A database URL the hub may use, checked: a known kind of database, no password in it, a
    server and a database name for a server database. mysql:// and mariadb:// get PyMySQL,
    postgresql:// gets psycopg."""
    text = text.strip()
    scheme, separator, rest = text.partition("://")
    backend, _, driver = scheme.partition("+")
    if not separator or backend not in DATABASE_BACKENDS:
        raise ValueError(f"{text!r} is not a database URL dsportal knows: it must start with one of "
                         f"{', '.join(b + '://' for b in DATABASE_BACKENDS)} (a driver may follow a +, "
                         "as in mysql+pymysql://)")
    if backend == "sqlite":
        return text
    url = urlparse(text)
    if url.password is not None:
        raise ValueError("the database URL holds a password: take it out, and put the password alone in "
                         "the file db_password_file names (mode 0600)")
    if not url.hostname or not url.username or not url.path.strip("/"):
        raise ValueError(f"{text!r} must name the account, the server and the database, as in "
                         f"{backend}://dsportal_hub@db.example.org/jupyterhub")
    if not driver and backend in _DEFAULT_DRIVERS:
        return f"{backend}+{_DEFAULT_DRIVERS[backend]}://{rest}"
    return text


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HubSettings(_Model):
    """JupyterHub and its proxy: where they listen, the account they run as, their database, and how
    many sessions start at once."""

    bind_url: str = Field("http://127.0.0.1:8000", description="Public URL users open.")
    hub_bind_url: str = Field(
        "http://127.0.0.1:8081", description="Where the hub's own API listens (jobs report to it)."
    )
    hub_connect_url: str | None = Field(
        None, description="How compute nodes reach the hub API, if not hub_bind_url."
    )
    proxy_api_url: str = Field(
        "http://127.0.0.1:8001", description="configurable-http-proxy's REST API (local only)."
    )
    service_port: int | None = Field(
        None, ge=1, le=65535, description="Port of dsportal's JupyterHub service (more walltime for a running "
        "session, portal/hub/extend.py), on hub_bind_url's host; the hub starts and stops it. Sessions reach it at "
        "hub_connect_url's host (or hub_bind_url's), as they reach the hub, over TLS with internal_ssl. Empty: "
        "the hub API's port + 1.")
    subdomain_host: str | None = Field(
        None, description="Each user's server on a web origin of its own (JupyterHub's subdomain_host): the "
        "hub's public scheme://host[:port], e.g. https://hub.example.org; alice's server is then "
        "https://alice.hub.example.org/user/alice/ (wildcard DNS, and with https a wildcard certificate). A page "
        "one user's server serves then never runs with another user's hub or server cookies. Over https the "
        "hub's cookies are also host-locked (__Host- prefix). Hub pages opened at any other host (bind_url) "
        "are sent here; the hub API answers on every host. Empty: one origin for everybody (trusted users only).")
    internal_ssl: bool = Field(
        False, description="TLS with mutual certificates between the hub, its proxy and every session "
        "(JupyterHub's internal_ssl): sessions on the compute nodes answer only the hub and proxy over "
        "https. Each session's key is written into its user's ~/.dsportal/certs (mode 600).")
    data_dir: Path = Field(Path("/var/lib/dsportal/hub"), description="Hub database and secrets.")
    account: str | None = Field(
        None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="The system account the hub and its proxy run as "
        "(e.g. dsportal-hub; the demo makes it). It owns data_dir and the hub's secrets, and acts as users only "
        "through the mediator (slurm.submit_as: sudo, `dsportal hub sudoers`). Empty: the hub runs as root.")
    admin_users: list[str] = Field([], description="JupyterHub's admins (account names): its admin page lists "
                                   "every user's sessions and may stop them.")
    start_timeout: int = Field(300, gt=0, description="Seconds a session may take to come up once Slurm runs its "
                               "job (the wait in the queue is the profile's queue_limit).")
    http_timeout: int = Field(60, gt=0, description="Seconds JupyterHub waits for a session's server to answer once "
                              "its job runs and its port is known (JupyterHub's Spawner.http_timeout); a hub that "
                              "starts waits as long for each session it finds running.")
    session_names_per_user: int = Field(
        8, ge=0, le=100, description="How many named sessions (beside the default one) a user may keep, running or "
        "not (JupyterHub's named_server_limit_per_user); how many may run at once is each profile's "
        "sessions_per_user. 0: named sessions are off, one session per user.")
    poll_interval: int = Field(
        2, gt=0, description="Seconds between the hub's checks that each running session's job still runs "
        "(JupyterHub's Spawner.poll_interval). Each check reads one look at the running sessions' job states taken "
        "at most once a slurm.squeue_interval for all sessions (Slurm 23.02 on; on 22.05 the shared squeue of "
        "every job), so a job ended outside the portal (scancel, node failure, walltime) is seen within a few "
        "seconds.",
    )
    concurrent_spawn_limit: int = Field(
        100, ge=0, description="How many sessions the hub starts at once (JupyterHub's concurrent_spawn_limit). A "
        "session counts from the moment it is asked for until it is ready, its time in Slurm's queue included, "
        "so a class waiting for cores counts too. A start beyond it is refused with HTTP 429 (Retry-After) and "
        "nothing is submitted for it: the spawn form says how many are starting and when to try again, the REST "
        "API in JupyterHub's words. 0: no limit.")
    spawn_retry_seconds: tuple[int, int] = Field(
        (30, 60), description="The range of seconds a start refused by concurrent_spawn_limit is told to wait "
        "before trying again (a random one from it, rounded in the message; Retry-After), so a refused class "
        "does not come back all at the same second.")
    shed_after_lag: float = Field(
        0.5, ge=0, description="Seconds late the hub's event loop may run a timer before the hub sheds reads that "
        "can wait (its pages and the REST API's users, groups and info: polling, page views) with HTTP 429, a "
        "Retry-After and a sentence, until it keeps time again. What keeps a session alive (port reports, "
        "activity, starts, stops and their progress, logins, sessions' token checks) is always served. 0: never shed.")
    proxy_command: list[str] = Field(
        ["configurable-http-proxy"], description="configurable-http-proxy's command and options. With internal_ssl it "
        "must be the bin script of the configurable-http-proxy package, which the portal runs through its proxy.js "
        "(a route reaches its own user's session only).")
    external_proxy: bool = Field(
        False, description="configurable-http-proxy runs as its own service (config/systemd/dsportal-proxy.service) "
        "and the hub never starts or stops it: restarting the hub drops no route (JupyterHub #5107). The hub reads the "
        "proxy's token from hub.proxy_token_file, as `dsportal hub proxy` (the proxy's service) does. False: the hub "
        "starts the proxy.")
    proxy_token_file: Path | None = Field(
        None, description="With external_proxy: the file (the hub account's, mode 0600) holding the token the hub and "
        "the proxy share; never on a command line. `openssl rand -hex 32 > FILE`.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="The hub's log level.")
    db_url: str | None = Field(
        None, description="The hub's database as an SQLAlchemy URL without a password, e.g. "
        "mysql+pymysql://dsportal_hub@db.example.org:3306/jupyterhub or postgresql://dsportal_hub@db/jupyterhub "
        "(mysql:// and mariadb:// without a driver use PyMySQL). Empty: SQLite in data_dir, for a "
        "single-machine trial.")
    db_password_file: Path | None = Field(
        None, description="The server database's password, alone in a file of the hub's account, mode 0600; "
        "given to the database driver when the hub connects, never put in the URL or the environment.")

    @field_validator("spawn_retry_seconds")
    @classmethod
    def _retry(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= value[0] <= value[1]:
            raise ValueError(f"must be [least, most] seconds, 1 <= least <= most, not {list(value)}")
        return value

    @field_validator("db_url")
    @classmethod
    def _db_url(cls, value: str | None) -> str | None:
        return database_url(value) if value and value.strip() else None

    @model_validator(mode="after")
    def _db_password(self) -> HubSettings:
        if self.db_url and not self.db_url.startswith("sqlite") and not self.db_password_file:
            raise ValueError("db_url names a database server: db_password_file must name the file that holds "
                             "its password (mode 0600)")
        if self.db_password_file and not self.db_password_file.is_absolute():
            raise ValueError(f"db_password_file {str(self.db_password_file)!r} must be an absolute path")
        return self

    @model_validator(mode="after")
    def _service_port(self) -> HubSettings:
        if self.service_port is None:
            self.service_port = (urlparse(self.hub_bind_url).port or 8081) + 1
        return self

    def service_urls(self) -> tuple[str, str]:
        """(where dsportal's service listens, where sessions reach it), scheme://host:port (portal/hub/extend.py)."""
        scheme, host = "https" if self.internal_ssl else "http", urlparse(self.hub_bind_url).hostname or "127.0.0.1"
        connect = urlparse(self.hub_connect_url or self.hub_bind_url).hostname or host
        return f"{scheme}://{host}:{self.service_port}", f"{scheme}://{connect}:{self.service_port}"

    @field_validator("subdomain_host")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        if not value:
            return None
        url = urlparse(value)
        if url.scheme not in ("http", "https") or not url.hostname or url.path.strip("/") or url.query:
            raise ValueError(f"{value!r} is not scheme://host[:port] (http or https, no path)")
        return f"{url.scheme}://{url.netloc}"


class SlurmSettings(_Model):
    """How the hub reaches Slurm: its client commands, the mediator it runs as users, how often it asks."""

    conf: Path | None = Field(None, description="slurm.conf for clients (sets SLURM_CONF). Empty, null or left out: "
                              "none, for a configless cluster: the commands read the copy sackd or slurmd keeps on this "
                              "host (/run/slurm/conf), or find slurmctld by DNS SRV.")

    @field_validator("conf", mode="before")
    @classmethod
    def _empty_conf_is_none(cls, value):
        return None if isinstance(value, str) and not value.strip() else value
    bin_dir: Path = Field(Path(defaults.SLURM_BIN_DIR), description="The folder of Slurm's client commands "
                          "(sbatch, squeue, sinfo, scancel, sacct), for the hub, the mediator and the admin's commands; "
                          "it is also put first on the PATH the portal's jobs get, so that their srun is the cluster's "
                          "release (a site's /opt/slurm/bin beside a distribution's /usr/bin).")
    submit_as: Literal["runuser", "sudo"] = Field(
        defaults.SUBMIT_AS, description="How the hub runs the mediator (submit, cancel, certificates, log tail) as "
        "a user: 'sudo' for an unprivileged hub (`dsportal hub sudoers` writes its one rule), 'runuser' for a hub "
        "run as root.")
    mediator: Path = Field(Path(defaults.MEDIATOR), description="The mediator, installed root-owned by "
                           "`dsportal hub install-mediator`.")
    people_uids: tuple[int, int] = Field(
        defaults.PEOPLE_UIDS, description="The uids of people's accounts, first and last: only these log in, and the "
        "mediator acts as these only (never root, system accounts, or package accounts such as slurm, whose jobs Slurm "
        "trusts). Debian's: [1000, 59999]; FreeIPA's: its ID range, e.g. [1234500000, 1234699999].")

    @field_validator("people_uids")
    @classmethod
    def _people(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= value[0] <= value[1]:
            raise ValueError(f"{list(value)} is not [first, last] with 1 <= first <= last: root (0) is never a person")
        return value
    squeue_interval: float = Field(
        defaults.SQUEUE_INTERVAL, gt=0, description="Seconds between the shared squeue calls while sessions start "
        "(one squeue for all sessions), and between the looks at the running sessions' job states that "
        "hub.poll_interval's checks read."
    )
    resources_interval: float = Field(
        defaults.RESOURCES_INTERVAL, gt=0, description="Seconds the spawn form's free/total resources (one sinfo) are cached."
    )


class LoginThrottleSettings(_Model):
    """Failed logins: a guesser gets slow, a neighbour cannot keep an account's owner out for long."""

    free_failures: int = Field(defaults.LOGIN_FREE_FAILURES, ge=1, description="Wrong passwords for one account from one address before "
                               "each further attempt from there must wait (a success clears them).")
    first_delay: float = Field(defaults.LOGIN_FIRST_DELAY, gt=0, description="Seconds the first wait lasts; it doubles with each failure.")
    max_delay: float = Field(defaults.LOGIN_MAX_DELAY, gt=0, description="The longest wait per account and address, in seconds.")
    account_failures: int = Field(defaults.LOGIN_ACCOUNT_FAILURES, ge=1,
                                  description="Wrong passwords for one account from any addresses within "
                                  "account_window that refuse it for account_lock seconds, except from addresses "
                                  "it logged in from before.")
    account_window: float = Field(defaults.LOGIN_ACCOUNT_WINDOW, gt=0, description="Seconds over which account_failures are counted.")
    account_lock: float = Field(defaults.LOGIN_ACCOUNT_LOCK, gt=0, description="Seconds an account is refused once account_failures "
                                "is reached (keep it short: anyone can trigger it).")


class LdapSettings(_Model):
    """Logins: the LDAP directory that checks passwords and groups, and how long it may take."""

    def tls_kwargs(self) -> dict:
        """ldap3.Tls's arguments: the server's certificate checked against ca_file (else the system's
        CAs), its name too (ldap3 checks it once the certificate is required)."""
        return {"validate": ssl.CERT_REQUIRED, "ca_certs_file": str(self.ca_file) if self.ca_file else None}

    server_address: str = Field("127.0.0.1", description="The LDAP server's host name or address.")
    server_port: int = Field(389, gt=0, lt=65536, description="The LDAP server's port.")
    tls_strategy: Literal["before_bind", "on_connect", "insecure"] = Field(
        "before_bind", description="before_bind: StartTLS before the password is sent; on_connect: LDAPS; "
        "insecure: no TLS, passwords in the clear (the demo's loopback only).")
    ca_file: Path | None = Field(
        None, description="PEM file of the CA certificates that sign the LDAP server's certificate; empty: the "
        "system's. With TLS the server's certificate and name are always checked: passwords go to no impostor.")
    failover_servers: list[str] = Field(
        default_factory=list, description="More LDAP servers (host, or host:port; the same TLS and CA), tried in "
        "order when server_address does not answer: replicas of the same directory.")
    bind_dn_template: list[str] = Field(
        default_factory=list, description="DN templates a login binds as, tried in order; {username} is replaced by "
        "the escaped account name, e.g. uid={username},ou=people,dc=example,dc=org. Empty: the user's entry is "
        "searched for instead (search_base), as Active Directory and FreeIPA need.")
    search_base: str = Field(
        "", description="Where a login searches for the user's entry (e.g. ou=people,dc=example,dc=org; Active "
        "Directory: cn=Users,dc=example,dc=org), binding first as search_bind_dn; then it binds as the DN found with "
        "the user's password. Empty: no search, bind_dn_template is used.")
    user_attribute: str = Field(
        "uid", pattern=r"^[A-Za-z][A-Za-z0-9-]*$", description="The attribute the search matches the name typed "
        "against, which is also her Unix account name: uid (OpenLDAP, FreeIPA) or sAMAccountName (Active Directory).")
    search_bind_dn: str = Field(
        "", description="The service account a login's search binds as (e.g. uid=dsportal,cn=sysaccounts,cn=etc,"
        "dc=example,dc=org; Active Directory: CN=dsportal,OU=Service Accounts,DC=example,DC=org). Empty: an "
        "anonymous search.")
    search_bind_password_file: Path | None = Field(
        None, description="The service account's password, alone in a file of the hub's account, mode 0600.")
    group_search_filter: str = Field(
        "", description="How a login finds whether the user is in an allowed group ({userdn}: her DN, {uid}: her "
        "name). Empty: ldapauthenticator's (member, uniqueMember or memberUid). Nested groups: Active Directory's "
        "(member:1.2.840.113556.1.4.1941:={userdn}).")

    @model_validator(mode="after")
    def _bind_or_search(self):
        if not self.bind_dn_template and not self.search_base:
            raise ValueError("set bind_dn_template (the DN a login binds as) or search_base (where the user's entry "
                             "is searched for)")
        if self.search_bind_dn and not self.search_bind_password_file:
            raise ValueError("search_bind_dn needs search_bind_password_file: the file holding its password")
        if self.search_bind_password_file and not self.search_bind_password_file.is_absolute():
            raise ValueError(f"search_bind_password_file {str(self.search_bind_password_file)!r} must be an "
                             "absolute path")
        if self.bind_dn_template and self.search_base:
            raise ValueError("set bind_dn_template (the DN a login binds as) or search_base (where the user's entry "
                             "is searched for), not both")
        for server in self.failover_servers:
            if not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?", server):
                raise ValueError(f"failover server {server!r} is not host, host:port, [IPv6] or [IPv6]:port")
        return self

    def servers(self) -> list[tuple[str, int]]:
        """(host, port) of server_address, then of each failover server (their port: server_port unless given)."""
        return [(self.server_address, self.server_port),
                *(ldap_server(server, self.server_port) for server in self.failover_servers)]

    def search_password(self) -> str | None:
        """The service account's password (read_secret: its file must be the hub account's alone); None without."""
        if not self.search_bind_password_file:
            return None
        return read_secret(self.search_bind_password_file, "ldap.search_bind_password_file")
    allowed_groups: list[str] = Field(
        default_factory=list, description="Group DNs whose members may log in (empty: any account)."
    )
    connect_timeout: float = Field(defaults.LDAP_CONNECT_TIMEOUT, gt=0, description="Seconds to open the connection to the LDAP server.")
    receive_timeout: float = Field(defaults.LDAP_RECEIVE_TIMEOUT, gt=0, description="Seconds to wait for each LDAP answer (bind, search).")
    login_timeout: float = Field(
        defaults.LDAP_LOGIN_TIMEOUT, gt=0, description="Seconds a whole login may take; past it the login page says the login service "
        "is not answering. Logins run off the hub's event loop, so a hung LDAP never stalls other users.",
    )
    throttle: LoginThrottleSettings = Field(
        default_factory=LoginThrottleSettings, description="Failed logins: refused for a while, without asking LDAP.")


# A plain-http OpenID issuer: this machine's loopback, by address (a name could resolve elsewhere first, ::1 before
# 127.0.0.1), at a port below 1024, which only root can listen on: no user on the login node can stand in for it.
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1")


class OidcSettings(_Model):
    """Logins through the site's single sign-on: an OpenID Connect provider (Keycloak, Shibboleth's OP,
    CILogon, Entra ID). People sign in on the provider's own pages; the portal never sees their password."""

    issuer: str = Field(
        description="The provider's issuer URL, exactly as its /.well-known/openid-configuration names it (Keycloak: "
        "https://sso.example.org/realms/REALM). https; plain http only on this machine's loopback address at a port "
        "below 1024 (the demo's).")
    client_id: str = Field(min_length=1, description="The portal's client at the provider (a confidential client).")
    client_secret_file: Path = Field(
        description="The client's secret, alone in a file of the hub's account, mode 0600.")
    ca_file: Path | None = Field(
        None, description="PEM file of the CA certificates that sign the provider's certificate; empty: the system's. "
        "The provider's certificate and name are always checked.")
    username_claim: str = Field(
        "preferred_username", pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$", description="The ID token's claim that holds "
        "the person's Unix account name on this cluster; that account must exist here (getent passwd).")
    groups_claim: str = Field(
        "groups", pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]*$", description="The ID token's claim listing her groups.")
    allowed_groups: list[str] = Field(
        min_length=1, description="Groups (exactly as the groups claim names them) whose members may log in; they "
        "must also have a Unix account here.")
    admin_groups: list[str] = Field(
        default_factory=list, description="Groups whose members are JupyterHub admins (besides hub.admin_users): "
        "groups only the site can put people in.")
    scopes: list[str] = Field(
        ["openid", "profile", "email", "groups"], description="Scopes asked for: openid, and those that put the "
        "username and groups claims into the ID token (Keycloak: its 'groups' client scope, or a mapper).")
    login_service: str = Field(
        "your institution", max_length=60, description="Who signs people in, as the login button names it: "
        "'Sign in with ...'.")
    timeout: float = Field(defaults.OIDC_TIMEOUT, gt=0, le=60, description="Seconds for each request to the "
                           "provider; past it the login page says the sign-in service is not answering.")
    clock_skew: float = Field(defaults.OIDC_CLOCK_SKEW, ge=0, le=600,
                              description="Seconds of clock difference allowed when checking an ID token's times.")

    @field_validator("issuer")
    @classmethod
    def _https(cls, value: str) -> str:
        url = urlparse(value)
        if url.scheme not in ("https", "http") or not url.hostname or url.query or url.fragment:
            raise ValueError(f"issuer {value!r} is not a URL like https://sso.example.org/realms/REALM")
        if url.scheme == "http" and (url.hostname not in LOOPBACK_ADDRESSES or not url.port or url.port >= 1024):
            raise ValueError(f"issuer {value!r} must be https (ID tokens and the client secret travel to it), or "
                             "http on 127.0.0.1 at a port below 1024, which only root can listen on")
        return value  # exactly as the provider names itself: its tokens' iss is compared with it

    @field_validator("client_secret_file", "ca_file")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"{str(value)!r} must be an absolute path")
        return value

    @field_validator("scopes")
    @classmethod
    def _openid(cls, value: list[str]) -> list[str]:
        if "openid" not in value:
            raise ValueError("scopes must include openid: without it the provider sends no ID token")
        return value

    def endpoint_allowed(self, url: str) -> bool:
        """An endpoint the provider's discovery names: https, or plain http only where the issuer itself is the
        loopback http one, on the same host (a discovery must not send the secret or the tokens in the clear)."""
        if url.startswith("https://"):
            return True
        return (url.startswith("http://") and self.issuer.startswith("http://")
                and urlparse(url).hostname == urlparse(self.issuer).hostname)

    def client_secret(self) -> str:
        """The client's secret (read_secret: its file must be the hub account's alone)."""
        return read_secret(self.client_secret_file, "oidc.client_secret_file")


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class JobSettings(_Model):
    """Multi-node jobs launched from sessions on this profile ("launch Horovod job")."""

    launcher: Literal["srun", "mpirun"] = Field(
        "srun", description="srun --mpi=<mpi_plugin> (Slurm starts the ranks) or mpirun inside the allocation.")
    mpi_plugin: str = Field("pmix", pattern=r"^[a-z0-9_]+$", description="srun --mpi= value: pmix, pmi2, ...")
    torchrun: bool = Field(True, description="Offer torch.distributed jobs (launcher 'torchrun'): srun starts one "
                           "torchrun per node, which starts one process per GPU (rendezvous c10d on the first node).")
    max_nodes: int | None = Field(None, gt=0, description="Most nodes one job may ask for (default: the partition's).")
    max_array_tasks: int = Field(64, gt=0, le=1000, description="Most runs one notebook job's grid of parameters may "
                                 "make (one Slurm array task each).")
    max_running: int = Field(4, gt=0, description="Runs of a notebook job's grid at once, where the job names no "
                             "max_running (Slurm's --array=...%K).")
    min_schedule_minutes: int = Field(60, ge=1, le=10080, description="Shortest time between two runs of a notebook "
                                      "run on a schedule (Slurm's scrontab); a schedule that would run more often is "
                                      "refused.")
    max_schedules: int = Field(10, ge=0, le=100, description="Most notebook schedules one user may keep on this "
                               "profile (0: none).")
    default_walltime: str = Field("01:00:00", description="Walltime (HH:MM:SS) of a job that names none; at most "
                                  "the profile's max_walltime.")
    container_binds: list[str] = Field(
        [], description="Host folders bound at the same path into every rank's container, e.g. what srun "
        "--mpi=pmix hands the ranks: Slurm's TmpFS where it is not /tmp (Apptainer binds /tmp itself).")
    env: dict[str, str] = Field(
        default_factory=lambda: {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "^lo,docker0",
                                 "HOROVOD_LOG_LEVEL": "warning"},
        description="Every rank's environment (NCCL_*, HOROVOD_*, OMPI_MCA_*, ...); a job may override each but "
        "those Slurm, MPI and torchrun set for each rank (SLURM_, SBATCH_, SRUN_, OMPI_, PMIX_, PMI_, RANK, ...).")

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not re.fullmatch(_ENV_NAME, key) or "\n" in str(value) or "\0" in str(value):
                raise ValueError(f"{key!r}: names are letters, digits and _; values are one line")
        return env

    @field_validator("container_binds")
    @classmethod
    def _binds(cls, binds: list[str]) -> list[str]:
        for path in binds:
            if not path.startswith("/") or ":" in path or "\n" in path:
                raise ValueError(f"{path!r}: an absolute path, bound at the same path")
        return binds

    @field_validator("default_walltime")
    @classmethod
    def _walltime(cls, value: str) -> str:
        if parse_walltime(value) <= 0:
            raise ValueError("must be positive")
        return value


TOOLS = ("terminal", "r", "vscode", "git")  # what a profile may offer besides notebooks (portal.session.tool.offer)


class Profile(_Model):
    """A partition as offered to users: what a session there may ask for."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="The profile's name in requests "
                      "(\"profile\": \"gpu\"), links and the jobs' comment (dsportal-profile=NAME).")
    partition: str = Field(pattern=SLURM_TOKEN.pattern, description="The Slurm partition its sessions and jobs run in.")
    display_name: str = Field(description="Its name on the spawn form.")
    description: str = Field("", description="A sentence under it on the spawn form.")
    gpu_choices: list[int] = Field([0, 1, 2, 4], description="The GPU counts a session may ask for (0: a session "
                                   "without GPUs).")
    default_gpus: int = Field(1, description="The GPU count the form starts from; one of gpu_choices.")
    gpu_shares: int = Field(0, ge=0, le=64, description="Shares of one GPU a session may ask for instead of whole "
                            "GPUs (\"gpus\": \"1/4\"): Slurm's shard GRES, of which slurm.conf and gres.conf declare "
                            "this many per GPU. Jobs sharing a GPU share its compute (time-sliced) and its memory "
                            "(not enforced). 0: whole GPUs only.")
    default_share: bool = Field(False, description="The form starts from one share (gpu_shares) rather than "
                                "default_gpus.")
    gpu_memory: str | None = Field(None, description="One GPU's memory (80G): the form tells users about how much "
                                   "of it a share is meant to use (gpu_memory / gpu_shares).")
    cpus_per_gpu: int = Field(8, gt=0, description="CPUs a session gets per GPU.")
    mem_per_gpu: str = Field("48G", description="Memory a session gets per GPU (48G, 4096M): the job's memory limit.")
    cpus_without_gpu: int = Field(4, gt=0, description="CPUs of a session without GPUs.")
    mem_without_gpu: str = Field("16G", description="Memory of a session without GPUs.")
    default_walltime: str = Field("08:00:00", description="The walltime (HH:MM:SS or D-HH:MM:SS) the form starts from.")
    max_walltime: str = Field("12:00:00", description="The longest walltime a session may ask for, and extend to "
                              "(never past the partition's or QoS's own limit in Slurm).")
    account: str | None = Field(None, pattern=SLURM_TOKEN.pattern, description="The Slurm account sessions and jobs "
                                "are charged to (sbatch --account).")
    qos: str | None = Field(None, pattern=SLURM_TOKEN.pattern, description="The Slurm QoS (sbatch --qos); its limits "
                            "live in Slurm (sacctmgr), and Slurm's refusals reach the user in words.")
    reservation: str | None = Field(None, pattern=SLURM_TOKEN.pattern, description="A Slurm reservation "
                                    "(sbatch --reservation), e.g. to hold a class's cores.")
    constraint: str | None = Field(None, pattern=r"^[A-Za-z0-9_.&|\[\]*()!-]+$", description="Node features "
                                   "(sbatch --constraint).")
    extra_sbatch: list[str] = Field(default_factory=list, description="Extra '#SBATCH' options.")
    groups: list[str] = Field(default_factory=list, description="LDAP groups allowed (empty: all).")
    jobs: JobSettings = Field(default_factory=JobSettings, description="Multi-node jobs launched from sessions.")
    idle_timeout: str | None = Field(
        None, description="A session holding GPUs that is not used for this long (HH:MM:SS) is stopped and its "
        "GPUs go back to the queue. In use: the browser talks to it, a kernel runs code (even silently), "
        "or one of its GPUs is busy. Empty: never.")
    idle_timeout_without_gpu: str | None = Field(None, description="The same for sessions without GPUs.")
    queue_limit: str = Field(
        "08:00:00", description="How long (HH:MM:SS) a session may wait in Slurm's queue before the portal "
        "withdraws it and tells the user; then hub.start_timeout more to come up once it runs.")
    tools: list[Literal[TOOLS]] = Field(
        list(TOOLS), description="What a session offers besides Python notebooks, each "
        "inside its job as the user: JupyterLab's terminal, an R kernel (Debian's r-cran-irkernel on the nodes), "
        "VS Code in the browser (code-server on a private unix socket, started from the launcher) and git in "
        "JupyterLab's sidebar (jupyterlab-git). One not installed on the nodes is left out; `dsportal check` "
        "says which are installed and working.")
    sessions_per_user: int = Field(
        1, ge=1, le=20, description="How many sessions of this profile one user may hold at once (JupyterHub's "
        "named servers: each is a Slurm job with its own slice; pending ones count). A start past it is refused "
        "in words, naming the sessions she has.")
    preemption: Literal["", "requeue", "cancel"] = Field(
        "", description="Whether Slurm may preempt the partition's jobs for higher-priority work, as its "
        "PreemptMode says (slurm.conf, with a GraceTime of at least 60 s and SlurmctldParameters="
        "preempt_send_user_signal): requeue or cancel; empty: never. The spawn form says so. A preempted "
        "session is warned in JupyterLab, which saves every open document, and its next page says what "
        "happened; with requeue its job is submitted requeueable and the portal starts the session again, by "
        "itself, when Slurm runs the job again.")

    @field_validator("gpu_choices")
    @classmethod
    def _choices(cls, value: list[int]) -> list[int]:
        if not value or any(n < 0 for n in value):
            raise ValueError("must list at least one GPU count, none negative")
        return sorted(set(value))

    @field_validator("mem_per_gpu", "mem_without_gpu")
    @classmethod
    def _memory(cls, value: str) -> str:
        if parse_memory_mb(value) <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("default_walltime", "max_walltime", "queue_limit")
    @classmethod
    def _walltime(cls, value: str) -> str:
        if parse_walltime(value) <= 0:
            raise ValueError("must be positive")
        return value

    @field_validator("idle_timeout", "idle_timeout_without_gpu")
    @classmethod
    def _idle(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if parse_walltime(value) <= 0:
            raise ValueError("must be positive (leave it out to never stop idle sessions)")
        return value

    def idle_limit(self, gpus: int) -> int | None:
        """Seconds a session of `gpus` GPUs (or GPU shares) may stay unused, or None."""
        value = self.idle_timeout if gpus else self.idle_timeout_without_gpu
        return parse_walltime(value) if value else None

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, lines: list[str]) -> list[str]:
        for line in lines:
            if not re.fullmatch(r"--[a-z-]+(=[A-Za-z0-9_.:@+=,/-]+)?", line):
                raise ValueError(f"{line!r} is not a single '--option=value' sbatch option")
        return lines

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.default_gpus not in self.gpu_choices:
            raise ValueError(f"default_gpus {self.default_gpus} is not one of gpu_choices {self.gpu_choices}")
        if self.default_share and not self.gpu_shares:
            raise ValueError("default_share needs gpu_shares (how many shares a GPU gives)")
        if self.gpu_memory is not None and parse_memory_mb(self.gpu_memory) <= 0:
            raise ValueError(f"gpu_memory {self.gpu_memory!r} must be a positive amount (80G, 40960M)")
        if parse_walltime(self.default_walltime) > parse_walltime(self.max_walltime):
            raise ValueError("default_walltime is longer than max_walltime")
        if parse_walltime(self.jobs.default_walltime) > parse_walltime(self.max_walltime):
            raise ValueError("jobs.default_walltime is longer than max_walltime")
        return self


class Image(_Model):
    """A container image users may pick for their kernels and their multi-node jobs' ranks."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="The image's name in the catalog, in job "
                      "requests (--image) and in a kernel.json's dsportal metadata.")
    display_name: str = Field(description="The kernel's name on JupyterLab's launcher.")
    source: str = Field(description="Where it is built from: docker://nvcr.io/nvidia/pytorch:24.05-py3, debootstrap:bookworm")
    path: Path = Field(description="The built image: a SIF file, or a sandbox folder (apptainer build --sandbox), "
                       "which Charliecloud runs too. SIF needs /dev/fuse open to users on the nodes (Apptainer "
                       "without setuid mounts it with squashfuse).")
    runtime: Literal["apptainer", "singularity", "charliecloud"] = Field(
        "apptainer", description="The container runtime that runs it: Apptainer (production and the demo), "
        "Singularity, or Charliecloud.")
    runtime_binary: str | None = Field(None, description="Full path of the runtime, if not on PATH.")
    python: str = Field("python3", description="The image's Python that runs ipykernel.")
    profiles: list[str] = Field(default_factory=list, description="Profiles that may use it (empty: all).")
    r: bool = Field(False, description="The image has R with IRkernel (a debootstrap: image: r-cran-irkernel in "
                    "packages): sessions whose profile's tools list r get an R kernel in it too.")
    packages: list[str] = Field(default_factory=list, description="Debian packages of a debootstrap: image.")
    wheels: list[str] = Field(
        default_factory=list,
        description="Python wheels (paths or globs) pip installs into a debootstrap: image, with their dependencies.")


class DataMount(_Model):
    """A host folder bound into every container kernel."""

    source: Path = Field(description="The folder on the nodes.")
    target: str = Field(pattern=r"^/[A-Za-z0-9_./-]*$", description="Where kernels see it.")
    read_only: bool = Field(True, description="Bound read-only.")


class SessionSettings(_Model):
    """What every session job runs and how it behaves."""

    environment: Path = Field(
        Path(defaults.ENVIRONMENT),
        description="World-readable Python prefix with jupyterhub-singleuser, JupyterLab, ipykernel.",
    )
    log_dir: str = Field(defaults.SESSION_LOG_DIR, description="Per-user job logs; {home}, {user}. "
                         "Created private (0700) whatever the home's mode.")
    workdir: str = Field(defaults.SESSION_WORKDIR, description="The session job's working folder (sbatch --chdir); "
                         "{home}, {user}.")
    umask: str = Field(defaults.SESSION_UMASK, pattern=r"^0?[0-7]{3}$",
                       description="umask of everything the session job runs (files 0600, folders 0700 by "
                       "default): other users sharing the node cannot read what a session writes.")
    default_profile: str | None = Field(None, description="The profile of a request that names none "
                                        "(empty: the first profile).")
    activity_interval: int = Field(
        defaults.ACTIVITY_INTERVAL, gt=0, description="At most how often a session in use reports it to the hub (busy kernels and "
        "busy GPUs count): the first use after a quiet spell is reported within seconds, a session with no new use "
        "reports nothing. The idle limits of profiles are measured from the last use reported.")
    gpu_busy_percent: int = Field(defaults.GPU_BUSY_PERCENT, ge=0, le=100,
                                  description="GPU utilisation from which a session's GPU counts as in use.")
    code_server: Path = Field(Path(defaults.CODE_SERVER), description="code-server on the nodes: VS Code in "
                              "the browser for profiles whose tools list vscode (scripts/install-code-server.sh).")
    r_repository: str = Field(defaults.R_REPOSITORY, pattern=r"^(https?|file)://\S+$",
                              description="The CRAN mirror an R kernel's install.packages() uses (a local "
                              "mirror where the nodes have no internet).")
    save_ahead: int = Field(
        defaults.SAVE_AHEAD, ge=30, le=3600, description="Seconds before a session's walltime ends that Slurm tells it "
        "(--signal): open JupyterLabs save every document, then the kernels are shut down cleanly.")


_FOLDER = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class TemplateSource(_Model):
    """A folder of template notebooks: the repo's notebooks/ or a course folder of an instructor."""

    name: str = Field(pattern=_FOLDER, description="Its folder name under templates/ in every session.")
    path: Path = Field(description="The folder (on a filesystem the compute nodes share), readable by users.")
    display_name: str = Field("", description="Its title in the templates folder's README.")
    description: str = Field("", description="A sentence about it there.")
    owner: str | None = Field(None, description="The instructor account that edits it (checked, and made "
                                                "owner by `make demo`); empty for admin-managed folders.")
    groups: list[str] = Field(default_factory=list, description="Unix/LDAP groups that see it (empty: everybody).")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value


class TemplateSettings(_Model):
    """Instructor template notebooks, shown read-only in every session."""

    folder: str = Field("templates", pattern=_FOLDER, description="Read-only folder in each user's home.")
    copies: str = Field("notebooks", pattern=_FOLDER,
                        description="Folder in the user's home where opening a template puts the user's copy.")
    sources: list[TemplateSource] = Field(default_factory=list, description="The template folders, one "
                                          "subfolder each of every session's templates folder.")

    @model_validator(mode="after")
    def _distinct(self) -> TemplateSettings:
        names = [s.name for s in self.sources]
        if len(names) != len(set(names)):
            raise ValueError(f"template source names must be unique, got {names}")
        if self.folder == self.copies:
            raise ValueError("folder and copies must differ: the templates folder is read-only")
        return self


# A Unix group name that also ends a JupyterHub role's name (portal.hub.sharing: it ends in a letter or digit).
_GROUP = r"^([a-z_][a-z0-9_-]{0,30})?[a-z0-9]$"


class SharingSettings(_Model):
    """Sharing a running session with named colleagues, on purpose (JupyterHub's sharing; live co-editing
    with jupyter-collaboration). Users are strangers otherwise."""

    groups: list[str] = Field(default_factory=list, description="Unix/LDAP groups within which sessions may "
                              "be shared: a member shares one of her sessions with members of a group she is "
                              "in (by name), never with anyone else. Empty: nobody shares.")

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.match(_GROUP, name):
                raise ValueError(f"{name!r} is not a Unix group name that dsportal can share within "
                                 "(a-z, 0-9, _ and -, at most 32, ending in a letter or digit)")
        if len(value) != len(set(value)):
            raise ValueError(f"group names must be unique, got {value}")
        return value


# Settings renamed so that each has one name in every layer (portal.yaml, the hub's traits, the docs):
# (old section, old key) -> (section, key).
RENAMED = {
    ("slurm", "poll_interval"): ("slurm", "squeue_interval"),
    ("slurm", "session_check_interval"): ("hub", "poll_interval"),
}


class Settings(_Model):
    """portal.yaml, the one file an admin edits: the hub, the spawn form, the batch scripts, the kernels
    and the job launcher are all derived from it."""

    hub: HubSettings = HubSettings()
    slurm: SlurmSettings = SlurmSettings()
    ldap: LdapSettings | None = Field(None, description="Logins checked against the site's LDAP directory (or oidc).")
    oidc: OidcSettings | None = Field(None, description="Logins through the site's OpenID Connect provider (or ldap).")
    session: SessionSettings = SessionSettings()
    profiles: list[Profile] = Field(min_length=1, description="The partitions as offered to users, at least one.")
    images: list[Image] = Field(default_factory=list, description="Container images for kernels and job ranks.")
    data_mounts: list[DataMount] = Field(default_factory=list, description="Bound into every container kernel.")
    templates: TemplateSettings = TemplateSettings()
    sharing: SharingSettings = SharingSettings()
    source: Path | None = Field(None, exclude=True)
    notices: list[str] = Field(default_factory=list, exclude=True)  # settings read under an old name

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, raw):
        """Settings under their old names are read under the new ones, each with a notice for the admin
        (the hub's log, `dsportal check`); a file that names both is refused."""
        if not isinstance(raw, dict):
            return raw
        if "notices" in raw:
            raise ValueError("notices is not a setting: the hub writes these itself")
        notices = []
        for (old_section, old_key), (section, key) in RENAMED.items():
            old = raw.get(old_section)
            if not isinstance(old, dict) or old_key not in old:
                continue
            new = raw.get(section)
            if new is not None and not isinstance(new, dict):
                continue  # a section that is not a mapping: refused by validation, in its own words
            if isinstance(new, dict) and key in new:
                raise ValueError(f"{old_section}.{old_key} is the old name of {section}.{key}: keep only {section}.{key}")
            raw = {**raw, old_section: {k: v for k, v in old.items() if k != old_key}}
            raw[section] = {**(raw.get(section) or {}), key: old[old_key]}
            notices.append(f"{old_section}.{old_key} is now called {section}.{key}: please rename it")
        return {**raw, "notices": notices} if notices else raw

    @model_validator(mode="after")
    def _one_way_to_log_in(self) -> Settings:
        if (self.ldap is None) == (self.oidc is None):
            raise ValueError("set ldap (logins checked against your directory) or oidc (sign-in through your "
                             "OpenID Connect provider): exactly one of them")
        return self

    @model_validator(mode="after")
    def _profiles(self) -> Settings:
        names = [p.name for p in self.profiles]
        if len(names) != len(set(names)):
            raise ValueError(f"profile names must be unique, got {names}")
        if self.session.default_profile and self.session.default_profile not in names:
            raise ValueError(f"session.default_profile {self.session.default_profile!r} is not a profile name")
        image_names = [i.name for i in self.images]
        if len(image_names) != len(set(image_names)):
            raise ValueError(f"image names must be unique, got {image_names}")
        for image in self.images:
            unknown = sorted(set(image.profiles) - set(names))
            if unknown:
                raise ValueError(f"image {image.name!r} names unknown profile(s) {unknown}")
        return self

    def profile(self, name: str | None = None) -> Profile:
        wanted = name or self.session.default_profile or self.profiles[0].name
        for profile in self.profiles:
            if profile.name == wanted:
                return profile
        raise KeyError(wanted)

    def slurm_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.slurm.conf)} if self.slurm.conf else {}


def _node_at(root, loc):
    """The YAML node (yaml.compose) at a pydantic error location, or the deepest one of it that exists
    (a missing key: its mapping; a whole-model error: the model's node)."""
    node = root
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    # A section or list goes on below its key (its own nodes carry the lines of what is
                    # in it); anything else is reported at its key's line.
                    child = value if isinstance(value, yaml.CollectionNode) and value.value else key
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
    return node


def _line(node) -> int | None:
    mark = getattr(node, "start_mark", None)
    return mark.line + 1 if mark is not None else None


def _describe(error: ValidationError, text: str) -> str:
    """One line per bad key: its line in the file, the key, what is wrong."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = None
    found = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        line = _line(_node_at(root, item["loc"])) if root is not None else None
        found.append((line or 0, f"  {f'line {line}: ' if line else ''}{key}: {item['msg']}"))
    return "\n".join(text for _, text in sorted(found, key=lambda pair: pair[0]))


def load(path: str | os.PathLike | None = None) -> Settings:
    """Read portal.yaml (argument, $DSPORTAL_CONFIG, or /etc/dsportal/portal.yaml: config_path)."""
    source = config_path(path)
    try:
        text = source.read_text()
    except FileNotFoundError:
        raise SettingsError(f"{source}: file not found; give --config or set {CONFIG_ENV}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"{source}: cannot read: {getattr(error, 'strerror', None) or error}") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        mark, context = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(error, "problem", None) or str(error)
        if context is not None and getattr(error, "context", None):
            what += f" ({error.context} at line {context.line + 1})"
        raise SettingsError(f"{source}: {where}not valid YAML: {what}") from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{source}: line 1: expected a mapping of sections at the top level")
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as error:
        raise SettingsError(f"{source} is invalid:\n{_describe(error, text)}") from None
    settings.source = source
    return settings


def _under(value: str, folder: Path) -> bool:
    """Whether a setting's text names ``folder`` or a path in it (also inside a longer value: --bind=...)."""
    return re.search(rf"(?:^|[\s=:,'\"]){re.escape(str(folder))}(?:$|[/\s:,'\"])", value) is not None


def demo_references(source: Path) -> list[str]:
    """What makes ``source`` the demo's settings rather than a site's: it is the demo's own file (in the
    checkout or packaged), or lies in the demo's state folder, or a value names a path in that folder.
    One line each, naming the line and the key; empty for a site's own file."""
    folders = [DEMO_STATE]
    if os.environ.get("DSPORTAL_DEMO_DIR"):
        folders.append(Path(os.environ["DSPORTAL_DEMO_DIR"]))
    found = []
    resolved = Path(os.path.realpath(source))
    demo_files = {Path(os.path.realpath(demo_config())), Path(os.path.realpath(packaged_demo_config()))}
    if resolved in demo_files:
        found.append("it is the demo's own portal.yaml")
    elif any(_under(str(resolved), folder) for folder in folders):
        found.append("it lies in the demo's state folder")
    try:
        root = yaml.compose(Path(source).read_text(), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return found

    seen = set()  # an alias repeats a node (once is enough), and may even point into itself

    def walk(node, keys):
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                yield from walk(value, [*keys, str(getattr(key, "value", "?"))])
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                yield from walk(item, [*keys, str(index)])
        elif isinstance(node, yaml.ScalarNode):
            yield node, keys

    for node, keys in walk(root, []):
        for folder in folders:
            if isinstance(node.value, str) and _under(node.value, folder):
                found.append(f"line {_line(node)}: {'.'.join(keys)}: {node.value} (in the demo's state folder)")
                break
    return found


def refuse_demo(settings: Settings) -> None:
    """A production command (the hub, check, images, templates, usage, install-mediator ...) refuses the demo's
    settings, naming the file and each key, unless this machine is the demo (DSPORTAL_DEMO=1)."""
    if os.environ.get(DEMO_ENV) == "1":
        return
    found = demo_references(settings.source)
    if found:
        raise SettingsError(
            f"{settings.source} holds the demo's settings, not this site's:\n"
            + "\n".join(f"  {line}" for line in found)
            + f"\nGive your own portal.yaml (--config FILE, or {CONFIG_ENV}; default {PRODUCTION_CONFIG}) "
            f"with your own paths; on the demo itself set {DEMO_ENV}=1 (make demo, make test and make check do)")
