"""Issue 12: slices that share a node do not see each other.

alice and bob each hold a session on the same (demo) node, as strangers sharing a GPU node do.
Everything is real: their Slurm jobs, their Jupyter servers, kernels (host and container) and
terminals, alice's web server and TensorBoard, the hub's port-report API across a hub restart,
slapd frozen with SIGSTOP, and a session job cancelled behind the portal's back.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

import democluster as demo
from conftest import HUB, PASSWORDS, login, wait_no_jobs
from democluster import network
from hubclient import SLURM_BIN, SLURM_ENV, HubUser, active_jobs, slice_memory_limit
from portal.admin import firewall

SECRET = "alice-secret-4711"

ALICE_WRITES = f"""
import os, pathlib
home = pathlib.Path.home()
for path in (home / "notebooks/private.ipynb", home / "data/results.csv"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{SECRET}")
print(oct(os.stat(home).st_mode & 0o777), oct(os.stat(home / "data/results.csv").st_mode & 0o777),
      oct(os.stat(home / "data").st_mode & 0o777))
"""


def alice_paths() -> list[str]:
    home = "/home/alice"
    logs = sorted(f"{home}/.dsportal/logs/{n}" for n in os.listdir(f"{home}/.dsportal/logs"))
    jobs = sorted(f"{home}/.dsportal/jobs/{n}" for n in os.listdir(f"{home}/.dsportal/jobs"))
    return [home, f"{home}/notebooks/private.ipynb", f"{home}/data/results.csv", logs[-1],
            jobs[-1], f"{home}/.dsportal/template-copies.json", f"{home}/notebooks/dsportal/getting-started.ipynb"]


READ_ALL = """
import json, os
result = {}
for path in PATHS:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path).read()
        result[path] = "read"
    except OSError as error:
        result[path] = type(error).__name__
print(json.dumps(result))
"""


def read_as(user: HubUser, paths: list[str], kernel: str = "python3") -> dict:
    return json.loads(user.run_code(f"PATHS = {paths!r}\n" + READ_ALL, kernel=kernel, timeout=120))


@pytest.fixture
def two_sessions(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 1})
    bob.spawn({"profile": "gpu", "gpus": 1})
    nodes = {u: active_jobs(u)[0]["nodes"] for u in ("alice", "bob")}
    return alice, bob, nodes


def test_bob_cannot_read_alices_files_from_kernel_container_or_terminal(two_sessions):
    alice, bob, nodes = two_sessions
    # What alice's session writes is private whatever she does (umask 077), her home too.
    modes = alice.run_code(ALICE_WRITES).split()
    assert modes == ["0o700", "0o600", "0o700"], modes
    # A template copy (and its ledger) and a job folder of the launcher.
    opened = alice.api("POST", "/user/alice/dsportal/api/templates/open",
                       json={"path": "templates/dsportal/getting-started.ipynb"})
    assert opened.status_code in (200, 201), opened.text
    job = alice.api("POST", "/user/alice/dsportal/api/jobs",
                    json={"code": "print('mine')", "nodes": 1, "gpus_per_node": 0, "profile": "cpu"})
    assert job.status_code == 201, job.text
    paths = alice_paths()
    print(f"sessions on {nodes}; alice's paths: {paths}")

    assert set(read_as(alice, paths).values()) == {"read"}
    as_bob = read_as(bob, paths)
    assert set(as_bob.values()) == {"PermissionError"}, as_bob
    # In his Apptainer kernel (--containall) her home is not even there; in Charliecloud, which binds
    # the host's /home, the modes refuse him.
    in_container = read_as(bob, paths, kernel="dsportal-debian-python")
    assert set(in_container.values()) == {"FileNotFoundError"}, in_container
    in_charliecloud = read_as(bob, paths, kernel="dsportal-debian-python-ch")
    assert set(in_charliecloud.values()) == {"PermissionError"}, in_charliecloud
    terminal = bob.run_in_terminal(f"cat {' '.join(paths[1:3])}; ls {paths[0]}")
    assert SECRET not in terminal and terminal.count("Permission denied") == 3, terminal
    assert SECRET in alice.run_in_terminal(f"cat {paths[1]}")
    # The portal's own folders are private even where a home is left open.
    os.chmod("/home/alice", 0o755)
    try:
        again = read_as(bob, paths[1:])
        assert set(again.values()) == {"PermissionError"}, again
    finally:
        os.chmod("/home/alice", 0o700)


# The memory limit of the calling process: the smallest of its cgroup's and its parents' (the
# job's and the step's cgroups hold it; cgroup v1 or v2).
MEMORY_LIMIT = """
import os
limits = []
for line in open("/proc/self/cgroup").read().splitlines():
    _, controllers, path = line.split(":", 2)
    if controllers in ("memory", ""):
        root = "/sys/fs/cgroup/memory" if controllers == "memory" else "/sys/fs/cgroup"
        while True:
            for name in ("memory.limit_in_bytes", "memory.max"):
                try:
                    value = open(f"{root}{path}/{name}").read().strip()
                    if value != "max":
                        limits.append(int(value))
                except OSError:
                    pass
            if path == "/":
                break
            path = os.path.dirname(path)
memory_limit = min(limits, default=None)
"""

CONFINEMENT = MEMORY_LIMIT + """
import errno, glob, json, os, pwd, tempfile
node = os.environ["SLURMD_NODENAME"]
opened = {}
for device in sorted(glob.glob(f"/var/lib/dsportal-demo/gpus/{node}-gpu*")):
    index = int(device.rsplit("gpu", 1)[1])
    try:  # no driver behind the demo's GPUs: ENXIO means the device cgroup let the open through
        os.close(os.open(device, os.O_RDONLY))
        opened[index] = "allowed"
    except OSError as error:
        opened[index] = "allowed" if error.errno in (errno.ENXIO, errno.ENODEV) else errno.errorcode[error.errno]
tmp = tempfile.gettempdir()
me = pwd.getpwuid(os.getuid()).pw_name
for folder in ("/tmp", "/dev/shm"):  # left for a neighbour to find
    with open(f"{folder}/left-by-{me}", "w") as f:
        f.write("x")
owners = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        owners.add(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        pass
print(json.dumps({"node": node, "job_gpus": sorted(int(g) for g in os.environ["SLURM_JOB_GPUS"].split(",")),
                  "process_owners": sorted(owners), "found": os.listdir("/tmp") + os.listdir("/dev/shm"),
                  "devices": opened, "memory_limit": memory_limit,
                  "tmp": tmp, "tmp_owner": os.stat(tmp).st_uid, "tmp_mode": oct(os.stat(tmp).st_mode & 0o777)}))
"""


@pytest.fixture
def two_sessions_on_one_node(alice, bob):
    """alice's and bob's sessions on the same node. Slurm 24.11 places two such jobs on two idle nodes, one each
    (22.05 packed them): the partition's other nodes take no new jobs while bob's starts (drained, resumed
    right after)."""
    alice.spawn({"profile": "gpu", "gpus": 1})
    hers = active_jobs("alice")[0]["nodes"]
    listed = subprocess.run([f"{SLURM_BIN}/sinfo", "-h", "-N", "-p", "gpu", "-o", "%N"], env=SLURM_ENV,
                            capture_output=True, text=True, check=True).stdout.split()
    others = sorted(set(listed) - {hers})
    scontrol = [f"{SLURM_BIN}/scontrol", "update", f"nodename={','.join(others)}"]
    if others:
        subprocess.run([*scontrol, "state=drain", "reason=dsportal test: two slices on one node"], env=SLURM_ENV,
                       check=True)
    try:
        bob.spawn({"profile": "gpu", "gpus": 1})
    finally:
        if others:
            subprocess.run([*scontrol, "state=resume"], env=SLURM_ENV, check=True)
    return alice, bob, {u: active_jobs(u)[0]["nodes"] for u in ("alice", "bob")}


def test_slices_on_one_node_hold_only_their_own_gpus_memory_tmp_and_processes(two_sessions_on_one_node):
    """Unsetting CUDA_VISIBLE_DEVICES does not reach a neighbour's GPU: the job's device cgroup
    refuses it (EPERM). Memory is the slice's own, enforced by the kernel (cgroup.conf). /tmp and
    /dev/shm are the job's own (job_container/tmpfs), and /proc shows only one's own processes."""
    alice, bob, nodes = two_sessions_on_one_node
    assert nodes["alice"] == nodes["bob"], nodes
    seen = {user.name: json.loads(user.run_code(CONFINEMENT)) for user in (alice, bob)}
    seen["alice"] = json.loads(alice.run_code(CONFINEMENT))  # again, after bob left his files
    # 1 GPU x 48 GB, capped by Slurm at the node's memory (hubclient.slice_memory_limit).
    slice_memory = slice_memory_limit(48 * 2 ** 30)
    print(json.dumps(seen))
    for name, probe in seen.items():
        allowed = sorted(int(i) for i, state in probe["devices"].items() if state == "allowed")
        assert allowed == probe["job_gpus"] and len(allowed) == 1, (name, probe)
        assert {state for state in probe["devices"].values()} == {"allowed", "EPERM"}, (name, probe)
        assert probe["memory_limit"] == slice_memory, (name, probe)
        # Temporary files (TensorBoard's info files, Python's tempfile) go to a folder of the session's own.
        assert probe["tmp"].startswith(f"/tmp/dsportal-{name}-") and probe["tmp_mode"] == "0o700", probe
        assert probe["tmp_owner"] == pwd.getpwnam(name).pw_uid
        # Only one's own files in /tmp and /dev/shm, only one's own processes in /proc.
        assert {f for f in probe["found"] if f.startswith("left-by-")} == {f"left-by-{name}"}, probe["found"]
        assert probe["process_owners"] == [pwd.getpwnam(name).pw_uid], probe["process_owners"]
    alices_gpu = seen["alice"]["job_gpus"][0]
    assert seen["bob"]["devices"][str(alices_gpu)] == "EPERM"


PLANT = """
import json, os
mine = int(os.environ["SLURM_JOB_ID"])
planted = []
for job in range(mine + 1, mine + 41):  # job ids are sequential: alice's next session is one of these
    folder = f"/tmp/dsportal-alice-{job}"
    spec = f"{folder}/kernels/python3"
    os.makedirs(spec, exist_ok=True)
    with open(f"{spec}/kernel.json", "w") as f:
        json.dump({"argv": ["/bin/sh", "-c", "touch $HOME/bob-was-here; sleep 600"],
                   "display_name": "Python 3", "language": "python"}, f)
    for path in (folder, f"{folder}/kernels", spec):
        os.chmod(path, 0o777)
    planted.append(job)
print(json.dumps(planted))
"""


def test_a_neighbour_cannot_plant_files_in_the_next_sessions_folders(alice, bob):
    """bob knows how job ids go and fills /tmp with the folders alice's next session would use,
    with a kernelspec of his own in each. Her session makes folders no one can guess."""
    subprocess.run("rm -rf /tmp/dsportal-alice-* /home/alice/bob-was-here", shell=True, check=True)
    bob.spawn({"profile": "cpu"})
    planted = json.loads(bob.run_code(PLANT))
    try:
        alice.spawn({"profile": "cpu"})
        job_id = active_jobs("alice")[0]["job_id"]
        assert job_id in planted, (job_id, planted)
        assert alice.run_code("print('mine')").strip() == "mine"
        assert not os.path.exists("/home/alice/bob-was-here"), "bob's kernelspec ran as alice"
        seen = json.loads(alice.run_code(
            "import json, os; r = os.environ['JUPYTER_RUNTIME_DIR']; d = os.path.dirname(r)\n"
            "print(json.dumps({'runtime': r, 'path': os.environ['JUPYTER_PATH'].split(':')[0],"
            " 'owner': os.stat(d).st_uid, 'mode': oct(os.stat(d).st_mode & 0o777)}))"))
        assert seen["path"] != f"/tmp/dsportal-alice-{job_id}" and seen["owner"] == pwd.getpwnam("alice").pw_uid
        assert seen["mode"] == "0o700", seen
    finally:
        subprocess.run("rm -rf /tmp/dsportal-alice-* /home/alice/bob-was-here", shell=True)


LEAVE_BEHIND = """
import subprocess
subprocess.Popen(["/bin/sh", "-c", "sleep 3600 & exec sleep 3601"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("started")
"""


def test_nothing_a_session_started_outlives_it(bob):
    """A daemon (new session, parent gone) started from a kernel ends with the job: it cannot keep
    a GPU, CPU or a port of the node after the slice is given to someone else."""
    bob.spawn({"profile": "cpu"})
    assert bob.run_code(LEAVE_BEHIND).strip() == "started"
    running = subprocess.run(["pgrep", "-u", "bob", "-f", "^sleep 36"], capture_output=True, text=True).stdout.split()
    assert len(running) == 2, running
    bob.stop_server()
    assert wait_no_jobs("bob") == []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-u", "bob", "-f", "^sleep 36"]).returncode == 0:
        time.sleep(0.5)
    left = subprocess.run(["pgrep", "-u", "bob", "-af", "^sleep 36"], capture_output=True, text=True).stdout
    assert left == "", f"still running after bob's session ended: {left}"


SESSION_MEMORY = MEMORY_LIMIT + "print(memory_limit)\n"


def test_a_slice_that_outgrows_its_memory_is_stopped_alone(bob):
    """bob's CPU session holds exactly its 16 GB. A job of alice's on the same node that touches
    more than it asked for is killed by the kernel (OUT_OF_MEMORY); bob's session keeps working."""
    bob.spawn({"profile": "cpu"})
    assert int(bob.run_code(SESSION_MEMORY).strip()) == 16 * 2 ** 30
    node = active_jobs("bob")[0]["nodes"]
    hog = subprocess.run(
        ["runuser", "-u", "alice", "--", "sbatch", "--parsable", "--wait", "--partition=cpu", f"--nodelist={node}",
         "--mem=256M", "--time=5", "--output=/dev/null", "--chdir=/tmp",
         "--wrap", "/usr/bin/python3 -c 'x = b\"x\" * (1 << 30); print(len(x))'"],
        capture_output=True, text=True, timeout=120)
    job_id = hog.stdout.strip().split(";")[0]
    state = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                           capture_output=True, text=True).stdout.strip()
    print(f"alice's 1 GiB in a 256 MB job {job_id} on {node}: {state}")
    assert state == "OUT_OF_MEMORY", (hog.stdout, hog.stderr, state)
    assert bob.run_code("print('still here')").strip() == "still here"


ALICE_SERVES = """
import os, pathlib, subprocess, socket
folder = pathlib.Path.home() / "www"
folder.mkdir(exist_ok=True)
(folder / "index.html").write_text("{secret}")
s = socket.socket(); s.bind(("", 0)); port = s.getsockname()[1]; s.close()
subprocess.Popen(["python3", "-m", "http.server", str(port), "--bind", "0.0.0.0"], cwd=folder,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print(port)
"""

FETCH = """
import urllib.request
try:
    print(urllib.request.urlopen("{url}", timeout=10).read().decode()[:200])
except Exception as error:
    print("REFUSED", type(error).__name__, error)
"""


def wait_answering(user: HubUser, url: str) -> requests.Response:
    deadline = time.monotonic() + 30
    while True:
        response = user.api("GET", url, allow_redirects=False)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


def test_bob_cannot_open_alices_web_services(two_sessions):
    alice, bob, nodes = two_sessions
    port = int(alice.run_code(ALICE_SERVES.format(secret=SECRET), keep=True).strip())
    subprocess.run(["rm", "-rf", "/home/alice/tb-iso"], check=True)
    alice.run_code("import os; os.makedirs(os.path.expanduser('~/tb-iso'))\n"
                   "%load_ext tensorboard\n%tensorboard --logdir ~/tb-iso\n", timeout=120)
    board = alice.api("GET", "/user/alice/dsportal/api/tensorboards").json()["tensorboards"][0]

    # alice: her web server through her proxy URL, and her TensorBoard.
    mine = wait_answering(alice, f"/user/alice/proxy/{port}/")
    assert mine.status_code == 200 and SECRET in mine.text
    assert wait_answering(alice, board["url"]).status_code == 200

    # bob, through his own session's proxy, every form of it: 403 naming the owner where his session shares her
    # node; on another node (Slurm places each session where it fits) nothing of his listens there.
    why = "belongs to another user (alice)" if nodes["alice"] == nodes["bob"] else f"Nothing of yours listens on port {port}"
    for path in (f"/user/bob/proxy/{port}/", f"/user/bob/proxy/absolute/{port}/",
                 f"/user/bob/proxy/localhost:{port}/", f"/user/bob/proxy/127.0.0.1:{port}/"):
        response = bob.api("GET", path, allow_redirects=False)
        assert response.status_code == 403 and SECRET not in response.text, (path, response.status_code)
        said = re.findall(r"(?:Port \d+ on \S+ belongs[^<]*|Nothing of yours[^<]*|Only services[^<]*)", response.text)
        assert why in response.text, (nodes, path, said or response.text[-400:])
    # Through alice's URLs: the hub refuses him. Her TensorBoard has no port at all.
    assert bob.api("GET", board["url"], allow_redirects=False).status_code == 403
    assert bob.api("GET", f"/user/alice/proxy/{port}/", allow_redirects=False).status_code == 403
    node_netns = network.namespace(nodes["alice"])
    listening = subprocess.run(["ip", "netns", "exec", node_netns, "ss", "-ltnp"], capture_output=True, text=True).stdout
    assert "LISTEN" in listening and f"pid={board['pid']}," not in listening
    socket_try = bob.run_code(
        "import socket\ns = socket.socket(socket.AF_UNIX)\n"
        f"try:\n    s.connect({board_socket(board)!r}); print('CONNECTED')\n"
        "except OSError as e:\n    print(type(e).__name__)")
    assert "CONNECTED" not in socket_try, socket_try

    # bob's kernel straight to the port: the node firewall refuses (where the node has one).
    direct = bob.run_code(FETCH.format(url=f"http://127.0.0.1:{port}/"))
    assert SECRET in alice.run_code(FETCH.format(url=f"http://127.0.0.1:{port}/"))
    if firewall.users(node_netns) is None:
        pytest.skip(f"no node firewall on this host: bob's kernel reached alice's port directly: {direct!r}")
    assert direct.startswith("REFUSED") and "Connection refused" in direct and SECRET not in direct, direct
    print(f"bob's kernel -> alice's port {port}: {direct.strip()}")


def board_socket(board: dict) -> str:
    """The unix socket behind a board (alice's session folder, mode 700)."""
    out = subprocess.run(["pgrep", "-u", "alice", "-af", "portal.session.tool.tensorboards"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        words = line.split()
        if str(board["pid"]) == words[0] and "--socket" in words:
            return words[words.index("--socket") + 1]
    raise AssertionError(f"no TensorBoard process {board['pid']}: {out.stdout}")


REPOST = """
import json, os, ssl, urllib.request
request = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"] + "/batchspawner", method="POST",
    data=json.dumps({{"port": {port}, "job_id": os.environ["SLURM_JOB_ID"]}}).encode(),
    headers={{"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"], "Content-Type": "application/json"}})
context = None
if os.environ.get("JUPYTERHUB_SSL_CERTFILE"):  # internal TLS: her session's certificate is hers to use too
    context = ssl.create_default_context(cafile=os.environ["JUPYTERHUB_SSL_CLIENT_CA"])
    context.load_cert_chain(os.environ["JUPYTERHUB_SSL_CERTFILE"], os.environ["JUPYTERHUB_SSL_KEYFILE"])
try:
    print(urllib.request.urlopen(request, context=context).status)
except urllib.error.HTTPError as error:
    print(error.code, json.load(error)["message"])
"""


def serves_jupyter(user: HubUser) -> bool:
    response = user.api("GET", f"/user/{user.name}/api")
    return response.status_code == 200 and "version" in response.json()


def test_port_report_is_taken_once_even_across_a_hub_restart(alice):
    alice.spawn()
    # From inside her running session, alice's own web server tries to take over her route.
    port = int(alice.run_code(ALICE_SERVES.format(secret=SECRET), keep=True).strip())
    answer = alice.run_code(REPOST.format(port=port))
    assert answer.startswith("409") and "accepted once" in answer, answer
    assert serves_jupyter(alice)
    log = (demo.paths().log / "hub.log").read_text()
    assert f"Refused port report {port}" in log
    # Her session asking again with its own port (an answer lost on the way) changes nothing: taken.
    own = int(alice.run_code("import os, urllib.parse\n"
                             "print(urllib.parse.urlparse(os.environ['JUPYTERHUB_SERVICE_URL']).port)").strip())
    answer = alice.run_code(REPOST.format(port=own))
    assert answer.strip() == "201", answer
    assert serves_jupyter(alice)

    demo.stop_hub()
    demo.ensure_hub()
    answer = alice.run_code(REPOST.format(port=port))
    assert answer.startswith("409") and "accepted once" in answer, answer
    assert serves_jupyter(alice), "after a hub restart the route moved"
    assert SECRET not in alice.api("GET", "/user/alice/").text


def test_hung_ldap_login_answers_with_a_message_and_others_keep_working(bob):
    bob.spawn({"profile": "cpu"})
    slapd = int((demo.paths().run / "slapd.pid").read_text().split()[0])
    os.kill(slapd, signal.SIGSTOP)
    try:
        results = {}

        def try_login():
            started = time.monotonic()
            try:  # the promise: an answer within 10 s (a client that waits no longer)
                results["response"] = HubUser(HUB, "alice").login(PASSWORDS["alice"], timeout=10)
            except requests.RequestException as error:
                results["error"] = error
            results["seconds"] = time.monotonic() - started

        attempt = threading.Thread(target=try_login)
        attempt.start()
        time.sleep(1)
        # While the login waits on the frozen slapd, bob's session and the hub answer.
        during = []
        while attempt.is_alive():
            started = time.monotonic()
            assert bob.api("GET", "/user/bob/api/status").status_code == 200
            assert bob.api("GET", "/hub/api/user").status_code == 200
            during.append(time.monotonic() - started)
            time.sleep(0.5)
        attempt.join()
        print(f"login with slapd stopped answered in {results['seconds']:.1f} s; bob's session answered "
              f"{len(during)} times meanwhile, slowest {max(during, default=0):.2f} s")
        assert "error" not in results, results
        response = results["response"]
        assert response.status_code == 503, response.status_code
        assert "login service (LDAP) is not answering" in response.text
    finally:
        os.kill(slapd, signal.SIGCONT)
    # Nothing was remembered as a success: a wrong password is still refused, the right one works.
    assert HubUser(HUB, "alice").login("wrong").status_code == 403
    assert login(HUB, "alice")


def test_session_cancelled_outside_the_portal_is_reported_with_slurms_reason(alice):
    alice.spawn()
    job_id = active_jobs("alice")[0]["job_id"]
    subprocess.run(["scancel", str(job_id)], check=True)
    deadline = time.monotonic() + 60
    while alice.model()["servers"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alice.model()["servers"] == {}, "the hub still shows the cancelled session"
    # Her next page says why (how fast it is seen: bench/spawn_bench.py).
    home = alice.web.get(f"{HUB}/hub/home")
    assert f"Your session job {job_id} was cancelled (Slurm: CANCELLED" in home.text, home.text[-2000:]
    page = alice.web.get(f"{HUB}/user/alice/lab")
    assert f"Your session job {job_id} was cancelled" in page.text
    # The next start clears it.
    alice.spawn()
    assert "dsportal-session-ended" not in alice.web.get(f"{HUB}/hub/home").text


def test_listener_owner_is_read_from_the_kernel_tables():
    """portguard's lookup, on real sockets: IPv4 and IPv6, wildcard and loopback, another user's."""
    import socket

    from portal.session.tool.portguard import listener_uids

    mine = socket.socket()
    mine.bind(("127.0.0.1", 0))
    mine.listen()
    port = mine.getsockname()[1]
    assert listener_uids(port) == {os.getuid()}
    wildcard6 = socket.socket(socket.AF_INET6)
    wildcard6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    wildcard6.bind(("::", 0))
    wildcard6.listen()
    assert listener_uids(wildcard6.getsockname()[1]) == {os.getuid()}
    code = ("import socket, sys, time\ns = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(30)")
    other = subprocess.Popen(["runuser", "-u", "bob", "--", "/usr/bin/python3", "-c", code],
                             stdout=subprocess.PIPE, text=True)
    try:
        bobs = int(other.stdout.readline())
        import pwd

        assert listener_uids(bobs) == {pwd.getpwnam("bob").pw_uid}
    finally:
        other.kill()
        mine.close()
        wildcard6.close()
    assert listener_uids(port) == set()


SLOW_MEDIATOR = """#!/bin/sh
# The real mediator, its answer handed back to the hub {delay} s later: a hub that learns the job id
# late, as while a class of 100 starts (when sbatch is slow to answer).
out=$({mediator} "$@")
status=$?
sleep {delay}
printf '%s\\n' "$out"
exit $status
"""


def test_a_session_that_reports_before_the_hub_has_its_job_id_is_taken(second_hub, tmp_path):
    """A session's server can serve, and report its port, before sbatch has brought the job id back to
    the hub. The report waits for the submission instead of being refused (which ended the session:
    1 of a class of 100 lost so). A real sbatch through the real mediator; only its answer is late."""
    from portal.core import defaults

    folder = Path("/usr/local/libexec/dsportal-test")
    folder.mkdir(mode=0o755, exist_ok=True)
    wrapper = folder / f"slow-mediator-{os.getpid()}"
    wrapper.write_text(SLOW_MEDIATOR.format(mediator=defaults.MEDIATOR, delay=8))
    wrapper.chmod(0o755)
    try:
        def slow_submissions(config):
            config["slurm"]["mediator"] = str(wrapper)

        base = second_hub(slow_submissions)
        alice, bob = login(base, "alice"), login(base, "bob")
        started = time.monotonic()
        assert alice.start_server({"profile": "cpu"}).status_code in (201, 202)
        # While her sbatch is in flight, bob reports a port for her with his own token: refused at
        # once, it holds nothing open and changes nothing of her start.
        bobs = requests.post(f"{base}/hub/api/batchspawner", json={"port": 8888, "job_id": ""},
                             headers={"Authorization": f"token {bob.token}"}, timeout=30)
        assert bobs.status_code == 403, bobs.text
        alice.wait_ready(120)
        assert time.monotonic() - started >= 8  # the hub had the job id only after the wrapper's pause
        assert "ok" in alice.run_code("print('ok')")
        log = (tmp_path / "hub.log").read_text()
        assert "Refused port report" not in log, log[-3000:]
        reported = log.index("Session of alice reported port")
        assert log.index("Submitted session job") < reported, log[-3000:]
    finally:
        wrapper.unlink(missing_ok=True)
