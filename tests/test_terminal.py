"""Issue 51, the terminal: JupyterLab's terminal runs in the session's Slurm job, as its user, inside
her slice (its cores, its memory limit, its GPUs), and no other user reaches it: not through her
server, not by its process, not from his own job on her node."""

from __future__ import annotations

import re
import subprocess

from hubclient import active_jobs
from test_gauges import GiB, node_memory

# The limits as the terminal's own shell sees them: the memory limit of the nearest cgroup above it that has one.
SLICE = ("echo USER=$(id -un); echo CPUS=$(nproc); echo JOB=$SLURM_JOB_ID; echo GPUS=$CUDA_VISIBLE_DEVICES; "
         "p=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup); "
         "while [ \"$p\" != /sys/fs/cgroup ] && [ \"$(cat $p/memory.max 2>/dev/null)\" = max ]; do p=$(dirname $p); done; "
         "echo MEM=$(cat $p/memory.max); echo PID=$$; echo HOST=$(hostname)")


def facts(output: str) -> dict[str, str]:
    return dict(re.findall(r"^(USER|CPUS|JOB|GPUS|MEM|PID|HOST)=(.*?)\r?$", output, re.M))


def test_the_terminal_runs_as_her_in_her_slice_and_bob_reaches_it_from_nowhere(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 2})  # 16 CPUs, 96 GB
    job = active_jobs("alice")[0]
    seen = facts(alice.run_in_terminal(SLICE))
    assert seen["USER"] == "alice" and seen["JOB"] == str(job["job_id"]), seen
    assert seen["CPUS"] == "16", seen
    expected = min(96 * GiB, node_memory())  # Slurm's limit, page-aligned by the kernel
    assert expected - (64 << 20) <= int(seen["MEM"]) <= expected, seen
    gpus = seen["GPUS"].split(",")
    assert len(gpus) == 2 and all(g.isdigit() for g in gpus), seen
    assert seen["HOST"] == job["nodes"], (seen, job)

    # bob: her terminals are not his to list, open or type into, through her server or his token.
    listing = bob.api("GET", "/user/alice/api/terminals", allow_redirects=False)
    assert listing.status_code in (302, 403), listing.status_code
    created = alice.api("POST", "/user/alice/api/terminals")
    name = created.json()["name"]
    try:
        for method, path in (("GET", f"/user/alice/api/terminals/{name}"), ("DELETE", f"/user/alice/api/terminals/{name}")):
            assert bob.api(method, path, allow_redirects=False).status_code in (302, 403), (method, path)
        import websocket
        url = bob.url(f"/user/alice/terminals/websocket/{name}").replace("http", "ws", 1)
        try:
            ws = websocket.create_connection(url, header=[f"Authorization: token {bob.token}"], timeout=10)
        except websocket.WebSocketBadStatusException as refused:
            assert refused.status_code in (302, 403), refused.status_code
        else:
            ws.close()
            raise AssertionError("bob opened alice's terminal")
        # Her terminal's shell, from bob's shell on the login node: not his to see, signal or trace.
        pid = facts(alice.run_in_terminal("echo PID=$$"))["PID"]
        for argv in (["kill", "-0", pid], ["cat", f"/proc/{pid}/environ"], ["ls", f"/proc/{pid}/fd"]):
            tried = subprocess.run(["runuser", "-u", "bob", "--", *argv], capture_output=True, text=True)
            assert tried.returncode != 0, (argv, tried.stdout)
    finally:
        alice.api("DELETE", f"/user/alice/api/terminals/{name}")
