"""Issue 27: users are strangers on the network. bob, a hostile neighbour with a shell on the login
node and jobs on both compute nodes, tries every way to alice's TCP services (a web app in her
session, the rendezvous store of her torchrun job): from the login node, from a job on her node,
from a job on the other node while she has a job there too, over IPv4 and IPv6, and after a burst
of SYNs. Every attempt is refused and her listener never sees him; alice herself gets through from
anywhere, and so do the hub and the proxy.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from democluster import network
from hubclient import active_jobs
from portal.admin import firewall
from test_jobs import jobs_api, stream
from test_network import job_as, partition_of

SECRET = "alice-only-7d1f"

# A dual-stack listener in alice's session (it outlives the cell), logging each peer it accepts.
ALICE_LISTENS = """
import pathlib, subprocess, sys, socket
log = pathlib.Path.home() / "listener.log"
log.write_text("")
server = '''
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 0)); s.listen({backlog})
print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept()
    print(peer[0], file=open(sys.argv[2], "a"))
    c.sendall(sys.argv[1].encode()); c.close()
'''
p = subprocess.Popen([sys.executable, "-c", server, "{secret}", str(log)], stdout=subprocess.PIPE, text=True,
                     stderr=subprocess.DEVNULL, start_new_session=True)
print(p.stdout.readline().strip())
"""

# bob's (or alice's) probe: optionally a burst of unanswered SYNs first, then one connection.
PROBE = """
import socket, sys, time
host, port, burst = {host!r}, {port}, {burst}
family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
held = []
for _ in range(burst):
    s = socket.socket(family); s.setblocking(False)
    try:
        s.connect(address)
    except (BlockingIOError, OSError):
        pass
    held.append(s)
if burst:
    time.sleep(1)
s = socket.socket(family); s.settimeout(10)
try:
    s.connect(address)
    print("ANSWERED", s.recv(100).decode())
except OSError as error:
    print("REFUSED", type(error).__name__, error)
"""


PROBE_ALL = """
import socket
for host, port in {targets!r}:
    s = socket.socket(); s.settimeout(10)
    try:
        s.connect((host, port))
        print("ANSWERED", host, port)
    except OSError as error:
        print("REFUSED", host, port, type(error).__name__)
"""


def run_as(user: str, code: str, node: str | None = None) -> str:
    """``code`` run by ``user``: in a shell of theirs on the login node, or in a job on ``node``."""
    if node is not None:
        return job_as(user, node, code).strip()
    result = subprocess.run(["runuser", "-u", user, "--", "/usr/bin/python3", "-c", code],
                            capture_output=True, text=True, timeout=120)
    return (result.stdout + result.stderr).strip()


def job_in_background(user: str, node: str, *command: str, **popen) -> subprocess.Popen:
    """A job of ``user`` on ``node`` running ``command`` while the test goes on."""
    return subprocess.Popen(["runuser", "-u", user, "--", "srun", f"--partition={partition_of(node)}", f"--nodelist={node}",
                             "--ntasks=1", "--cpus-per-task=1", "--mem=128M", "--time=5", *command],
                            **(popen or {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}))


def link_local(node: str) -> str:
    """The node's IPv6 link-local address on the node network (every IPv6 interface has one)."""
    shown = subprocess.run(["ip", "-n", network.namespace(node), "-6", "addr", "show", "dev", "eth0"],
                           capture_output=True, text=True).stdout
    addresses = [line.split()[1].split("/")[0] for line in shown.splitlines() if "inet6 fe80" in line]
    if not addresses:
        pytest.skip(f"IPv6 is off on {node}: nothing to try")
    return addresses[0]


@pytest.fixture
def alice_listening(alice):
    """alice's session on one node, a job of hers holding the other, and her listener's port."""
    alice.spawn({"profile": "gpu", "gpus": 1})
    home = active_jobs("alice")[0]["nodes"]
    other = next(n for n in network.node_names() if n != home)
    holder = job_in_background("alice", other, "sleep", "300")
    port = int(alice.run_code(ALICE_LISTENS.format(secret=SECRET, backlog=64), keep=True).strip())
    yield home, other, port
    holder.terminate()
    holder.wait(timeout=30)


def test_bob_reaches_alices_service_from_nowhere(alice_listening, bob):
    home, other, port = alice_listening
    # bob also holds a job on alice's other node: the node where she has a job is no opening.
    bob_holds = job_in_background("bob", other, "sleep", "300")
    try:
        address, v6 = network.address(home), link_local(home)
        attempts = {
            "login node, IPv4": (None, address, 0),
            "login node, IPv6 link-local": (None, f"{v6}%{network.BRIDGE}", 0),
            "login node, after a burst of 300 SYNs": (None, address, 300),
            f"job on {home} (her node), IPv4 loopback": (home, "127.0.0.1", 0),
            f"job on {home}, the node's address": (home, address, 0),
            f"job on {home}, IPv6 loopback": (home, "::1", 0),
            f"job on {home}, after a burst of 300 SYNs": (home, "127.0.0.1", 300),
            f"job on {other} (where alice has a job too), IPv4": (other, address, 0),
            f"job on {other}, IPv6 link-local": (other, f"{v6}%eth0", 0),
            f"job on {other}, after a burst of 300 SYNs": (other, address, 300),
        }
        for where, (node, host, burst) in attempts.items():
            answer = run_as("bob", PROBE.format(host=host, port=port, burst=burst), node)
            print(f"bob, {where} -> alice's port {port}: {answer}")
            assert "REFUSED" in answer and SECRET not in answer, (where, answer)
            assert "ConnectionRefused" in answer, f"{where}: refused at once, not a time-out: {answer}"

        # alice gets through from anywhere, right after bob's bursts (her listener's queue is free),
        # and the proxy reaches her session as before.
        for where, node, host in (("login node", None, address), (f"job on {other}", other, address),
                                  (f"job on {home}", home, "::1")):
            answer = run_as("alice", PROBE.format(host=host, port=port, burst=0), node)
            print(f"alice, {where} -> her port {port}: {answer}")
            assert answer == f"ANSWERED {SECRET}", (where, answer)
        # Her listener saw alice's three connections and none of bob's hundreds.
        assert len(Path("/home/alice/listener.log").read_text().split()) == 3
    finally:
        bob_holds.terminate()
        bob_holds.wait(timeout=30)


def test_the_firewall_is_on_every_host_with_the_cluster_named():
    cluster = sorted([network.LOGIN_ADDRESS, *(network.address(n) for n in network.node_names())])
    for where in (None, *(network.namespace(n) for n in network.node_names())):
        assert firewall.cluster_hosts(where) == cluster, where
        assert 5101 in firewall.users(where), where


TORCHRUN_WAITS = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} MASTER_PORT {os.environ['MASTER_PORT']}", flush=True)
time.sleep(25)
dist.barrier()
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
"""


def test_bob_cannot_open_alices_torchrun_rendezvous(alice, bob):
    alice.spawn({"profile": "cpu"})
    response = jobs_api(alice, "POST", json={"code": TORCHRUN_WAITS, "nodes": 2, "tasks_per_node": 1,
                                             "launcher": "torchrun", "profile": "cpu"})
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["job_id"]
    folder = Path(f"/home/alice/.dsportal/jobs/{job_id}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "MASTER_PORT" not in _read(folder / "rank-0.out"):
        time.sleep(0.5)
    rendezvous = next(line.rsplit(" ", 1)[1] for line in _read(folder / "batch.log").splitlines()
                      if "torchrun rendezvous at" in line)
    head, store_port = rendezvous.rsplit(":", 1)
    master_port = _read(folder / "rank-0.out").split("MASTER_PORT ")[1].split()[0]
    other = next(n for n in network.node_names() if n != head)
    print(f"alice's torchrun job {job_id}: rendezvous {rendezvous}, workers' store port {master_port}")
    # torch's stores take anything from anybody (a pickle included): bob must not get a connection.
    for port in (store_port, master_port):
        for node in (None, head, other):
            answer = run_as("bob", PROBE.format(host=head, port=port, burst=0), node)
            print(f"bob from {node or 'the login node'} -> {head}:{port}: {answer}")
            assert "ConnectionRefused" in answer, answer
    messages = stream(alice, job_id)
    assert messages[-1]["state"] == "COMPLETED", messages[-1]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_nobody_takes_anothers_folder_in_the_nodes_temporary_folder():
    """Slurm's PMIx plugin makes spmix_appdir_<uid>_<job>.<step> in the node's TmpFS: bob cannot
    make alice's next one first (her srun --mpi=pmix would fail with 'File exists')."""
    for node in network.node_names():
        tmpfs = Path(f"/var/lib/dsportal-demo/nodes/{node}/tmp")
        tried = subprocess.run(["runuser", "-u", "bob", "--", "mkdir", str(tmpfs / "spmix_appdir_5101_999999.0")],
                               capture_output=True, text=True)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, tried


def test_nobody_lists_the_nodes_job_folders():
    """slurmd's spool holds a folder per job, named after its id and owned by its user's group."""
    for node in network.node_names():
        tried = subprocess.run(["runuser", "-u", "bob", "--", "ls", f"/var/lib/dsportal-demo/slurm/spool/{node}"],
                               capture_output=True, text=True)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, tried


PESTER = """
import socket, time
end, held, attempts = time.monotonic() + {seconds}, [], 0
while time.monotonic() < end:
    s = socket.socket(); s.setblocking(False)
    try:
        s.connect(({host!r}, {port}))
    except OSError:
        pass
    held.append(s); attempts += 1; time.sleep(0.05)
print("attempts", attempts)
"""


def test_a_burst_of_refused_attempts_does_not_lock_alice_out_of_a_small_queue(alice, bob):
    """A listener with a queue of one half-open connection (like `nc -l`): bob's refused attempts
    must leave nothing in it, else alice's own connections would find it full."""
    alice.spawn({"profile": "gpu", "gpus": 1})
    home = active_jobs("alice")[0]["nodes"]
    other = next(n for n in network.node_names() if n != home)
    port = int(alice.run_code(ALICE_LISTENS.format(secret=SECRET, backlog=1), keep=True).strip())
    address = network.address(home)
    attack = job_in_background("bob", other, "/usr/bin/python3", "-c", PESTER.format(host=address, port=port, seconds=15),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(4)  # bob's job is running and trying
        answers = []
        for _ in range(6):
            answers.append(run_as("alice", PROBE.format(host=address, port=port, burst=0)))
            time.sleep(1)
    finally:
        print("bob:", attack.communicate(timeout=120)[0].strip())
    print(f"alice from the login node during bob's attempts on her queue-of-1 listener: {answers}")
    assert answers == [f"ANSWERED {SECRET}"] * 6, answers


# Each rank prints the TCP ports it listens on as alice (Open MPI's, Horovod's), then waits so
# that bob can try them, then all-reduces: the job must still come out right.
HOROVOD_LISTENS = """
import os, socket, time
import torch
import horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)  # every rank connected: its ports are open
mine = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        mine.add(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # the listing's own descriptor, closed by now
        pass
ports = set()
for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        # its own listeners: not the one of slurmstepd's (root's) PMIx server it inherits
        if fields[3] == "0A" and f"socket:[{fields[9]}]" in mine and int(fields[7]) == os.getuid():
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
print(f"rank {hvd.rank()} on {socket.gethostname()} listens on {sorted(ports)}", flush=True)
time.sleep(40)
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
print(f"rank {hvd.rank()} allreduce sum {total.item():.0f}", flush=True)
"""


def test_bob_cannot_open_alices_horovod_ranks(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 1})
    response = jobs_api(alice, "POST", json={"code": HOROVOD_LISTENS, "nodes": 2, "gpus_per_node": 1,
                                             "image": "horovod"})
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["job_id"]
    folder = Path(f"/home/alice/.dsportal/jobs/{job_id}")
    deadline = time.monotonic() + 120
    listening = {}
    while time.monotonic() < deadline and len(listening) < 2:
        for rank in (0, 1):
            for line in _read(folder / f"rank-{rank}.out").splitlines():
                if " listens on " in line:
                    node = line.split(" on ")[1].split()[0]
                    listening[rank] = (node, [int(p) for p in line.split("[")[1].rstrip("]").split(",") if p.strip()])
        time.sleep(0.5)
    print(f"alice's Horovod job {job_id}: {listening}")
    assert len(listening) == 2 and all(ports for _, ports in listening.values()), listening
    targets = [(network.address(node), port) for node, ports in listening.values() for port in ports]
    for where in (None, *network.node_names()):  # the login node, and a job of bob's on each node
        answers = run_as("bob", PROBE_ALL.format(targets=targets), where).splitlines()
        print(f"bob from {where or 'the login node'} -> alice's ranks {targets}: {answers}")
        assert len(answers) == len(targets) and all("ConnectionRefused" in a for a in answers), answers
    messages = stream(alice, job_id)
    assert messages[-1]["state"] == "COMPLETED", messages[-1]
    sums = [m["line"] for m in messages if m["type"] == "line" and "allreduce sum" in m["line"]]
    assert sorted(sums) == ["rank 0 allreduce sum 1", "rank 1 allreduce sum 1"], sums
