"""The demo's node network: each compute node is a host of its own on a private bridge.

A real GPU cluster is a login node (hub, proxy, slurmctld) and compute nodes that are other
machines. On this one machine each compute node is a network namespace (its own interfaces,
addresses, ports and firewall) and a UTS namespace (its own hostname), joined to the login node
(this machine's own namespace) by a bridge on a documentation range, 198.51.100.0/24 by default
(``DSPORTAL_DEMO_NETWORK=203.0.113`` picks another; one this machine already uses is refused):

    dsportal-login  198.51.100.1  on bridge dsportal0   hub, proxy, slurmctld, slurmdbd, slapd
    node1           198.51.100.11 in netns dsportal-node1 (eth0, a veth into the bridge)   slurmd
    node2           198.51.100.12 in netns dsportal-node2                                  slurmd

Hub -> session, session -> hub API, rank <-> rank and job -> slurmctld all cross the bridge.
Nothing is routed beyond it: the namespaces reach only each other and the login node. Files,
users and processes stay shared (one kernel, one file system), as on a cluster with shared
homes and one user directory.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

from democluster.base import DemoError, say

NODES = 3  # node1 and node2 (whole GPUs, CPUs), node3 (GPU shares): democluster/slurmdaemons.py
BRIDGE = "dsportal0"
# A documentation range (RFC 5737), never routed anywhere: TEST-NET-2 unless told otherwise.
PREFIX = os.environ.get("DSPORTAL_DEMO_NETWORK", "198.51.100")
LOGIN_ADDRESS = f"{PREFIX}.1"
LOGIN_NAME = "dsportal-login"  # the login node's name on the node network (portal.yaml: hub_bind_url)
HOSTS_MARK = "# dsportal demo node"


def node_names() -> list[str]:
    return [f"node{i}" for i in range(1, NODES + 1)]


def address(node: str) -> str:
    return LOGIN_ADDRESS if node == LOGIN_NAME else f"{PREFIX}.{10 + int(node.removeprefix('node'))}"


def namespace(node: str) -> str:
    return f"dsportal-{node}"


def in_node(node: str, argv: list[str]) -> list[str]:
    """argv run on ``node``: in its network namespace, with its own hostname. (nsenter, not `ip
    netns exec`, which remounts /sys and so hides the cgroup file systems slurmd confines jobs with.
    Not in a mount namespace of its own: job_container/tmpfs then cannot join a job's namespace.)"""
    return ["nsenter", f"--net=/run/netns/{namespace(node)}", "unshare", "--uts", "--", "sh", "-c",
            'hostname "$0" && exec "$@"', node, *argv]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise DemoError(f"ip {' '.join(args)} failed: {(result.stderr or result.stdout).strip()}")
    return result


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def _check_range_is_free() -> None:
    """Refuse a range this machine already routes (its own network, a VPN): the bridge would take
    over addresses that are somebody else's, the machine's gateway perhaps."""
    ours = ipaddress.ip_network(f"{PREFIX}.0/24")
    for line in _ip("-4", "route", "show").stdout.splitlines():
        words = line.split()
        if not words or words[0] == "default" or f"dev {BRIDGE}" in line:
            continue
        try:
            network = ipaddress.ip_network(words[0], strict=False)
        except ValueError:
            continue
        if network.overlaps(ours):
            raise DemoError(f"the demo's node network {ours} overlaps {network} of this machine ({line.strip()}); "
                            "choose a free range, e.g. DSPORTAL_DEMO_NETWORK=203.0.113 make demo")


def _in_place() -> bool:
    """The bridge and every node's namespace are there, with this range's addresses."""
    bridge = _ip("-4", "addr", "show", "dev", BRIDGE, check=False)
    if bridge.returncode != 0 or f"inet {LOGIN_ADDRESS}/24" not in bridge.stdout:
        return False
    present = _namespaces()
    return all(namespace(n) in present and f"inet {address(n)}/24" in
               _ip("-n", namespace(n), "-4", "addr", "show", "dev", "eth0", check=False).stdout for n in node_names())


def ensure_network() -> None:
    _check_range_is_free()
    if not _in_place():
        remove_network()  # whatever an interrupted run or another range left
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{LOGIN_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        say(f"bridge {BRIDGE}: login node {LOGIN_NAME} {LOGIN_ADDRESS}")
        for node in node_names():
            ns = namespace(node)
            _ip("netns", "add", ns)
            _ip("link", "add", f"dsp-{node}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"dsp-{node}", "master", BRIDGE, "up")
            _ip("-n", ns, "addr", "add", f"{address(node)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", LOGIN_ADDRESS)
            say(f"{node}: {address(node)} (network namespace {ns})")
    ensure_hosts()


def remove_network() -> None:
    """The bridge, the nodes' links and namespaces (a namespace lives on while a process of a
    node, a slurmd, is still in it: its link is deleted here all the same)."""
    present = _namespaces()
    for node in node_names():
        if _ip("link", "show", f"dsp-{node}", check=False).returncode == 0:
            _ip("link", "delete", f"dsp-{node}")
        if namespace(node) in present:
            _ip("netns", "delete", namespace(node))
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        _ip("link", "delete", BRIDGE)
        say(f"removed the node network ({BRIDGE}, {', '.join(namespace(n) for n in node_names())})")


def _without_demo_lines(text: str) -> list[str]:
    # Also the single line an earlier demo wrote: "127.0.0.1 node1 node2  # dsportal demo nodes".
    return [line for line in text.splitlines() if HOSTS_MARK not in line]


def ensure_hosts() -> None:
    """/etc/hosts names each node's address (what the hub's route and Slurm resolve)."""
    hosts = Path("/etc/hosts")
    text = hosts.read_text()
    wanted = [f"{LOGIN_ADDRESS} {LOGIN_NAME}  {HOSTS_MARK}"] + [f"{address(n)} {n}  {HOSTS_MARK}" for n in node_names()]
    kept = _without_demo_lines(text)
    if kept + wanted != text.splitlines():
        hosts.write_text("\n".join(kept + wanted) + "\n")
        say("/etc/hosts: " + ", ".join(f"{n} -> {address(n)}" for n in [LOGIN_NAME, *node_names()]))


def remove_hosts() -> None:
    hosts = Path("/etc/hosts")
    text = hosts.read_text()
    kept = _without_demo_lines(text)
    if kept != text.splitlines():
        hosts.write_text("\n".join(kept) + "\n")


def network_status() -> dict[str, bool]:
    present = _namespaces()
    return {f"network {n} ({address(n)})": namespace(n) in present for n in node_names()}
