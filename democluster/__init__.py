"""The embedded cluster on one machine: a login node (hub, proxy, slurmctld, slurmdbd, slapd) and
compute nodes that are network hosts of their own (slurmd each), with demo users.

Every daemon is real and started by this package; all of their state lives under one
directory (``$DSPORTAL_DEMO_DIR``, default /var/lib/dsportal-demo). ``up`` is idempotent:
what already runs is left alone. Outside that directory it touches only /etc/hosts (node
names), the node network (a bridge and a network namespace per node), the demo users' Unix
accounts, which must match LDAP for jobs to run as them, and exim4's settings (/etc/exim4).

The parts: base.py (state folder, pid files, config files), network.py (the nodes as hosts on a
private bridge), slurmdaemons.py (munge, GPUs, slurmctld, slurmd), accounting.py (MariaDB, slurmdbd,
associations), people.py (LDAP, Unix accounts), node.py (firewall, private /proc), mta.py (exim4:
Slurm's mail delivered locally), content.py (images, datasets, courses), hub.py (JupyterHub), hubdb.py
(the hub's database on the demo's MariaDB).
"""

from __future__ import annotations

import os
from pathlib import Path

from democluster import sso
from democluster.accounting import accounting_status, stop_accounting
from democluster.base import STATE, DemoError, alive, directory, paths, release_config, stop_pid
from democluster.content import ensure_courses, ensure_images
from democluster.hub import ensure_hub, ensure_proxy_service, hub_pidfile, stop_hub, stop_proxy
from democluster.mta import ensure_mta
from democluster.network import ensure_network, network_status, remove_hosts, remove_network
from democluster.node import ensure_firewall, ensure_private_processes, remove_firewall
from democluster.people import ensure_accounts, ensure_ldap, ldap_running, stop_ldap
from democluster.slurmdaemons import ensure_munge, ensure_slurm, slurm_status, stop_munge, stop_slurm
from democluster.sso import ensure_sso, sso_running, stop_sso
from portal.core.images import building_detail

__all__ = ["DemoError", "STATE", "banner", "release_config",
           "down", "ensure_hub", "ensure_proxy_service", "ensure_slurm", "paths", "status", "stop_hub",
           "stop_pid", "up"]


def up(config_path: Path | None = None, with_hub: bool = True, images_later: bool = False) -> None:
    """Everything of the demo, idempotent. ``images_later``: images not built yet are left to
    scripts/build-extras.sh, which make demo runs in the background (the launcher shows them "being
    built" meanwhile)."""
    if os.geteuid() != 0:
        raise DemoError("the demo cluster runs its daemons as root: run it as root (sudo make demo)")
    STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE, 0o755)
    (STATE / "run").mkdir(exist_ok=True)
    (STATE / "log").mkdir(exist_ok=True)
    ensure_network()
    ensure_munge()
    ensure_accounts()  # Unix accounts first: Slurm's associations name them
    ensure_mta()  # Slurm's mail (MailProg) delivered to the accounts' mailboxes
    ensure_slurm()
    ensure_firewall(config_path)
    ensure_private_processes()
    ensure_ldap()
    ensure_images(config_path, build=not images_later)
    ensure_courses(config_path)
    if with_hub:
        # JupyterHub's tables and alembic, slow to import, are loaded here only, not by every dsportal command
        # (the Slurm prolog's `dsportal firewall add-user` among them).
        from democluster.hubdb import ensure_hub_database

        ensure_hub_database(config_path)  # the hub's own database on the demo's MariaDB
        ensure_hub(config_path)
    ensure_sso(config_path)  # single sign-on, for a portal.yaml that tries oidc (its secret: the hub account's)


def stop_builder() -> None:
    """Ends make demo's background build (scripts/build-extras.sh, a process group of its own: its
    debootstrap, pip and compiler too), which must not go on building into a state make clean removes.
    A build in the foreground (make test's) is left alone: its group is make's."""
    pidfile = STATE / "run" / "extras.pid"
    pid = alive(pidfile)
    try:
        leads_its_group = bool(pid) and os.getpgid(pid) == pid
    except ProcessLookupError:
        leads_its_group = False
    if leads_its_group:
        stop_pid(pidfile, "the background build of images (make demo builds what is missing again)", group=True)


def down() -> None:
    stop_builder()
    stop_hub()
    stop_proxy()
    stop_slurm()
    stop_accounting()
    stop_ldap()
    stop_sso()
    stop_munge()
    remove_firewall()
    remove_network()
    remove_hosts()


def status() -> dict[str, bool]:
    return {**network_status(), **slurm_status(), **accounting_status(), "slapd": ldap_running(),
            "sso": sso_running(), "hub": bool(alive(hub_pidfile()))}


def banner(settings) -> str:
    data = directory()
    lines = [
        "",
        f"dsportal is up: open {settings.hub.bind_url}",
        "",
        "Demo accounts (LDAP):",
    ]
    for user in data["users"]:
        if not user.get("student"):
            lines.append(f"  {user['name']:<8} password {user['password']:<14} {user['role']}")
    for course in data.get("courses", []):
        count = sum(1 for user in data["users"] if user.get("course") == course["name"])  # make bench's: more
        last = f"{course['prefix']}{count:02d}"
        lines.append(f"  {course['prefix']}01 .. {last}: {count} students of {course['name']} "
                     f"(password <name>-demo)")
    building = {image.name: detail for image in settings.images if (detail := building_detail(image))}
    if building:
        lines += ["", "Being built in the background (log: make demo-log); their kernels and jobs wait until then:"]
        lines += [f"  {name}: {detail}" for name, detail in building.items()]
    lines += ["", f"Single sign-on (OpenID Connect), to try portal.yaml's oidc: {sso.ISSUER} (the same accounts; "
              "docs/how-to/sign-in-with-openid-connect.md)"] if sso_running() else []
    lines += ["", f"State: {STATE}   Stop: make stop   Logs: {STATE}/log/"]
    return "\n".join(lines)
