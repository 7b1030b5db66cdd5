"""Node settings of the demo that a cluster sets on each node: the firewall and private /proc."""

from __future__ import annotations

import subprocess

from democluster.base import directory, say
from democluster.network import LOGIN_ADDRESS, address, namespace, node_names
from portal.admin import firewall
from portal.admin.check import HIDEPID_INVISIBLE, proc_hidepid


def ensure_firewall(config_path: str | None = None) -> None:
    """The node firewall on every host of the cluster, the login node included (users have shells
    there), with the demo's accounts as portal users (see portal/admin/firewall.py). On the login
    node it also guards the hub's ports as docs/how-to/deploy.md section 6 does: the hub's API and
    dsportal's service answer only the compute nodes and this host, a proxy API not on loopback only
    this host. Renewed on every `make demo`: one atomic nft transaction, and it holds no state worth
    keeping."""
    uids = sorted(int(u["uid"]) for u in directory()["users"])
    cluster = [LOGIN_ADDRESS, *(address(node) for node in node_names())]
    hub_ports, local_ports = _hub_ports(config_path)
    try:
        firewall.up(uids, cluster, hub_ports=hub_ports, local_ports=local_ports,
                    compute=[address(node) for node in node_names()])
        for node in node_names():
            firewall.up(uids, cluster, namespace(node))
        say(f"node firewall on the login node and {', '.join(node_names())}: TCP services of the {len(uids)} demo "
            "users answer only their own user, from any host")
    except firewall.FirewallUnavailable as error:
        say(f"node firewall unavailable ({error}): users' TCP ports stay reachable from other users' "
             "processes (sessions' /proxy/ and files are still private)")


def _hub_ports(config_path: str | None) -> tuple[list[int], list[int]]:
    """(the hub's ports for the sessions, the ports for this host only) of the demo's portal.yaml."""
    from portal.admin.check import hub_ports_of
    from portal.core import settings as settings_module

    for_sessions, local_only = hub_ports_of(settings_module.load(config_path).hub)
    return sorted(for_sessions), sorted(local_only)


def remove_firewall() -> None:
    """The login node's table (the machine's own); the nodes' go with their network namespaces."""
    try:
        firewall.down()
    except firewall.FirewallUnavailable as error:
        say(f"node firewall of the login node left in place: {error}")


def ensure_private_processes() -> None:
    """/proc with hidepid=invisible: a user sees only their own processes (with their command
    lines and working folders), as on a machine of their own; root (slurmd, the hub) sees all.
    A node setting, like the firewall; a cluster puts it in /etc/fstab (docs/how-to/deploy.md)."""
    if proc_hidepid() in HIDEPID_INVISIBLE:
        return
    result = subprocess.run(["mount", "-o", "remount,hidepid=invisible", "/proc"], capture_output=True, text=True)
    if result.returncode == 0:
        say("/proc: users see only their own processes (hidepid=invisible)")
    else:
        say(f"/proc could not be remounted with hidepid=invisible ({(result.stderr or '').strip()}): "
             "users see each other's processes and command lines (files, ports and GPUs stay private)")
