"""Node firewall: a portal user's TCP listeners answer that user alone, on any host of the cluster.

File permissions keep slices apart on disk and :mod:`portal.session.tool.portguard` keeps each session's
``/proxy/<port>/`` to its own user's services, but a plain ``curl node1:<port>`` from bob's kernel,
his shell on the login node or his job on another node would still reach alice's web app, her
torchrun rendezvous store or her ranks' NCCL ports. This nftables table, the same on every host of
the cluster (login nodes and compute nodes), stops that by carrying the connecting user with the
connection:

- every connection's first packet (SYN) is stamped with the uid of the socket that sends it: on the
  host's loopback (which also carries traffic to the host's own addresses) in the conntrack mark;
  towards another host of the cluster in the IPv4 header's identification field (16 bits, unused
  by TCP's atomic datagrams), which the receiving host copies into its conntrack mark. System
  accounts (uid below ``first_user_uid``: root's hub and proxy, slurmd, slurmstepd) send 0; a user
  this host does not know sends :data:`STRANGER`, which matches nobody;
- the answer (SYN-ACK) of a portal user's listener goes out only when the mark is 0 (a system
  service on this host or on a cluster host) or is the listener's own uid. Otherwise it is dropped
  and a reset goes back to the listener (it keeps no half-open connection, and never sees one);
  the client's retry (TCP's, a second later) and every attempt of that user at that port for
  :data:`REFUSED_FOR` are refused at the door with a reset: "connection refused" within a second.
  So a burst of refused attempts cannot fill the listener's queue (which would lock its owner
  out, or make the kernel answer with SYN cookies);
- an answer that belongs to no socket (a SYN cookie) to anybody but a system account is refused too;
- IPv6 from another host, and anything from a host outside the cluster, is a stranger's (over the
  loopback IPv6 is told apart like IPv4).

Tags are uids, so portal users' uids must be below 65535. A spoofed tag needs a raw socket
(CAP_NET_RAW), which users do not have; and every host rewrites its SYNs' tag anyway.

Root and system accounts (the hub, slurmd, slapd, munge) are not portal users: their services
stay reachable, and they reach every session. Portal users are named in the table's sets:
``dsportal firewall up UID...`` sets them, ``dsportal firewall add-user NAME`` adds one (from the
Slurm ``Prolog``, before a job starts on the node; see docs/how-to/deploy.md). A host must know the users
whose listeners it protects and whose connections it sends: compute nodes the users of their jobs,
login nodes every portal user. The demo cluster adds its accounts on every host.
What it cannot separate: UDP (no handshake to refuse), and services of non-portal accounts.

On the login node the same table also guards the hub's own ports (``dsportal firewall up ... --hub-ports
8081,8082 --local-ports 8001 --compute NODES``): the hub's API and dsportal's service (``--hub-ports``)
answer only the compute nodes, where the sessions run, and this host itself; the proxy's API
(``--local-ports``) only this host. A connection from anywhere else is refused with a reset. Compute nodes
leave the three empty.
"""

from __future__ import annotations

import ipaddress
import json
import pwd
import shutil
import subprocess
from collections.abc import Iterable

TABLE = "dsportal_isolation"
FIRST_USER_UID = 1000  # Debian's UID_MIN: below it, system accounts (the hub's included)
STRANGER = 65535  # the tag of a user this host does not know: the listener's own uid it never is
STRANGER_MARK = 0xFFFFFFFF
REFUSED_FOR = "10s"


class FirewallUnavailable(RuntimeError):
    """nft is missing or the kernel refused the table (no nf_tables, no CAP_NET_ADMIN)."""


def _checked(uids: Iterable[int]) -> list[int]:
    uids = sorted(set(int(u) for u in uids))
    too_large = [u for u in uids if u >= STRANGER]
    if too_large:
        raise FirewallUnavailable(f"uid(s) {', '.join(map(str, too_large))} do not fit the node firewall's 16-bit "
                                  f"tag (portal users' uids must be below {STRANGER})")
    return uids


def _user_elements(uids: list[int]) -> dict[str, str]:
    """The elements of each per-user set and map (tag = uid, mark = uid)."""
    def listed(items: list[str]) -> str:
        return f" elements = {{ {', '.join(items)} }};" if items else ""
    return {
        "users": listed([str(u) for u in uids]),
        "user_mark": listed([f"{u} : {u}" for u in uids]),
        "same_user": listed([f"{u} . {u}" for u in uids]),
        "user_tag": listed([f"{u} : {u}" for u in uids]),
        "tag_mark": listed([f"{u} : {u}" for u in uids]),
    }


def ports(values: Iterable[str | int]) -> list[int]:
    """TCP ports from ints or comma/space-separated strings ('8081,8082'); an empty string is none."""
    found: set[int] = set()
    for value in values:
        for item in str(value).replace(",", " ").split():
            if not item.isascii() or not item.isdigit() or not 1 <= int(item) <= 65535:
                raise FirewallUnavailable(f"{item!r} is not a TCP port (1-65535)")
            found.add(int(item))
    return sorted(found)


def addresses(values: Iterable[str]) -> list[str]:
    """IPv4 addresses or networks from strings, each possibly comma/space-separated ('10.1.8.0/22,10.1.12.5')."""
    found: set[str] = set()
    for value in values:
        for item in str(value).replace(",", " ").split():
            try:
                network = ipaddress.IPv4Network(item, strict=False)
            except ValueError:
                raise FirewallUnavailable(f"{item!r} is not an IPv4 address or network") from None
            found.add(str(network.network_address) if network.prefixlen == 32 else str(network))
    return sorted(found)


def ruleset(uids: Iterable[int], cluster: Iterable[str] = (), first_user_uid: int = FIRST_USER_UID,
            hub_ports: Iterable[int] = (), local_ports: Iterable[int] = (), compute: Iterable[str] = ()) -> str:
    """The table, replacing any earlier one atomically (nft -f applies a file as one transaction).
    ``cluster``: the IPv4 addresses or networks of every host that runs this table (login and
    compute nodes): their SYNs carry the sender's tag, and their system services reach users.
    The login node's: ``hub_ports`` (the hub's API, dsportal's service) answer only ``compute`` (the
    compute nodes' addresses or networks) and this host; ``local_ports`` (the proxy's API) this host only."""
    e = _user_elements(_checked(uids))
    cluster = sorted(set(cluster))
    cluster_elements = f" elements = {{ {', '.join(cluster)} }};" if cluster else ""
    hub_ports, local_ports, compute = ports(hub_ports), ports(local_ports), addresses(compute)
    if hub_ports and not compute:
        raise FirewallUnavailable("the hub's ports answer the compute nodes: name them (--compute ADDRESS[/BITS])")
    both = set(hub_ports) & set(local_ports)
    if both:
        raise FirewallUnavailable(f"port(s) {', '.join(map(str, sorted(both)))} both for the compute nodes "
                                  "(--hub-ports) and this host only (--local-ports)")

    def listed(items: list) -> str:
        return f" elements = {{ {', '.join(map(str, items))} }};" if items else ""

    syn = "tcp flags & (syn | ack) == syn"
    return f"""table inet {TABLE} {{}}
delete table inet {TABLE}
table inet {TABLE} {{
  set users {{ type uid;{e["users"]} }}
  map user_mark {{ type uid : mark;{e["user_mark"]} }}
  set same_user {{ type uid . mark;{e["same_user"]} }}
  map user_tag {{ typeof meta skuid : ip id;{e["user_tag"]} }}
  map tag_mark {{ typeof ip id : ct mark;{e["tag_mark"]} }}
  set cluster {{ type ipv4_addr; flags interval;{cluster_elements} }}
  set refused {{ typeof tcp dport . ct mark; flags timeout; timeout {REFUSED_FOR}; }}
  set hub_ports {{ type inet_service;{listed(hub_ports)} }}
  set local_ports {{ type inet_service;{listed(local_ports)} }}
  set compute {{ type ipv4_addr; flags interval;{listed(compute)} }}
  chain input {{
    type filter hook input priority 0; policy accept;
    iif != "lo" {syn} ct mark set {STRANGER_MARK:#x}
    iif != "lo" {syn} ip saddr @cluster ip id 0 ct mark set 0
    iif != "lo" {syn} ip saddr @cluster ct mark set ip id map @tag_mark
    {syn} ct mark != 0 tcp dport . ct mark @refused counter reject with tcp reset comment "refused by this port a moment ago"
    iif != "lo" {syn} tcp dport @local_ports counter reject with tcp reset comment "this host's own (the proxy's API)"
    iif != "lo" {syn} tcp dport @hub_ports ip saddr @compute accept comment "a session on a compute node"
    iif != "lo" {syn} tcp dport @hub_ports counter reject with tcp reset comment "hub API, service: compute nodes, this host"
  }}
  chain output {{
    type filter hook output priority 0; policy accept;
    oif "lo" {syn} ct mark set 0
    oif "lo" {syn} meta skuid >= {first_user_uid} ct mark set {STRANGER_MARK:#x}
    oif "lo" {syn} ct mark set meta skuid map @user_mark
    oif != "lo" {syn} ip daddr @cluster ip id set 0
    oif != "lo" {syn} ip daddr @cluster meta skuid >= {first_user_uid} ip id set {STRANGER}
    oif != "lo" {syn} ip daddr @cluster ip id set meta skuid map @user_tag
    tcp flags & (syn | ack) == (syn | ack) jump answer
  }}
  chain answer {{
    ct mark 0 accept comment "a system account (the hub, the proxy, slurmstepd) on this host or a cluster host"
    meta skuid . ct mark @same_user accept comment "the listener's own user"
    meta skuid != @users accept comment "a system service or a non-portal account answering"
    add @refused {{ tcp sport . ct mark }} comment "another user, a stranger, or a SYN cookie (no socket)"
    counter reject with tcp reset comment "the reset goes to the listener: it keeps no half-open connection"
  }}
}}
"""


def _nft(args: list[str], script: str | None = None, netns: str | None = None) -> str:
    """nft on this node, or in the network namespace ``netns`` (the demo's nodes)."""
    nft = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if nft is None:
        raise FirewallUnavailable("nft is not installed (Debian package nftables)")
    where = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    result = subprocess.run([*where, nft, *args], input=script, capture_output=True, text=True)
    if result.returncode != 0:
        raise FirewallUnavailable((result.stderr or result.stdout).strip() or f"nft exited {result.returncode}")
    return result.stdout


def up(uids: Iterable[int], cluster: Iterable[str] = (), netns: str | None = None, *,
       hub_ports: Iterable[int] = (), local_ports: Iterable[int] = (), compute: Iterable[str] = ()) -> None:
    _nft(["-f", "-"], ruleset(uids, cluster, hub_ports=hub_ports, local_ports=local_ports, compute=compute), netns)


def add_users(uids: Iterable[int], netns: str | None = None) -> None:
    uids = _checked(uids)
    if not uids:
        return
    _nft(["-f", "-"], "".join(
        f"add element inet {TABLE} users {{ {u} }}\n"
        f"add element inet {TABLE} user_mark {{ {u} : {u} }}\n"
        f"add element inet {TABLE} same_user {{ {u} . {u} }}\n"
        f"add element inet {TABLE} user_tag {{ {u} : {u} }}\n"
        f"add element inet {TABLE} tag_mark {{ {u} : {u} }}\n" for u in uids), netns)


def down(netns: str | None = None) -> None:
    try:
        _nft(["delete", "table", "inet", TABLE], netns=netns)
    except FirewallUnavailable as error:
        if "No such file" not in str(error):
            raise


def _set_elements(name: str, netns: str | None) -> list | None:
    try:
        out = _nft(["-j", "list", "set", "inet", TABLE, name], netns=netns)
    except FirewallUnavailable:
        return None
    for item in json.loads(out).get("nftables", []):
        if "set" in item:
            return item["set"].get("elem", [])
    return []


def users(netns: str | None = None) -> list[int] | None:
    """The portal users the table separates, or None when it is not in place."""
    elements = _set_elements("users", netns)
    return None if elements is None else sorted(int(e) for e in elements)


def cluster_hosts(netns: str | None = None) -> list[str] | None:
    """The addresses (or networks) the table takes for hosts of the cluster, None without a table."""
    elements = _set_elements("cluster", netns)
    if elements is None:
        return None
    return sorted(e if isinstance(e, str) else "{addr}/{len}".format(**e["prefix"]) for e in elements)


def guarded_ports(netns: str | None = None) -> dict[str, list] | None:
    """The hub's ports the table guards: {"hub_ports": [...], "local_ports": [...], "compute": [...]}, or None
    without a table (a table of dsportal 0.2.0 or older has no such sets: all three empty)."""
    if _set_elements("users", netns) is None:
        return None
    guarded: dict[str, list] = {}
    for name in ("hub_ports", "local_ports", "compute"):
        elements = _set_elements(name, netns) or []
        if name == "compute":
            guarded[name] = sorted(e if isinstance(e, str) else "{addr}/{len}".format(**e["prefix"]) for e in elements)
        else:
            guarded[name] = sorted(int(e) for e in elements)
    return guarded


def describe_guarded(guarded: dict[str, list] | None) -> str:
    """One line for `firewall status` and `dsportal check`."""
    if not guarded or not (guarded["hub_ports"] or guarded["local_ports"]):
        return "the hub's ports: none guarded (a compute node's table)"
    parts = []
    if guarded["hub_ports"]:
        parts.append(f"{', '.join(map(str, guarded['hub_ports']))} answer only this host and "
                     f"{', '.join(guarded['compute'])}")
    if guarded["local_ports"]:
        parts.append(f"{', '.join(map(str, guarded['local_ports']))} only this host")
    return "the hub's ports: " + "; ".join(parts)


def uid_of(name_or_uid: str) -> int:
    return int(name_or_uid) if str(name_or_uid).isascii() and str(name_or_uid).isdigit() else pwd.getpwnam(name_or_uid).pw_uid
