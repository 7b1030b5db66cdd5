"""Node firewall: on a shared node, a user's TCP connections reach only their own listeners.

File permissions keep slices apart on disk and :mod:`portal.session.portguard` keeps each session's
``/proxy/<port>/`` to its own user's services, but a plain ``curl 127.0.0.1:<port>`` from bob's
kernel would still reach alice's web app or TensorBoard. This nftables table stops that:

- a connection's first packet (SYN) on the node's loopback (which also carries traffic to the
  node's own addresses) is marked with the uid of the socket that sends it, if that uid is a
  portal user's;
- the listener's answer (SYN-ACK) is sent by a socket owned by the listener's user; if both are
  portal users and not the same one, the answer is turned into a reset, so the client gets
  "connection refused" at once, and the listener never sees a connection.

Between nodes the connecting socket's uid is not known on the listener's node, only where the
connection comes from. So a portal user's listener answers a connection from another host only
when that host is trusted (the login node: the hub and its proxy reach every session) or when the
set ``peers`` holds (the listener's uid . the source address): the nodes where that user's own jobs
run. Every other answer becomes a reset: bob's job on node2 gets "connection refused" from
alice's service on node1, while her own batch job on node2 and the ranks of her multi-node jobs
are answered. ``peers`` is kept by the Slurm controller's PrologSlurmctld/EpilogSlurmctld on every
node (the demo's: config/demo/firewall-peers.sh.j2; see docs/admin.md).

Root and system accounts (the hub, slurmd, slapd, munge) are not portal users: their services
stay reachable, and they reach every session.

Portal users are named in the table's sets: ``dsportal firewall up --uid ...`` sets them,
``dsportal firewall add-user NAME`` adds one (from the Slurm ``Prolog``, before a job starts on
the node; see docs/admin.md). The demo cluster adds its accounts, on every node.
"""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
from typing import Iterable

TABLE = "dsportal_isolation"


class FirewallUnavailable(RuntimeError):
    """nft is missing or the kernel refused the table (no nf_tables, no CAP_NET_ADMIN)."""


def _elements(uids: list[int], pair: bool = False, mapping: bool = False) -> str:
    if not uids:
        return ""
    items = [f"{u} . {u}" if pair else f"{u} : {u}" if mapping else str(u) for u in uids]
    return f" elements = {{ {', '.join(items)} }};"


def ruleset(uids: Iterable[int], trusted: Iterable[str] = ()) -> str:
    """The table, replacing any earlier one atomically (nft -f applies a file as one transaction).
    ``trusted``: addresses whose connections every listener answers (the login node)."""
    uids = sorted(set(int(u) for u in uids))
    trusted = sorted(set(trusted))
    trusted_elements = f" elements = {{ {', '.join(trusted)} }};" if trusted else ""
    return f"""table inet {TABLE} {{}}
delete table inet {TABLE}
table inet {TABLE} {{
  set users {{ type uid;{_elements(uids)} }}
  map user_mark {{ type uid : mark;{_elements(uids, mapping=True)} }}
  set same_user {{ type uid . mark;{_elements(uids, pair=True)} }}
  set trusted {{ type ipv4_addr;{trusted_elements} }}
  set peers {{ type uid . ipv4_addr; }}
  chain output {{
    type filter hook output priority 0; policy accept;
    oif "lo" tcp flags & (syn | ack) == syn ct mark set meta skuid map @user_mark
    oif "lo" tcp flags & (syn | ack) == (syn | ack) meta skuid @users ct mark != 0 meta skuid . ct mark != @same_user counter tcp flags set rst | ack comment "a portal user's listener answering another portal user"
    oif != "lo" tcp flags & (syn | ack) == (syn | ack) meta skuid @users ip daddr != @trusted meta skuid . ip daddr != @peers counter tcp flags set rst | ack comment "a portal user's listener answering a host where that user has no job"
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


def up(uids: Iterable[int], trusted: Iterable[str] = (), netns: str | None = None) -> None:
    _nft(["-f", "-"], ruleset(uids, trusted), netns)


def add_users(uids: Iterable[int]) -> None:
    uids = sorted(set(int(u) for u in uids))
    if not uids:
        return
    _nft(["-f", "-"], "".join(
        f"add element inet {TABLE} users {{ {u} }}\n"
        f"add element inet {TABLE} user_mark {{ {u} : {u} }}\n"
        f"add element inet {TABLE} same_user {{ {u} . {u} }}\n" for u in uids))


def down() -> None:
    try:
        _nft(["delete", "table", "inet", TABLE])
    except FirewallUnavailable as error:
        if "No such file" not in str(error):
            raise


def users(netns: str | None = None) -> list[int] | None:
    """The portal users the table separates, or None when it is not in place."""
    try:
        out = _nft(["-j", "list", "set", "inet", TABLE, "users"], netns=netns)
    except FirewallUnavailable:
        return None
    for item in json.loads(out).get("nftables", []):
        if "set" in item:
            return sorted(int(e) for e in item["set"].get("elem", []))
    return []


def uid_of(name_or_uid: str) -> int:
    return int(name_or_uid) if str(name_or_uid).isdigit() else pwd.getpwnam(name_or_uid).pw_uid
