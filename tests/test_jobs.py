"""Issue 7: multi-node MPI jobs launched from a session, every rank's log streamed back live.

Real parts only: alice's JupyterLab runs in a Slurm job; its job launcher (server extension)
sbatches a 2-node job as alice; srun --mpi=pmi2 (gpu profile) or mpirun (cpu profile) starts
the ranks on node1 and node2, each inside the Charliecloud image with real PyTorch + Horovod.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import requests
import websocket

from hubclient import SLURM_ENV, active_jobs, receive, squeue_jobs

ALLREDUCE = """
import os, socket, time
import torch
import horovod.torch as hvd
hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()} "
      f"local_rank {hvd.local_rank()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
mark = f"/dev/shm/dsportal-test-{os.environ['SLURM_JOB_ID']}-"
open(mark + str(hvd.rank()), "w").close()
time.sleep(6)  # the job is still running while the test sees these first lines
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
print(f"rank {hvd.rank()} allreduce sum {total.item():.0f}", flush=True)
peers = sorted(int(name.rsplit("-", 1)[1]) for name in os.listdir("/dev/shm") if ("/dev/shm/" + name).startswith(mark))
print(f"rank {hvd.rank()} shares /dev/shm with ranks {peers}", flush=True)
"""

DIGITS = """
import torch, horovod.torch as hvd
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
X, y = load_digits(return_X_y=True)
Xtr, Xte, ytr, yte = train_test_split(X / 16.0, y, test_size=0.25, random_state=0)
Xtr, Xte = torch.tensor(Xtr, dtype=torch.float32), torch.tensor(Xte, dtype=torch.float32)
ytr, yte = torch.tensor(ytr), torch.tensor(yte)
Xtr, ytr = Xtr[hvd.rank()::hvd.size()], ytr[hvd.rank()::hvd.size()]  # this rank's shard
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.003 * hvd.size()),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for epoch in range(1, 6):
    for i in range(0, len(Xtr), 32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(Xtr[i:i + 32]), ytr[i:i + 32]).backward()
        opt.step()
    with torch.no_grad():
        acc = hvd.allreduce((model(Xte).argmax(1) == yte).float().mean(), name="acc")
    print(f"epoch {epoch}: {len(Xtr)} samples on this rank, test accuracy {acc.item():.3f}", flush=True)
"""


def jobs_api(user, method: str, path: str = "", owner: str | None = None, **kwargs) -> requests.Response:
    return user.api(method, f"/user/{owner or user.name}/dsportal/api/jobs{path}", **kwargs)


def stream(user, job_id: int, timeout: float = 240, on_line=None, owner: str | None = None) -> list[dict]:
    """Every message of the job's websocket until it closes, each with its arrival time."""
    url = user.url(f"/user/{owner or user.name}/dsportal/api/jobs/{job_id}/stream").replace("http", "ws", 1)
    ws = websocket.create_connection(url,
                                     header=[f"Authorization: token {user.token}"], timeout=timeout)
    messages, deadline = [], time.monotonic() + timeout
    try:
        while True:
            try:
                raw = receive(ws, deadline)
            except websocket.WebSocketConnectionClosedException:
                break
            if raw is None:
                raise AssertionError(f"job {job_id}'s stream did not end within {timeout} s: {messages[-5:]}")
            if not raw:
                break
            message = json.loads(raw)
            message["arrived"] = time.monotonic()
            messages.append(message)
            if on_line and message["type"] == "line":
                on_line(message, messages)
            if message["type"] == "state":
                break
    finally:
        ws.close()
    return messages


def stream_noting_state(user, job_id: int) -> tuple[list[dict], dict[int, str]]:
    """The job's stream, and Slurm's state of the job when each rank's first 'rank ...' line arrived."""
    seen = {}

    def check_running(message, messages):
        rank = message["rank"]
        if rank is not None and rank not in seen and message["line"].startswith("rank "):
            seen[rank] = scontrol_state(job_id)

    return stream(user, job_id, on_line=check_running), seen


def stdout_by_rank(messages: list[dict]) -> dict[int, list[str]]:
    found = {}
    for m in messages:
        if m["type"] == "line" and m["rank"] is not None and m["stream"] == "stdout":
            found.setdefault(m["rank"], []).append(m["line"])
    return found


def scontrol_state(job_id: int) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True,
                         env=SLURM_ENV).stdout
    fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
    return fields.get("JobState", "")


@pytest.fixture
def alice_session(alice):
    alice.spawn({"profile": "gpu", "gpus": 1})
    return alice


def test_horovod_allreduce_streams_every_rank_live(alice_session):
    alice = alice_session
    response = jobs_api(alice, "POST", json={"code": ALLREDUCE, "nodes": 2, "gpus_per_node": 2, "image": "horovod"})
    assert response.status_code == 201, response.text
    job = response.json()["job"]
    job_id = job["job_id"]
    assert job["ranks"] == 4 and job["partition"] == "gpu"

    messages, seen_while_running = stream_noting_state(alice, job_id)
    lines = [m for m in messages if m["type"] == "line"]
    by_rank = stdout_by_rank(messages)
    assert sorted(by_rank) == [0, 1, 2, 3], messages
    # Every rank's first line arrived while Slurm still had the job RUNNING, not after the end.
    assert seen_while_running == {r: "RUNNING" for r in range(4)}, seen_while_running
    for rank, rank_lines in by_rank.items():
        assert f"rank {rank} of 4" in rank_lines[0]
        assert f"rank {rank} allreduce sum 6" in rank_lines, rank_lines
    # Two ranks per node (each node a host of its own: its hostname), two GPUs each node (Slurm's GRES
    # slice reaches into the container).
    nodes = {m["line"].split(" on ")[1].split()[0] for m in lines if " of 4 on " in m["line"]}
    assert nodes == {"node1", "node2"}
    assert all("CUDA_VISIBLE_DEVICES=" in first and len(first.split("CUDA_VISIBLE_DEVICES=")[1].split(",")) == 2
               for first in (by_rank[r][0] for r in range(4)))
    # The two ranks of a node, each in a container of its own, share the node's /dev/shm (MPI's and
    # NCCL's shared-memory transports), and Horovod counts them 0 and 1 on their node.
    node_of = {r: by_rank[r][0].split(" on ")[1].split()[0] for r in range(4)}
    for rank in range(4):
        together = sorted(r for r in range(4) if node_of[r] == node_of[rank])
        assert f"rank {rank} shares /dev/shm with ranks {together}" in by_rank[rank], by_rank[rank]
    for node in ("node1", "node2"):
        assert sorted(int(by_rank[r][0].split("local_rank ")[1].split()[0]) for r in range(4) if node_of[r] == node) == [0, 1]
    first_line = min(m["arrived"] for m in lines if m["rank"] is not None)
    final = messages[-1]
    assert final["type"] == "state" and final["state"] == "COMPLETED" and final["exit_code"] == "0:0", final
    assert final["arrived"] - first_line > 3, "lines came only at the end"

    # A new client (a browser reload) gets the whole log again, then the final state.
    again = stream(alice, job_id)

    def per_source(messages):
        found = {}
        for m in messages:
            if m["type"] == "line":
                found.setdefault((m["rank"] if m["rank"] is not None else -1, m["stream"]), []).append(m["line"])
        return found

    assert per_source(again) == per_source(lines)
    assert again[-1]["state"] == "COMPLETED"
    listed = jobs_api(alice, "GET").json()["jobs"]
    assert any(j["job_id"] == job_id and j["state"] == "COMPLETED" for j in listed)


def test_cancel_ends_the_stream_with_cancelled(alice_session):
    alice = alice_session
    code = "import time\nprint('working', flush=True)\ntime.sleep(600)\n"
    response = jobs_api(alice, "POST", json={"code": code, "nodes": 2, "gpus_per_node": 1, "image": "horovod"})
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["job_id"]
    cancelled = {}

    def cancel_once_running(message, messages):
        if not cancelled and message["line"] == "working":
            cancelled["response"] = jobs_api(alice, "DELETE", f"/{job_id}")

    messages = stream(alice, job_id, timeout=120, on_line=cancel_once_running)
    assert cancelled["response"].status_code == 202, cancelled["response"].text
    assert messages[-1]["type"] == "state" and messages[-1]["state"] == "CANCELLED", messages[-3:]
    assert job_id not in {j["job_id"] for j in active_jobs("alice")}
    assert squeue_jobs()[job_id]["job_state"] == "CANCELLED"


BAD_JOBS = [
    ({"code": "print(1)", "nodes": 0}, "at least 1 node"),
    ({"code": "print(1)", "nodes": 3}, "3 nodes is more than GPU partition allows for one job (2)"),
    ({"code": "print(1)", "gpus_per_node": 8}, "8 GPUs per node is more than a node of partition gpu has (4)"),
    ({"code": "print(1)", "gpus_per_node": 3}, "3 GPUs per node is not offered"),
    ({"code": "print(1)", "nodes": "two"}, "nodes must be a whole number"),
    ({"code": "print(1)", "image": "tensorflow"}, "unknown image 'tensorflow'"),
    ({"code": "print(1)", "image": "pytorch"}, "image pytorch is unavailable"),
    ({"code": "print(1)", "profile": "staff"}, "not permitted partition profile 'staff'"),
    ({"code": "print(1)", "walltime": "99:00:00"}, "longer than the 12:00:00"),
    ({"script": "train.py; touch /var/tmp/dsportal-pwned"}, "no such script"),
    ({"script": "x.py", "code": "print(1)"}, "give one of 'script'"),
    ({"code": "print(1)", "env": {"A; touch /var/tmp/dsportal-pwned": "1"}}, "is not valid"),
    ({"code": "print(1)", "env": {"SLURM_JOB_UID": "0"}}, "cannot be overridden"),
    ({"code": "print(1)", "name": "x\n#SBATCH --uid=0"}, "may hold only letters"),
    ({"code": "print(1)", "uid": 0}, "unknown field(s) 'uid'"),
]


def test_bad_job_requests_are_refused_and_submit_nothing(alice_session):
    from test_profiles import probe_job_id

    alice = alice_session
    before = probe_job_id()
    for request, expected in BAD_JOBS:
        response = jobs_api(alice, "POST", json=request)
        assert response.status_code == 400, (request, response.status_code, response.text)
        message = response.json()["message"]
        assert message.startswith("Your job request was refused: ") and expected in message, (request, message)
    response = jobs_api(alice, "POST", data="not json")
    assert response.status_code == 400 and "not JSON" in response.json()["message"]
    assert probe_job_id() == before + 1, "a refused job request reached Slurm"
    assert not os.path.exists("/var/tmp/dsportal-pwned")


def test_only_the_owner_reaches_the_launcher(alice_session, bob):
    alice = alice_session
    response = jobs_api(alice, "POST", json={"code": "print('mine')", "nodes": 1, "gpus_per_node": 0,
                                             "profile": "cpu"})
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["job_id"]
    for method, path, body in (("GET", "", None), ("POST", "", {"code": "print(1)"}), ("GET", f"/{job_id}", None),
                               ("DELETE", f"/{job_id}", None)):
        as_bob = jobs_api(bob, method, path, owner="alice", json=body)
        assert as_bob.status_code == 403, (method, path, as_bob.status_code)
        anonymous = requests.request(method, alice.url(f"/user/alice/dsportal/api/jobs{path}"), json=body,
                                     allow_redirects=False, timeout=30)
        assert anonymous.status_code in (302, 403), (method, path, anonymous.status_code)
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        stream(bob, job_id, owner="alice")
    assert refused.value.status_code == 403
    assert jobs_api(alice, "GET", "/999999").status_code == 404


def test_horovod_magic_trains_digits_with_mpirun(alice_session):
    """The %%horovod cell magic in the session's Python kernel: a real Horovod training on the
    digits data, 2 nodes x 2 ranks through mpirun (cpu profile), its output live in the cell."""
    alice = alice_session
    cell = "%%horovod --profile cpu --nodes 2 --tasks-per-node 2 --image horovod\n" + DIGITS
    output = alice.run_code(cell, timeout=300)
    assert "Submitted job" in output and "2 node(s) x 2 rank(s)" in output and "mpirun" in output, output
    for rank in range(4):
        assert f"[rank {rank}] epoch 5:" in output, output
    final = [line for line in output.splitlines() if line.startswith("[rank 0] epoch 5:")][0]
    assert float(final.rsplit(" ", 1)[1]) >= 0.9, final
    assert "COMPLETED (exit code 0:0)" in output, output


def test_policy_and_slice_are_served_to_the_owner(alice_session, bob):
    policy = alice_session.api("GET", "/user/alice/dsportal/api/policy").json()
    assert [p["name"] for p in policy["profiles"]] == ["gpu", "cpu", "scavenger"]  # staff is not alice's
    assert policy["node_gpus"] == {"gpu": 4, "cpu": 4, "scavenger": 4}
    assert policy["node_count"] == {"gpu": 2, "cpu": 2, "scavenger": 2}
    # The status bar's slice: what the session job holds (gpu profile, 1 GPU: 8 CPUs, 48 GB, 8 h).
    found = alice_session.api("GET", "/user/alice/dsportal/api/slice").json()
    job = active_jobs("alice")[0]
    assert found["job_id"] == job["job_id"] and found["partition"] == "gpu" and found["node"] == job["nodes"]
    assert (found["gpus"], found["cpus"], found["memory_mb"], found["time_limit_s"]) == (1, 8, 48 * 1024, 8 * 3600)
    assert 8 * 3600 - 600 < found["time_left_s"] <= 8 * 3600, found
    for path in ("policy", "slice"):
        assert bob.api("GET", f"/user/alice/dsportal/api/{path}", allow_redirects=False).status_code in (302, 403)


# -- the batch script itself (no cluster needed) ------------------------------------------
def _policy(**jobs_settings):
    from portal.core.rules import LaunchPolicy
    from portal.core.settings import Image, Profile

    profile = Profile(name="gpu", partition="gpu", display_name="GPU", account="proj1",
                      jobs={"launcher": "srun", "mpi_plugin": "pmix", **jobs_settings})
    image = Image(name="ngc", display_name="NGC", source="docker://x", path="/images/ngc.sif", runtime="apptainer")
    return LaunchPolicy(profiles=[profile], default_profile="gpu", images=[image],
                        node_gpus={"gpu": 8}, node_count={"gpu": 4})


@pytest.mark.quick
def test_srun_launch_with_apptainer_ranks(tmp_path, monkeypatch):
    from portal.session.job import launcher as jobs

    monkeypatch.setattr(jobs, "image_status", lambda image: ("built", str(image.path)))
    policy = _policy()
    plan = jobs.plan({"code": "print(1)", "nodes": 4, "gpus_per_node": 4, "image": "ngc",
                          "env": {"NCCL_DEBUG": "INFO", "MY_VAR": "$(touch /var/tmp/dsportal-pwned)"},
                          "args": ["--lr", "0.1; rm -rf ~"]}, policy, tmp_path)
    script = jobs.render_script(plan, policy, "/home/u/.dsportal/jobs/x", "/home/u/.dsportal/jobs/x/cell.py",
                                "/home/u")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=4", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --gres=gpu:4", "#SBATCH --mem=196608M", "#SBATCH --account=proj1",
                 "export NCCL_DEBUG=INFO", "export MY_VAR='$(touch /var/tmp/dsportal-pwned)'",
                 "export NCCL_SOCKET_IFNAME='^lo,docker0'"):
        assert line in script, line
    launch = next(line for line in script.splitlines() if line.strip().startswith("apptainer"))
    assert "srun --mpi=pmix --kill-on-bad-exit=1" in script
    assert launch.split() == ["apptainer", "exec", "--nv", "--bind", "/home/u:/home/u", "/images/ngc.sif", "python3",
                              "-u", "/home/u/.dsportal/jobs/x/cell.py", "--lr", "'0.1;", "rm", "-rf", "~'"]
    # The same plan under mpirun: Open MPI maps the ranks, the rest is identical.
    policy = _policy(launcher="mpirun")
    plan = jobs.plan({"code": "print(1)", "nodes": 2}, policy, tmp_path)
    script = jobs.render_script(plan, policy, "/j", "/j/cell.py", "/home/u")
    assert 'mpirun -np "$SLURM_NTASKS" -bind-to none -map-by slot' in script and "srun" not in script


def test_job_list_is_newest_first_even_when_slurm_ids_restart(portal, tmp_path):
    """A reset Slurm state starts job ids again at 1: the newest job must still head the list."""
    from portal.session.job import launcher as jobs

    root = jobs.jobs_root(str(tmp_path))
    root.mkdir(parents=True)
    for stamp, job_id, state in (("20260101-100000-aaaaaa", 900, "COMPLETED"),
                                 ("20260101-110000-bbbbbb", 950, "CANCELLED"),
                                 ("20260102-090000-cccccc", 3, "COMPLETED")):  # after the reset
        folder = root / stamp
        folder.mkdir()
        info = jobs.JobInfo(job_id=job_id, name=f"job{job_id}", folder=str(folder), submitted=0, nodes=1, ranks=1,
                            gpus_per_node=0, partition="cpu", image=None, script="x.py")
        (folder / "job.json").write_text(json.dumps(info.as_dict()))
        (folder / "state.json").write_text(json.dumps({"state": state, "reason": "", "exit_code": "0:0",
                                                      "node_list": "node1"}))
        (root / str(job_id)).symlink_to(stamp)
    assert [j.job_id for j in jobs.list_jobs(str(tmp_path))] == [3, 950, 900]
    assert [j.job_id for j in jobs.list_jobs(str(tmp_path), limit=1)] == [3]


def test_a_neighbour_s_job_named_like_a_line_of_hers_does_not_end_her_job_in_the_list(portal, tmp_path, monkeypatch):
    """Without PrivateData=jobs (Slurm's default; the demo sets it) everyone's jobs are listed, and
    scontrol prints a job's name with its line breaks: bob's `sbatch -J $'x\\nJobId=<hers>
    JobState=COMPLETED'` prints a line that reads as hers. The session asks Slurm only about her own
    jobs, each by its id; here an scontrol that lists everyone's, bob's forged line among them."""
    from portal.session.job import launcher as jobs
    from portal.slurm.slurmclient import SlurmCommands

    env = {**os.environ, **SLURM_ENV}
    job_id = int(subprocess.run(["runuser", "-u", "alice", "--", "sbatch", "--parsable", "-p", "cpu", "-t", "2",
                                 "--wrap", "sleep 120"], env=env, capture_output=True, text=True,
                                check=True).stdout.split(";")[0])
    try:
        wrapper = tmp_path / "bin"
        wrapper.mkdir()
        real = subprocess.run(["which", "scontrol"], capture_output=True, text=True, check=True).stdout.strip()
        (wrapper / "scontrol").write_text(
            "#!/bin/sh\n"
            f"{real} \"$@\"; status=$?\n"
            # everyone's jobs, as without PrivateData=jobs: bob's forged line comes after hers
            f"[ \"$*\" = 'show job -o' ] && echo 'JobId={job_id} JobState=COMPLETED Reason=None ExitCode=0:0'\n"
            "exit $status\n")
        (wrapper / "scontrol").chmod(0o755)
        monkeypatch.setattr(jobs, "slurm", lambda: SlurmCommands(env={**env, "PATH": f"{wrapper}:{env['PATH']}"}))
        root = jobs.jobs_root(str(tmp_path))
        folder = root / "20260101-100000-aaaaaa"
        folder.mkdir(parents=True)
        info = jobs.JobInfo(job_id=job_id, name="hers", folder=str(folder), submitted=0, nodes=1, ranks=1,
                            gpus_per_node=0, partition="cpu", image=None, script="x.py")
        (folder / "job.json").write_text(json.dumps(info.as_dict()))
        (root / str(job_id)).symlink_to(folder.name)

        [listed] = jobs.list_jobs(str(tmp_path))
        assert listed.state in ("PENDING", "RUNNING", "CONFIGURING"), listed
        assert not (folder / "state.json").exists()
    finally:
        subprocess.run(["scancel", str(job_id)], env=env, capture_output=True)
