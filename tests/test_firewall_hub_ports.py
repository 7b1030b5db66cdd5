"""The login node's firewall guards the hub's own ports (docs/how-to/deploy.md, section 6): the hub's API and
dsportal's service answer only the compute nodes and the login node itself, the proxy's API the login node
only. Tried on three network namespaces of their own (a login node, a compute node and a stranger, each
pair on a veth link of its own): nothing of this host's network, nor of the demo's, is touched."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from portal.admin import firewall

pytestmark = pytest.mark.quick

# In namespaces of their own: the addresses never leave them (the trial's range, 192.0.2.8/29, reused).
LOGIN_TO_COMPUTE, COMPUTE = "192.0.2.9", "192.0.2.10"
LOGIN_TO_STRANGER, STRANGER = "192.0.2.13", "192.0.2.14"
HUB_PORT, SERVICE_PORT, PROXY_API_PORT, OPEN_PORT = 8081, 8082, 8001, 8090


def test_the_rules_name_the_ports_and_the_compute_nodes():
    rules = firewall.ruleset([2001], ["10.1.0.0/16"], hub_ports=["8081,8082"], local_ports=[8001],
                             compute=["10.1.8.0/22", "10.1.12.5/32"])
    assert "set hub_ports { type inet_service; elements = { 8081, 8082 }; }" in rules
    assert "set local_ports { type inet_service; elements = { 8001 }; }" in rules
    assert "set compute { type ipv4_addr; flags interval; elements = { 10.1.12.5, 10.1.8.0/22 }; }" in rules
    # A compute node's table: the same sets, empty, which no packet matches.
    plain = firewall.ruleset([2001], ["10.1.0.0/16"])
    assert "set hub_ports { type inet_service; }" in plain and "set compute { type ipv4_addr; flags interval; }" in plain


@pytest.mark.parametrize("arguments, words", [
    ({"hub_ports": [8081]}, "name them (--compute"),
    ({"hub_ports": ["8081,80x"], "compute": ["10.1.0.0/16"]}, "'80x' is not a TCP port"),
    ({"hub_ports": [70000], "compute": ["10.1.0.0/16"]}, "'70000' is not a TCP port"),
    ({"hub_ports": [8081], "compute": ["node1"]}, "'node1' is not an IPv4 address or network"),
    ({"hub_ports": [8081], "local_ports": [8081], "compute": ["10.1.0.0/16"]}, "port(s) 8081 both for"),
])
def test_wrong_values_are_refused_in_words(arguments, words):
    with pytest.raises(firewall.FirewallUnavailable, match=re.escape(words)):
        firewall.ruleset([], ["10.1.0.0/16"], **arguments)


def _need_root_and_nft():
    if os.geteuid() != 0 or not shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin") or not shutil.which("ip"):
        pytest.skip("needs root, nft and ip (network namespaces of its own)")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


LISTEN = textwrap.dedent("""
    import socket, sys, time
    servers = []
    for port in map(int, sys.argv[1:]):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen(16); servers.append(s)
    print("listening", flush=True)
    time.sleep(60)
""")

CONNECT = textwrap.dedent("""
    import socket, sys
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
            print(target, "open")
        except ConnectionRefusedError:
            print(target, "refused")
        except OSError as error:
            print(target, type(error).__name__)
""")


def _reach(netns: str, *targets: str) -> dict[str, str]:
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", CONNECT, *targets],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(line.split() for line in out.splitlines())


def test_only_compute_nodes_and_the_login_node_reach_the_hubs_ports():
    _need_root_and_nft()
    tag = f"dsfw{os.getpid() % 100000}"
    login, compute, stranger = f"{tag}-login", f"{tag}-cn", f"{tag}-x"
    listener = None
    try:
        for netns in (login, compute, stranger):
            _ip("netns", "add", netns)
            _ip("-n", netns, "link", "set", "lo", "up")
        for peer, here, there in ((compute, LOGIN_TO_COMPUTE, COMPUTE), (stranger, LOGIN_TO_STRANGER, STRANGER)):
            a, b = f"{tag}{peer[-1]}a", f"{tag}{peer[-1]}b"
            _ip("link", "add", a, "netns", login, "type", "veth", "peer", "name", b, "netns", peer)
            _ip("-n", login, "addr", "add", f"{here}/30", "dev", a)
            _ip("-n", peer, "addr", "add", f"{there}/30", "dev", b)
            _ip("-n", login, "link", "set", a, "up")
            _ip("-n", peer, "link", "set", b, "up")
        # the login node's table as the unit writes it: every host of the /29 a cluster host, the compute node's
        # address alone where sessions run
        firewall.up([2001], ["192.0.2.8/29"], login, hub_ports=[f"{HUB_PORT},{SERVICE_PORT}"],
                    local_ports=[str(PROXY_API_PORT)], compute=[COMPUTE])
        assert firewall.guarded_ports(login) == {"hub_ports": [HUB_PORT, SERVICE_PORT], "local_ports": [PROXY_API_PORT],
                                                 "compute": [COMPUTE]}
        listener = subprocess.Popen(["ip", "netns", "exec", login, sys.executable, "-c", LISTEN, str(HUB_PORT),
                                     str(SERVICE_PORT), str(PROXY_API_PORT), str(OPEN_PORT)],
                                    stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "listening"
        ports = (HUB_PORT, SERVICE_PORT, PROXY_API_PORT, OPEN_PORT)
        started = time.monotonic()
        assert _reach(compute, *(f"{LOGIN_TO_COMPUTE}:{p}" for p in ports)) == {
            f"{LOGIN_TO_COMPUTE}:{HUB_PORT}": "open", f"{LOGIN_TO_COMPUTE}:{SERVICE_PORT}": "open",
            f"{LOGIN_TO_COMPUTE}:{PROXY_API_PORT}": "refused", f"{LOGIN_TO_COMPUTE}:{OPEN_PORT}": "open"}
        assert _reach(stranger, *(f"{LOGIN_TO_STRANGER}:{p}" for p in ports)) == {
            f"{LOGIN_TO_STRANGER}:{HUB_PORT}": "refused", f"{LOGIN_TO_STRANGER}:{SERVICE_PORT}": "refused",
            f"{LOGIN_TO_STRANGER}:{PROXY_API_PORT}": "refused", f"{LOGIN_TO_STRANGER}:{OPEN_PORT}": "open"}
        # the login node itself, over the loopback and at its own addresses (which the kernel also routes over lo)
        targets = [f"{host}:{p}" for host in ("127.0.0.1", LOGIN_TO_STRANGER) for p in ports]
        assert set(_reach(login, *targets).values()) == {"open"}
        assert time.monotonic() - started < 30  # refused at once (a reset), not timed out
    finally:
        if listener:
            listener.kill()
            listener.wait()
        for netns in (login, compute, stranger):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def test_check_warns_about_a_port_of_the_hub_the_firewall_leaves_open(monkeypatch):
    from types import SimpleNamespace

    from portal.admin import check

    settings = SimpleNamespace(hub=SimpleNamespace(hub_bind_url="https://login1:8081", service_port=8082,
                                                   proxy_api_url="http://127.0.0.1:8001"))
    monkeypatch.setattr(firewall, "guarded_ports", lambda netns=None: None)
    assert check.check_hub_ports(settings) is None  # no table: the node firewall's own line says so
    monkeypatch.setattr(firewall, "guarded_ports",
                        lambda netns=None: {"hub_ports": [8081], "local_ports": [], "compute": ["10.1.8.0/22"]})
    result = check.check_hub_ports(settings)
    assert result.warning and result.line().startswith("  [WARN] hub's ports: port(s) 8082 of this host answer every")
    # the proxy's API on the loopback answers nobody else anyway; on another address it must be guarded
    monkeypatch.setattr(firewall, "guarded_ports",
                        lambda netns=None: {"hub_ports": [8081, 8082], "local_ports": [], "compute": ["10.1.8.0/22"]})
    assert check.check_hub_ports(settings).line() == \
        "  [ok] hub's ports: 8081, 8082 answer only this host and 10.1.8.0/22"
    settings.hub.proxy_api_url = "http://10.1.0.5:8001"
    assert "port(s) 8001 of this host" in check.check_hub_ports(settings).line()
