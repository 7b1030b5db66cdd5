"""The slice's gauges and a user's own kernels on a real Jupyter server, without the demo cluster.

A real `jupyter server` (this environment's, with the session's extension and kernel managers) runs
as a test account inside a real cgroup that limits its memory and CPU as Slurm's task/cgroup limits
a job's; real kernels run in it. Needs root and a cgroup memory controller (v1 or v2); skipped
otherwise. What the demo adds (Slurm's own cgroup, the hub, the proxy) is in test_gauges.py and
test_own_kernels.py.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
import websocket

from hubclient import free_port, receive
from portal.session.usage import sliceusage

ACCOUNT = "gaugetest"  # a local account of this test's own, never one of the demo's
MEMORY_LIMIT = 600 << 20
CPU_QUOTA = 0.5  # cores
ENV = Path(sys.executable).parent
CGROUP = Path("/sys/fs/cgroup")


def _v2() -> bool:
    return (CGROUP / "cgroup.controllers").exists()


def _can_run() -> str:
    if os.geteuid() != 0:
        return "needs root (a test account, a cgroup)"
    if _v2():
        if "memory" not in (CGROUP / "cgroup.controllers").read_text().split():
            return "cgroup v2 without the memory controller"
    elif not (CGROUP / "memory" / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller"
    if not shutil.which("runuser") or not shutil.which("useradd"):
        return "needs runuser and useradd"
    return ""


pytestmark = pytest.mark.skipif(bool(_can_run()), reason=_can_run() or "runs")


class JobLikeCgroup:
    """A job-like cgroup: memory limit, CPU quota, CPU accounting; v1 (one folder per controller) or v2."""

    def __init__(self, name: str):
        if _v2():
            subtree = CGROUP / "cgroup.subtree_control"
            for controller in ("memory", "cpu"):
                if controller not in subtree.read_text().split():
                    subtree.write_text(f"+{controller}")
            self.folders = [CGROUP / name]
        else:
            self.folders = [CGROUP / controller / name for controller in ("memory", "cpu", "cpuacct")
                            if (CGROUP / controller).is_dir()]
        for folder in self.folders:
            folder.mkdir(exist_ok=True)
        if _v2():
            (self.folders[0] / "memory.max").write_text(str(MEMORY_LIMIT))
            (self.folders[0] / "memory.swap.max").write_text("0") if (self.folders[0] / "memory.swap.max").exists() else None
            (self.folders[0] / "cpu.max").write_text(f"{int(CPU_QUOTA * 100000)} 100000")
        else:
            (CGROUP / "memory" / name / "memory.limit_in_bytes").write_text(str(MEMORY_LIMIT))
            (CGROUP / "cpu" / name / "cpu.cfs_period_us").write_text("100000")
            (CGROUP / "cpu" / name / "cpu.cfs_quota_us").write_text(str(int(CPU_QUOTA * 100000)))

    def enter(self) -> None:
        """In the child before exec: the server and all it starts live in the cgroup."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        """Whatever still runs in it (a kernel the server left, runuser's child) is killed first:
        a cgroup with processes cannot be removed, and test runs would leave them behind."""
        for folder in self.folders:
            for pid in (folder / "cgroup.procs").read_text().split() if folder.is_dir() else ():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def _account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(ACCOUNT)
    except KeyError:
        # A uid above the demo's (courses count up from 5201: useradd's next free one was student31's).
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=20000", "-K", "GID_MIN=20000", ACCOUNT],
                       check=True)
        return pwd.getpwnam(ACCOUNT)


def _as_user(*command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("runuser"), "-u", ACCOUNT, "--", *command], capture_output=True, text=True,
                          timeout=timeout, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": _account().pw_dir})


class Server:
    def __init__(self, url: str, token: str, process: subprocess.Popen, log: Path):
        self.url, self.token, self.process, self.log = url, token, process, log

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, f"{self.url}{path}", headers={"Authorization": f"token {self.token}"},
                                timeout=60, **kwargs)

    def start_kernel(self, name: str) -> requests.Response:
        return self.api("POST", "/api/kernels", json={"name": name})

    def run(self, kernel_id: str, code: str, timeout: float = 120) -> tuple[str, str]:
        """Runs a cell; (stdout, how it ended: 'ok', 'error: ...' or 'died')."""
        ws = websocket.create_connection(f"{self.url.replace('http', 'ws', 1)}/api/kernels/{kernel_id}/channels",
                                         header=[f"Authorization: token {self.token}"], timeout=timeout)
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": ACCOUNT,
                                       "session": uuid.uuid4().hex, "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell",
                            "content": {"code": code, "silent": False, "store_history": False}}))
        output, deadline = [], time.monotonic() + timeout
        try:
            while (raw := receive(ws, deadline)) is not None:
                message = json.loads(raw)
                if message["msg_type"] == "status" and message["content"]["execution_state"] in ("restarting", "dead"):
                    return "".join(output), "died"
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if message["msg_type"] == "stream":
                    output.append(message["content"]["text"])
                elif message["msg_type"] == "error":
                    return "".join(output), "error: " + message["content"]["evalue"]
                elif message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                    return "".join(output), "ok"
        finally:
            ws.close()
        raise AssertionError("the cell did not end in time")

    def usage(self) -> dict:
        response = self.api("GET", "/dsportal/api/usage")
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    account = _account()
    cgroup = JobLikeCgroup(f"dsportal-gaugetest-{os.getpid()}")
    runtime = Path(f"/tmp/gt-{secrets.token_hex(3)}")
    runtime.mkdir(mode=0o700)
    os.chown(runtime, account.pw_uid, account.pw_gid)
    log = tmp_path_factory.mktemp("server") / "server.log"
    port, token = free_port(), secrets.token_hex(16)
    env = {"PATH": f"{ENV}:/usr/bin:/bin", "HOME": account.pw_dir, "USER": ACCOUNT, "JUPYTER_RUNTIME_DIR": str(runtime),
           "LANG": "C.UTF-8", "SLURM_CPUS_ON_NODE": "4"}
    try:
        process = subprocess.Popen(
            [shutil.which("runuser"), "-u", ACCOUNT, "--", str(ENV / "jupyter-server"), "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={account.pw_dir}"],
            env=env, cwd="/", stdout=open(log, "wb"), stderr=subprocess.STDOUT, preexec_fn=cgroup.enter)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            try:
                if requests.get(f"{url}/api/status", headers={"Authorization": f"token {token}"}, timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.3)
        else:
            raise AssertionError("the server did not start:\n" + log.read_text())
        yield Server(url, token, process, log)
    finally:
        if "process" in locals():
            process.terminate()
            process.wait(timeout=30)
        cgroup.remove()
        shutil.rmtree(runtime, ignore_errors=True)


def test_gauges_show_the_cgroups_limits_not_the_nodes(server):
    usage = server.usage()
    node_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert usage["memory"]["limit_bytes"] == MEMORY_LIMIT != node_memory
    assert usage["memory"]["limit_from"] == "cgroup"
    assert 0 < usage["memory"]["used_bytes"] < MEMORY_LIMIT
    assert usage["cpu"]["cores"] == CPU_QUOTA and usage["cpu"]["cores_from"] == "quota"
    assert usage["gpus"] == [], "a slice without GPUs shows none"
    assert usage["memory_warning_fraction"] == 0.9
    # jupyter-resource-usage is given the same limits.
    metrics = server.api("GET", "/api/metrics/v1").json()
    assert metrics["limits"]["memory"]["rss"] == MEMORY_LIMIT
    assert metrics["limits"]["cpu"]["cpu"] == CPU_QUOTA


def test_gauges_follow_a_kernels_memory_and_cpu(server):
    kernel = server.start_kernel("python3").json()["id"]
    try:
        before = server.usage()["memory"]["used_bytes"]
        out, how = server.run(kernel, "block = bytearray(300 << 20)\nprint(len(block))")
        assert how == "ok", out
        during = server.usage()
        assert during["memory"]["used_bytes"] - before > 250 << 20
        assert during["memory"]["fraction"] > 0.4
        server.usage()
        server.run(kernel, "import time\nend = time.time() + 3\nwhile time.time() < end: pass")
        cpu = server.usage()["cpu"]
        # The quota holds the busy loop to about half a core.
        assert 0.2 < cpu["used_cores"] <= CPU_QUOTA * 1.3, cpu
    finally:
        server.api("DELETE", f"/api/kernels/{kernel}")


def test_a_kernel_killed_by_the_memory_limit_is_said_so(server):
    kernel = server.start_kernel("python3").json()["id"]
    try:
        kills_before = server.usage()["memory"]["oom_kills"]
        out, how = server.run(kernel, "blocks = [bytearray(50 << 20) for _ in range(40)]")
        assert how == "died", (out, how)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            usage = server.usage()
            if usage["kernel_deaths"]:
                break
            time.sleep(1)
        death = usage["kernel_deaths"][-1]
        assert death["kernel_id"] == kernel and death["by_memory_limit"], usage
        assert usage["memory"]["oom_kills"] > kills_before
        assert "ran out of memory" in death["message"] and "600 MB" in death["message"]
        assert "ran out of memory" in server.log.read_text()
        # jupyter_server kept a kernel that died running a cell "busy" (jupyter_server#1395): the
        # session would count as in use for good, and a new connection went un-nudged.
        deadline = time.monotonic() + 30
        while (state := server.api("GET", f"/api/kernels/{kernel}").json()["execution_state"]) == "busy":
            assert time.monotonic() < deadline, "the restarted kernel still counts as busy"
            time.sleep(0.5)
        assert state in ("starting", "idle"), state
        # It restarted, empty, and works.
        out, how = server.run(kernel, "print('back')")
        assert (out.strip(), how) == ("back", "ok")
    finally:
        server.api("DELETE", f"/api/kernels/{kernel}")


# ------------------------------------------------------------------ own environments
@pytest.fixture(scope="module")
def own_envs(server):
    """As the user: a venv with ipykernel, registered; one without; one registered and then deleted."""
    home = Path(_account().pw_dir)
    envs = home / "envs"
    if not (envs / "good" / "bin" / "ipykernel").exists() and not list((envs / "good").glob("lib/python*/site-packages/ipykernel")):
        for command in (["/usr/bin/python3", "-m", "venv", str(envs / "good")],
                        [str(envs / "good" / "bin" / "pip"), "install", "--quiet", "ipykernel"]):
            done = _as_user(*command)
            assert done.returncode == 0, done.stderr
    done = _as_user(str(envs / "good" / "bin" / "python"), "-m", "ipykernel", "install", "--user", "--name", "good",
                    "--display-name", "My venv")
    assert done.returncode == 0, done.stderr
    assert _as_user("/usr/bin/python3", "-m", "venv", "--without-pip", str(envs / "bare")).returncode == 0
    kernels = home / ".local" / "share" / "jupyter" / "kernels"
    for name, python in (("bare", envs / "bare" / "bin" / "python"), ("gone", envs / "gone" / "bin" / "python")):
        spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"My {name} env", "language": "python"}
        _as_user("mkdir", "-p", str(kernels / name))
        (kernels / name / "kernel.json").write_text(json.dumps(spec))
        os.chown(kernels / name / "kernel.json", _account().pw_uid, _account().pw_gid)
    return envs


def test_own_venv_kernel_is_listed_and_runs_in_the_slice(server, own_envs):
    specs = server.api("GET", "/api/kernelspecs").json()["kernelspecs"]
    assert specs["good"]["spec"]["display_name"] == "My venv"
    assert specs["good"]["spec"]["metadata"]["dsportal"] == {"own": True, "status": "ok"}
    assert "python3" in specs and specs["python3"]["spec"]["display_name"] != "My venv"
    started = time.monotonic()
    kernel = server.start_kernel("good").json()["id"]
    try:
        out, how = server.run(kernel, "import sys, os\nprint(sys.prefix)\nprint(open('/proc/self/cgroup').read())")
        assert how == "ok", out
        prefix, cgroups = out.split("\n", 1)
        assert prefix == str(own_envs / "good")
        assert "dsportal-gaugetest-" in cgroups, "the kernel runs inside the slice's cgroup"
        # Its forked children's output comes back over the session's private pipe, not a TCP port.
        out, how = server.run(kernel, "import os\nif os.fork() == 0:\n    print('from the child', flush=True)\n"
                                      "    os._exit(0)\nos.wait()\nimport time; time.sleep(0.5)")
        assert "from the child" in out
    finally:
        server.api("DELETE", f"/api/kernels/{kernel}")
    print(f"own kernel start and two cells: {time.monotonic() - started:.2f} s")


def test_broken_own_environments_say_why(server, own_envs):
    specs = server.api("GET", "/api/kernelspecs").json()["kernelspecs"]
    gone = specs["gone"]["spec"]
    assert gone["display_name"] == f"My gone env (unavailable: {own_envs}/gone/bin/python is missing)"
    refused = server.start_kernel("gone")
    assert refused.status_code == 400
    assert refused.json()["message"].startswith("Your kernel 'My gone env'")
    assert "is missing" in refused.json()["message"] and "ipykernel install --user --name gone" in refused.json()["message"]
    # A venv without ipykernel is listed (checking it would mean running it), and refused at start, in words.
    assert specs["bare"]["spec"]["display_name"] == "My bare env"
    refused = server.start_kernel("bare")
    assert refused.status_code == 400
    assert refused.json()["message"] == (f"Your kernel 'My bare env' cannot start: its Python {own_envs}/bare/bin/python "
                                         f"has no ipykernel. Install it there: {own_envs}/bare/bin/python -m pip install ipykernel")
    assert server.api("GET", "/api/kernels").json() == [] or all(
        k["name"] not in ("gone", "bare") for k in server.api("GET", "/api/kernels").json())


def test_measurement_module_reads_this_process_outside_any_job():
    reading = sliceusage.SliceUsage(environ={}).read()
    assert reading.memory.limit_bytes > 0 and reading.cpu.cores >= 1 and reading.gpus == []


def test_a_server_whose_port_was_taken_meanwhile_serves_on_another(tmp_path):
    """singleuser.py picks a free port, the server binds it seconds later (a class starting: up to
    half a minute) and jupyterhub-singleuser allows no other (port_retries 0): one session of a class
    of 100 failed so. The session's extension lets it take another; it reports the one it bound."""
    account = _account()
    runtime = Path(f"/tmp/gt-{secrets.token_hex(3)}")
    runtime.mkdir(mode=0o700)
    os.chown(runtime, account.pw_uid, account.pw_gid)
    log = tmp_path / "server.log"
    token = secrets.token_hex(16)
    env = {"PATH": f"{ENV}:/usr/bin:/bin", "HOME": account.pw_dir, "USER": ACCOUNT, "JUPYTER_RUNTIME_DIR": str(runtime),
           "LANG": "C.UTF-8"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = subprocess.Popen(
            [shutil.which("runuser"), "-u", ACCOUNT, "--", str(ENV / "jupyter-server"), "--no-browser",
             "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={account.pw_dir}"],
            env=env, cwd="/", stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        try:
            deadline, served = time.monotonic() + 60, None
            while served is None and time.monotonic() < deadline:
                assert process.poll() is None, log.read_text()
                for info in runtime.glob("jpserver-*.json"):
                    served = json.loads(info.read_text())["port"]
                time.sleep(0.3)
            assert served is not None, log.read_text()
            assert served != port
            assert requests.get(f"http://127.0.0.1:{served}/api/status", headers={"Authorization": f"token {token}"},
                                timeout=10).ok
            assert f"The port {port} is already in use" in log.read_text()
        finally:
            process.terminate()
            process.wait(timeout=30)
            shutil.rmtree(runtime, ignore_errors=True)
