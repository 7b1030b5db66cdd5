"""Issue 51, the terminal: JupyterLab's terminal runs in the session's Slurm job, as its user, inside
her slice (its cores, its memory limit, its GPUs), and no other user reaches it: not through her
server, not by its process, not from his own job on her node."""

from __future__ import annotations

import re
import subprocess

from hubclient import active_jobs, slice_memory_limit
from test_gauges import GiB

# The slice as the terminal's own shell sees it; its memory limit read from the shell's own cgroup (the cgroup
# reader of the gauges, given the shell's /proc entry).
SLICE = ("echo USER=$(id -un); echo CPUS=$SLURM_CPUS_ON_NODE; echo NPROC=$(nproc); echo JOB=$SLURM_JOB_ID; "
         "echo GPUS=$CUDA_VISIBLE_DEVICES; echo PID=$$; echo HOST=$(hostname); "
         "echo MEM=$(/opt/dsportal/env/bin/python -c 'import pathlib, sys; from portal.session.usage.sliceusage import "
         "SliceUsage; print(SliceUsage(proc=pathlib.Path(\"/proc\", sys.argv[1])).memory_limit())' $$)")


def facts(output: str) -> dict[str, str]:
    """NAME=value lines the terminal printed (the last of each: the typed command echoes the names first)."""
    return dict(re.findall(r"\b(USER|CPUS|NPROC|JOB|GPUS|MEM|PID|HOST)=([^\r\n]*)", output))


def test_the_terminal_runs_as_her_in_her_slice_and_bob_reaches_it_from_nowhere(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 2})  # 16 CPUs, 96 GB
    job = active_jobs("alice")[0]
    seen = facts(alice.run_in_terminal(SLICE))
    assert seen["USER"] == "alice" and seen["JOB"] == str(job["job_id"]), seen
    # Slurm's 16 CPUs; the cores its cpuset lets her use: at most those (the demo's nodes share 2 real cores).
    assert seen["CPUS"] == "16" and 1 <= int(seen["NPROC"]) <= 16, seen
    expected = slice_memory_limit(96 * GiB)  # Slurm's limit, page-aligned by the kernel
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
