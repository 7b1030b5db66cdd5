"""Issue 21: the demo cluster as separate hosts. The login node (hub, proxy, slurmctld) and each
compute node are network hosts of their own on a private bridge; sessions are reached at their
node's address, and a user's services on a node answer only that user's own jobs.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from democluster import network
from hubclient import active_jobs
from test_isolation import ALICE_SERVES, SECRET

FETCH_AS_JOB = """
import socket, urllib.request
print("on", socket.gethostname())
try:
    print(urllib.request.urlopen("{url}", timeout=10).read().decode()[:200])
except Exception as error:
    print("REFUSED", type(error).__name__, error)
"""


def route_of(admin, user: str) -> str:
    routes = admin.api("GET", "/hub/api/proxy").json()
    # "/user/alice/", or with each user's own host (hub.subdomain_host) "alice.localhost/user/alice/"
    return next(route for spec, route in routes.items() if spec.endswith(f"/user/{user}/"))["target"]


def test_session_is_reached_at_its_node_on_the_node_network(admin, alice):
    alice.spawn({"profile": "gpu", "gpus": 1})
    node = active_jobs("alice")[0]["nodes"]
    target = urlparse(route_of(admin, "alice"))
    print(f"alice's session on {node}: route {target.geturl()}")
    # The proxy's route names the node; the node's name is its own address on the bridge.
    assert target.hostname == node
    assert socket.gethostbyname(node) == network.address(node) != "127.0.0.1"
    # The session runs on that host: its own hostname and address, and it answers through the hub.
    where = alice.run_code("import socket\nprint(socket.gethostname(), socket.gethostbyname(socket.gethostname()))")
    assert where.split() == [node, network.address(node)], where
    assert alice.api("GET", "/user/alice/api/status").status_code == 200
    # Nothing of the session listens on the login node: its port is on the node's namespace only.
    login_listeners = subprocess.run(["ss", "-Hltn", f"sport = :{target.port}"], capture_output=True, text=True).stdout
    node_listeners = subprocess.run(["ip", "netns", "exec", network.namespace(node), "ss", "-Hltn",
                                     f"sport = :{target.port}"], capture_output=True, text=True).stdout
    assert node_listeners.strip() and not login_listeners.strip(), (login_listeners, node_listeners)


def partition_of(node: str) -> str:
    """A partition holding ``node``: cpu, or the share node's own."""
    from democluster.slurmdaemons import SHARE_NODE

    return "share" if node == SHARE_NODE else "cpu"


def job_as(user: str, node: str, code: str) -> str:
    """A batch job of ``user`` on ``node`` (its output; --quiet: not srun's own "queued and waiting" notices)."""
    result = subprocess.run(
        ["runuser", "-u", user, "--", "srun", "--quiet", f"--partition={partition_of(node)}", f"--nodelist={node}", "--ntasks=1",
         "--cpus-per-task=1", "--mem=256M", "--time=5", "--chdir=/tmp", "/usr/bin/python3", "-c", code],
        capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr


def test_a_users_service_answers_her_jobs_on_any_node_and_nobody_elses(admin, alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 1})
    home = active_jobs("alice")[0]["nodes"]
    other = next(n for n in network.node_names() if n != home)
    port = int(alice.run_code(ALICE_SERVES.format(secret=SECRET), keep=True).strip())
    url = f"http://{home}:{port}/"

    # bob, from a job on the other node and from one on alice's node: refused at once.
    for node in (other, home):
        answer = job_as("bob", node, FETCH_AS_JOB.format(url=url))
        print(f"bob's job on {node} -> alice's {url}: {answer.strip()!r}")
        assert f"on {node}" in answer and "Connection refused" in answer and SECRET not in answer, answer
    # alice's own batch job on the other node reaches it over the bridge; so do the hub and proxy.
    answer = job_as("alice", other, FETCH_AS_JOB.format(url=url))
    print(f"alice's job on {other} -> her {url}: {answer.strip()!r}")
    assert f"on {other}" in answer and SECRET in answer, answer
    assert alice.api("GET", "/user/alice/api/status").status_code == 200
    assert SECRET in alice.api("GET", f"/user/alice/proxy/{port}/").text


def test_sessions_speak_tls_only_and_their_keys_are_their_users_alone(admin, alice):
    alice.spawn({"profile": "gpu", "gpus": 1})
    target = urlparse(route_of(admin, "alice"))
    assert target.scheme == "https", target.geturl()
    status = f"{target.hostname}:{target.port}/user/alice/api/status"
    # Plain HTTP gets no answer; HTTPS without a certificate of the hub's or its proxy's is refused.
    with pytest.raises(requests.exceptions.ConnectionError) as plain:
        requests.get(f"http://{status}", timeout=10)
    with pytest.raises(requests.exceptions.ConnectionError) as anonymous:  # SSLError is one too
        requests.get(f"https://{status}", timeout=10, verify=False)
    print(f"plain HTTP: {plain.value!r}\nTLS without a client certificate: {anonymous.value!r}")
    # Through the hub (the proxy holds its client certificate) the session answers.
    assert alice.api("GET", "/user/alice/api/status").status_code == 200
    # The session's key: alice's own file, mode 600 in a 700 folder; bob cannot read it.
    key = next(Path("/home/alice/.dsportal/certs").glob("*/session.key"))
    assert (pwd.getpwuid(key.stat().st_uid).pw_name, oct(key.stat().st_mode & 0o777)) == ("alice", "0o600")
    assert oct(os.stat(key.parent).st_mode & 0o777) == "0o700"
    tried = subprocess.run(["runuser", "-u", "bob", "--", "cat", str(key)], capture_output=True, text=True)
    assert tried.returncode != 0 and "Permission denied" in tried.stderr and "PRIVATE KEY" not in tried.stdout
