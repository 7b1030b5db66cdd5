"""Issue 27, item 3: a session's kernels listen on no TCP port.

Their channels are unix sockets in the session's runtime folder (0700): a neighbour on the node
cannot subscribe to a kernel's IOPub and read its code and output. alice runs a host kernel and a
container kernel (Charliecloud); bob tries her sockets from a job of his on the same node, and from
inside her job's own view of the files.
"""

from __future__ import annotations

import json
import pwd
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from democluster import network
from hubclient import active_jobs
from portal.session.kernel.kernelsockets import SocketPathTooLong, socket_prefix

KERNELS = ("python3", "dsportal-debian-python", "dsportal-debian-python-ch")  # host, Apptainer, Charliecloud

# What a kernel says about its own connection: its connection file, sockets and their folder.
WHERE_AM_I = """
import json, os, stat
from ipykernel.connect import get_connection_file
info = json.load(open(get_connection_file()))
ports = [info[name] for name in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]
sockets = [f"{info['ip']}-{port}" for port in ports] + [f"{info['ip']}-pipe"]
def seen(path):
    st = os.stat(path)
    return {"socket": stat.S_ISSOCK(st.st_mode), "mode": oct(st.st_mode & 0o777), "owner": st.st_uid}
folder = os.path.dirname(info["ip"])
print(json.dumps({"pid": os.getpid(), "connection_file": get_connection_file(), "transport": info["transport"],
                  "sockets": {p: seen(p) for p in sockets}, "folder": folder,
                  "folder_mode": oct(os.stat(folder).st_mode & 0o777), "folder_owner": os.stat(folder).st_uid,
                  "runtime_dir": os.environ["JUPYTER_RUNTIME_DIR"]}))
"""

# Output of a process the kernel forks comes back through ipykernel's pipe (a unix socket too).
FORKED_CHILD_PRINTS = """
import multiprocessing
def child():
    print("from a forked child", flush=True)
process = multiprocessing.get_context("fork").Process(target=child)
process.start(); process.join()
print("and from the kernel")
"""

CONNECT = """
import json, socket
result = {}
for path in PATHS:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        result[path] = "CONNECTED"
    except OSError as error:
        result[path] = type(error).__name__
print(json.dumps(result))
"""


def tcp_listeners(node: str) -> str:
    """Every TCP listener of the node (IPv4 and IPv6), with its processes."""
    return subprocess.run(["ip", "netns", "exec", network.namespace(node), "ss", "-Hltnp"],
                          capture_output=True, text=True, check=True).stdout


def host_pid(probe: dict) -> int:
    """The kernel's process id on its node: a kernel in Apptainer's own process namespace knows only
    its id there. The node's process running ipykernel with its connection file."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if {b"ipykernel_launcher", b"portal.session.kernelstart"} & set(argv) and probe["connection_file"].encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no process of the kernel {probe['connection_file']}")


def bobs_job_connects(node: str, paths: list[str]) -> dict:
    """bob's batch job on ``node`` connects to each path."""
    out = Path(f"/home/bob/kernel-transport-{uuid.uuid4().hex[:8]}.out")
    code = f"PATHS = {paths!r}\n" + CONNECT
    try:
        job = subprocess.run(
            ["runuser", "-u", "bob", "--", "sbatch", "--parsable", "--wait", "--partition=cpu", f"--nodelist={node}",
             "--mem=256M", "--time=5", f"--output={out}", "--chdir=/tmp",
             "--wrap", f"/usr/bin/python3 -c {shlex.quote(code)}"],
            capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, (job.stdout, job.stderr)
        return json.loads(out.read_text().strip().splitlines()[-1])
    finally:
        out.unlink(missing_ok=True)


def bob_connects_in_her_view(kernel_pid: int, paths: list[str]) -> dict:
    """bob, in the kernel's own mount namespace (her job's /tmp, the image's files): the paths are
    there, only the folder's mode stands between him and them."""
    bob = pwd.getpwnam("bob")
    done = subprocess.run(
        ["nsenter", f"--target={kernel_pid}", "--mount", "--", "setpriv", f"--reuid={bob.pw_uid}",
         f"--regid={bob.pw_gid}", "--clear-groups", "/usr/bin/python3", "-c", f"PATHS = {paths!r}\n" + CONNECT],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_kernels_talk_over_private_unix_sockets_and_listen_on_no_tcp_port(alice):
    alice.spawn({"profile": "cpu"})
    node = active_jobs("alice")[0]["nodes"]
    alice_uid = pwd.getpwnam("alice").pw_uid
    seen = {kernel: json.loads(alice.run_code(WHERE_AM_I, kernel=kernel, keep=True)) for kernel in KERNELS}
    for probe in seen.values():
        probe["pid"] = host_pid(probe)
    listening = tcp_listeners(node)
    print(json.dumps(seen, indent=1))

    for kernel, probe in seen.items():
        assert probe["transport"] == "ipc", (kernel, probe)
        # Not one TCP listener of the kernel process, on any address (its pipe for forked output included).
        assert f"pid={probe['pid']}," not in listening, (kernel, listening)
        # Its sockets: in the session's runtime folder (alice's, 0700), sockets of hers, for her alone.
        assert probe["folder"] == probe["runtime_dir"], probe
        assert probe["folder_mode"] == "0o700" and probe["folder_owner"] == alice_uid, probe
        assert len(probe["sockets"]) == 6, probe
        for path, socket_seen in probe["sockets"].items():
            assert socket_seen["socket"] and socket_seen["owner"] == alice_uid, (path, socket_seen)
            assert int(socket_seen["mode"], 8) & 0o077 == 0, (path, socket_seen)
            assert len(path.encode()) <= 107, path  # a unix socket's path limit

    # bob, from a job of his on the same node: her sockets are not his to open.
    paths = [path for probe in seen.values() for path in probe["sockets"]]
    from_bobs_job = bobs_job_connects(node, paths)
    assert "CONNECTED" not in from_bobs_job.values(), from_bobs_job
    # ... nor where the files are in plain sight (as on a node without private /tmp per job).
    for kernel, probe in seen.items():
        in_her_view = bob_connects_in_her_view(probe["pid"], list(probe["sockets"]))
        assert set(in_her_view.values()) == {"PermissionError"}, (kernel, in_her_view)

    # Code runs and its output comes back, a forked child's included, on both kernels.
    for kernel in KERNELS:
        out = alice.run_code(FORKED_CHILD_PRINTS, kernel=kernel)
        assert "from a forked child\n" in out and "and from the kernel\n" in out, (kernel, out)


def test_kernel_socket_names_are_short_and_a_folder_too_deep_is_refused_in_words():
    kernel_id = "0f8e2a4c-1111-2222-3333-444455556666"
    runtime = "/tmp/dsportal-alice-123456-AbCdEfGhIj/runtime"
    assert socket_prefix(f"{runtime}/kernel-{kernel_id}.json") == f"{runtime}/k0f8e2a4c"
    too_deep = "/scratch/" + "x" * 90 + "/runtime"
    with pytest.raises(SocketPathTooLong, match="too long for a kernel's unix sockets.*shorter TMPDIR"):
        socket_prefix(f"{too_deep}/kernel-{kernel_id}.json")


def test_a_kernel_leaves_no_socket_behind(alice):
    """Shut down, a kernel's six sockets are gone: jupyter_client removes the channels', the kernel's
    exit its private pipe's (portal.session.kernel.kernelpipe; a forked child's exit leaves it alone)."""
    alice.spawn({"profile": "cpu"})
    for kernel in KERNELS:
        out = alice.run_code(FORKED_CHILD_PRINTS + WHERE_AM_I, kernel=kernel)
        assert "from a forked child" in out, (kernel, out)  # its pipe outlived the child's exit
        paths = list(json.loads(out.strip().splitlines()[-1])["sockets"])
        left = alice.run_code(f"import os; print([p for p in {paths!r} if os.path.exists(p)])")
        assert left.strip() == "[]", (kernel, left)  # shut down (run_code's DELETE): all six gone
