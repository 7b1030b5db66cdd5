"""Issue 12: slices that share a node do not see each other.

alice and bob each hold a session on the same (demo) node, as strangers sharing a GPU node do.
Everything is real: their Slurm jobs, their Jupyter servers, kernels (host and container) and
terminals, alice's web server and TensorBoard, the hub's port-report API across a hub restart,
slapd frozen with SIGSTOP, and a session job cancelled behind the portal's back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest
import requests

from conftest import HUB, PASSWORDS, login
from hubclient import HubUser, active_jobs
from portal import demo, firewall

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
    in_container = read_as(bob, paths, kernel="dsportal-debian-python")
    assert set(in_container.values()) == {"PermissionError"}, in_container
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
    alice, bob, _ = two_sessions
    port = int(alice.run_code(ALICE_SERVES.format(secret=SECRET), keep=True).strip())
    subprocess.run(["rm", "-rf", "/home/alice/tb-iso"], check=True)
    alice.run_code("import os; os.makedirs(os.path.expanduser('~/tb-iso'))\n"
                   "%load_ext tensorboard\n%tensorboard --logdir ~/tb-iso\n", timeout=120)
    board = alice.api("GET", "/user/alice/dsportal/api/tensorboards").json()["tensorboards"][0]

    # alice: her web server through her proxy URL, and her TensorBoard.
    mine = wait_answering(alice, f"/user/alice/proxy/{port}/")
    assert mine.status_code == 200 and SECRET in mine.text
    assert wait_answering(alice, board["url"]).status_code == 200

    # bob, through his own session's proxy, every form of it: 403 naming the owner.
    for path in (f"/user/bob/proxy/{port}/", f"/user/bob/proxy/absolute/{port}/",
                 f"/user/bob/proxy/localhost:{port}/", f"/user/bob/proxy/127.0.0.1:{port}/"):
        response = bob.api("GET", path, allow_redirects=False)
        assert response.status_code == 403 and SECRET not in response.text, (path, response.status_code)
        assert "belongs to another user (alice)" in response.text, response.text[-400:]
    # Through alice's URLs: the hub refuses him. Her TensorBoard has no port at all.
    assert bob.api("GET", board["url"], allow_redirects=False).status_code == 403
    assert bob.api("GET", f"/user/alice/proxy/{port}/", allow_redirects=False).status_code == 403
    listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    assert f"pid={board['pid']}," not in listening
    socket_try = bob.run_code(
        "import socket\ns = socket.socket(socket.AF_UNIX)\n"
        f"try:\n    s.connect({board_socket(board)!r}); print('CONNECTED')\n"
        "except OSError as e:\n    print(type(e).__name__)")
    assert "CONNECTED" not in socket_try, socket_try

    # bob's kernel straight to the port: the node firewall refuses (where the node has one).
    direct = bob.run_code(FETCH.format(url=f"http://127.0.0.1:{port}/"))
    assert SECRET in alice.run_code(FETCH.format(url=f"http://127.0.0.1:{port}/"))
    if firewall.users() is None:
        pytest.skip(f"no node firewall on this host: bob's kernel reached alice's port directly: {direct!r}")
    assert direct.startswith("REFUSED") and "Connection refused" in direct and SECRET not in direct, direct
    print(f"bob's kernel -> alice's port {port}: {direct.strip()}")


def board_socket(board: dict) -> str:
    """The unix socket behind a board (alice's session folder, mode 700)."""
    out = subprocess.run(["pgrep", "-u", "alice", "-af", "portal.tensorboards"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        words = line.split()
        if str(board["pid"]) == words[0] and "--socket" in words:
            return words[words.index("--socket") + 1]
    raise AssertionError(f"no TensorBoard process {board['pid']}: {out.stdout}")


REPOST = """
import json, os, urllib.request
request = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"] + "/batchspawner", method="POST",
    data=json.dumps({{"port": {port}, "job_id": os.environ["SLURM_JOB_ID"]}}).encode(),
    headers={{"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"], "Content-Type": "application/json"}})
try:
    print(urllib.request.urlopen(request).status)
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

    from portal.portguard import listener_uids

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
