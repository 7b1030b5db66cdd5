"""Node settings of the demo that a cluster sets on each compute node: the firewall and private /proc."""

from __future__ import annotations

import subprocess

from .. import firewall
from ..check import HIDEPID_INVISIBLE, proc_hidepid
from .base import directory, say


def ensure_firewall() -> None:
    """The node firewall with the demo's accounts as portal users (see portal/cluster/firewall.py)."""
    uids = [int(u["uid"]) for u in directory()["users"]]
    try:
        if firewall.users() != sorted(uids):
            firewall.up(uids)
            say(f"node firewall: TCP services of the {len(uids)} demo users are their own")
    except firewall.FirewallUnavailable as error:
        say(f"node firewall unavailable ({error}): users' TCP ports stay reachable from other users' "
             "processes (sessions' /proxy/ and files are still private)")


def ensure_private_processes() -> None:
    """/proc with hidepid=invisible: a user sees only their own processes (with their command
    lines and working folders), as on a machine of their own; root (slurmd, the hub) sees all.
    A node setting, like the firewall; a cluster puts it in /etc/fstab (docs/admin.md)."""
    if proc_hidepid() in HIDEPID_INVISIBLE:
        return
    result = subprocess.run(["mount", "-o", "remount,hidepid=invisible", "/proc"], capture_output=True, text=True)
    if result.returncode == 0:
        say("/proc: users see only their own processes (hidepid=invisible)")
    else:
        say(f"/proc could not be remounted with hidepid=invisible ({(result.stderr or '').strip()}): "
             "users see each other's processes and command lines (files, ports and GPUs stay private)")
