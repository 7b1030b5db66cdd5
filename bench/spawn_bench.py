"""Spawning on the real local cluster: dsportal's hub against stock batchspawner, in the same run.

Both hubs run here, one after the other, on the demo cluster (slurmctld, two slurmd, slapd),
with the same LDAP login, the same user environment and the same slice (partition gpu, 1 GPU,
8 CPUs, 48 GB). Stock is batchspawner 1.3's SlurmSpawner as its README configures it
(``import batchspawner`` in the hub config, ``sudo -E -u {username}`` for sbatch/squeue).

Measured, per hub:
  spawn       POST /users/<u>/server -> the server is ready (median of --rounds, alice alone), and
              of that the time the job waited in Slurm's queue (submitted -> allocated, from the
              slurmctld log: the scheduler's beat, the same for both hubs)
  stop        DELETE -> the hub has no server and Slurm no job (median)
  concurrent  --users start at once: time until the last is ready, and the slurmctld job
              queries (REQUEST_JOB_INFO*, from sdiag) made meanwhile
  queued      the same while a job holds every GPU for --hold s: the job queries made while
              the sessions wait (each stock spawner polls squeue every 0.5 s; dsportal's hub
              shares one squeue per slurm.squeue_interval among all sessions)
  department  a hub for a whole department, one of each kind, in turn; each takes --sequence's steps in
              order without a restart between them (but the kill -9 of the step restart): a class of
              --students (100) logs in and starts a one-core session at once, each runs a cell, all stop
              (bench/class_start.py), waiting on the progress stream as browsers do (browser, again),
              or polling their model every 0.5 s (polling), with --load-users (300) other people clicking
              through the hub (clicking, locust: bench/department.py), with --queued (5,000) jobs held in
              Slurm's queue as well (queued; busy: held jobs, no clicks), right after a kill -9 and restart
              of the hub (restart), and
              after a 40 s SIGSTOP of slurmctld while 5 students start (slurmctld). Each: last and median
              ready, lost, told to retry (429), polls answered 429, first cell, a bystander's hub API
              latency and how many of its calls were shed, the hub's CPU seconds and the peak memory of
              hub and proxy, slurmctld RPCs and job queries per minute, time until every job is gone.
              The hubs' database: their own on the demo's MariaDB (--database), as in production.
  dead job    the session job runs, then its server crashes before answering (a broken user
              environment): time until the hub reports the failure (capped by --start-timeout)
  CPU         a session's start in CPU seconds (its job's processes, read when the hub sees it
              ready: bench/cpu.py) and a kernel's, after its first answer (median)
  kernel start  dsportal only: asking the session for a kernel -> its first answer (start, connect,
              run a cell), for the host's Python, the demo image in Apptainer (--containall) and
              the same image in Charliecloud, side by side in the same session (median)
  ended       a ready session's job is cancelled outside the portal (scancel, as for a node
              failure or the walltime): time until the hub shows the server stopped (median)

  curve       no class: 100, 300, 1,000 and 2,000 people clicking through each hub in turn (bench/curve.py):
              the clicks' p50 and p99, the hub's CPU per request, py-spy of the hub at each point; the knee
              (p99 past 1 s, or more than 1 % shed); drawn as bench/results/curve-DATE.png

Usage (as root, with `make demo` up; `make bench` does both, its demo with a department of 2,000:
DSPORTAL_DEMO_BENCH=1):
  python bench/spawn_bench.py [--rounds 5] [--users alice,bob,carol,dave] [--start-timeout 90]
                              [--students 100] [--load-users 300] [--crowd 1000] [--queued 5000]
                              [--only-department] [--sequence browser,polling,again,...] [--database mariadb|sqlite]
                              [--curve 100,300,1000,2000] [--curve-window 60] [--only-curve]

The last line is the one-line summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import urlparse

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the demo cluster (democluster/) is not installed
import ad_logins  # noqa: E402
import curve  # noqa: E402
from class_start import class_hour, class_start, describe, jobs_of  # noqa: E402
from cpu import job_cpu_seconds, kernel_cpu_seconds  # noqa: E402
from democluster.base import (  # noqa: E402
    CONFIGLESS,
    SLURM_RELEASE,
    directory,
    release_config,
    slurm_conf_path,
    slurm_prefix,
)
from department import HubLoad, queued_jobs  # noqa: E402
from hubclient import HubUser, active_jobs  # noqa: E402  (the tests' client: login, spawn, stop)

# The demo's settings; on another Slurm release (make bench SLURM=24.11) those the demo derives for it.
CONFIG = release_config(REPO / "config" / "portal.yaml")
# The hubs it starts (`dsportal --config ... hub`) read the demo's settings on purpose (settings.refuse_demo).
os.environ.setdefault("DSPORTAL_DEMO", "1")
PASSWORDS = {u["name"]: u["password"] for u in directory()["users"]}  # course students included
ENV = Path(sys.executable).parent
SLICE = {"profile": "gpu", "gpus": 1}

STOCK_CONFIG = """
import batchspawner  # noqa: F401  (registers the port API: without it no session ever reports)
from portal.core import settings
from portal.hub.auth import configure_ldap

s = settings.load({config!r})
configure_ldap(c, s)
c.JupyterHub.bind_url = {bind!r}
c.JupyterHub.hub_bind_url = {hub!r}
c.ConfigurableHTTPProxy.api_url = {proxy!r}
c.ConfigurableHTTPProxy.command = {chp!r}
c.JupyterHub.db_url = {db_url!r}
c.JupyterHub.cookie_secret_file = "{data}/cookie_secret"
c.JupyterHub.pid_file = "{data}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{data}/proxy.pid"
c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.Spawner.start_timeout = {start_timeout}
c.Spawner.http_timeout = 60
c.SlurmSpawner.req_runtime = "08:00:00"
{slice}
c.SlurmSpawner.req_prologue = "export PATH={env}/bin:$PATH"
c.SlurmSpawner.req_keepvars_extra = "PATH"  # else srun runs the server without that PATH
c.Spawner.env_keep = ["LANG", "SLURM_CONF"]
{slurm}"""
# Stock on another Slurm release than the machine's own (make bench SLURM=24.11): its commands by path, as a site
# with Slurm in /opt/slurm/bin configures batchspawner (sudo gives the commands its own secure PATH).
STOCK_SLURM = """c.SlurmSpawner.batch_submit_cmd = "{bin}/sbatch --parsable"
c.SlurmSpawner.batch_query_cmd = "{bin}/squeue -h -j {{job_id}} -o '%T %B'"
c.SlurmSpawner.batch_cancel_cmd = "{bin}/scancel {{job_id}}"
c.SlurmSpawner.req_srun = "{bin}/srun"
"""


# Stock's slice: the same as dsportal's request (SLICE), or a class's one core (CLASS_SLICE).
STOCK_SLICE = 'c.SlurmSpawner.req_partition = "gpu"\nc.SlurmSpawner.req_gres = "gpu:1"\nc.SlurmSpawner.req_nprocs = "8"\n' \
              'c.SlurmSpawner.req_memory = "48G"'
STOCK_CLASS_SLICE = 'c.SlurmSpawner.req_partition = "cpu"\nc.SlurmSpawner.req_nprocs = "1"\n' \
                    'c.SlurmSpawner.req_memory = "2G"\nc.SlurmSpawner.req_options = "--account=class101"\n' \
                    'c.SlurmSpawner.req_runtime = "02:00:00"  # the cpu partition allows 4 h at most'
CLASS_SLICE = {"profile": "class"}
# --class-profile class-gpu: each student a ¼ GPU on the demo's share node (Slurm's shard GRES), her
# share's 2 cores and 12 GB; stock asks Slurm for the same shard through its req_gres.
STOCK_SHARE_SLICE = 'c.SlurmSpawner.req_partition = "share"\nc.SlurmSpawner.req_gres = "shard:1"\n' \
                    'c.SlurmSpawner.req_nprocs = "2"\nc.SlurmSpawner.req_memory = "12G"\n' \
                    'c.SlurmSpawner.req_options = "--account=class101"\nc.SlurmSpawner.req_runtime = "02:00:00"'
CLASS_PROFILES = {"class": (CLASS_SLICE, STOCK_CLASS_SLICE), "class-gpu": ({"profile": "class-gpu"}, STOCK_SHARE_SLICE)}


def server_database(name: str, data: Path) -> tuple[str, Path]:
    """A fresh database of its own on the demo's MariaDB (as the demo hub's, in production: a server
    database): (its SQLAlchemy URL without the password, the password's file)."""
    from democluster.accounting import MARIADB_PORT
    from democluster.hubdb import create_database, mariadb_socket

    data.mkdir(parents=True, exist_ok=True)
    database, account, password = f"bench_{name}".replace("-", "_"), "dsportal_bench", os.urandom(12).hex()
    subprocess.run(["mariadb", f"--socket={mariadb_socket()}"], input=f"DROP DATABASE IF EXISTS `{database}`;\n",
                   text=True, check=True)
    create_database(mariadb_socket(), database, account, password)
    secret = data / "db-password"
    secret.write_text(password)
    secret.chmod(0o600)
    return f"mysql+pymysql://{account}@127.0.0.1:{MARIADB_PORT}/{database}", secret


def hub_config(kind: str, ports: tuple[int, int, int], data: Path, start_timeout: int, broken: bool,
               for_class: bool = False, database: str = "sqlite") -> list[str]:
    """The command that runs one hub: dsportal from an edited portal.yaml, or stock batchspawner;
    each on its own SQLite file, or (``database`` mariadb) its own database on the demo's MariaDB."""
    config = yaml.safe_load(CONFIG.read_text())
    # The hub API listens where the compute nodes reach it (the login node's address on the node network).
    login = urlparse(config["hub"]["hub_bind_url"]).hostname
    bind, proxy = (f"http://127.0.0.1:{p}" for p in (ports[0], ports[2]))
    hub = f"http://{login}:{ports[1]}"
    db_url, db_password_file = server_database(data.name, data) if database == "mariadb" else (None, None)
    config["hub"].update(bind_url=bind, hub_bind_url=hub, proxy_api_url=proxy, data_dir=str(data),
                         start_timeout=start_timeout, db_url=db_url,
                         db_password_file=str(db_password_file) if db_password_file else None)
    if config["hub"].get("subdomain_host"):  # users' own origins, at this hub's port
        config["hub"]["subdomain_host"] = f"http://localhost:{ports[0]}"
    # Both hubs run as root, as stock batchspawner's does: dsportal's reaches users through the same
    # mediator, with runuser instead of its account's sudo rule.
    config["hub"].pop("account", None)
    config["slurm"]["submit_as"] = "runuser"
    config["hub"].update(external_proxy=False, proxy_token_file=None)  # each hub starts its own proxy, as stock's
    environment = str(broken_environment(data.parent)) if broken else config["session"]["environment"]
    config["session"]["environment"] = environment
    if kind == PLAIN:  # what internal TLS costs the hub: the same hub without it
        config["hub"]["internal_ssl"] = False
    path = data / "portal.yaml"
    data.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    if kind.startswith("dsportal"):
        return [str(ENV / "dsportal"), "--config", str(path), "hub"]
    chp = config["hub"]["proxy_command"]
    stock_db = f"sqlite:///{data}/jupyterhub.sqlite"
    if db_url:  # stock puts the password in the URL, as its docs do
        stock_db = db_url.replace("@", f":{db_password_file.read_text()}@", 1)
    (data / "stock_config.py").write_text(textwrap.dedent(STOCK_CONFIG.format(
        config=str(path), bind=bind, hub=hub, proxy=proxy, chp=chp, data=data, start_timeout=start_timeout,
        env=environment, slice=STOCK_CLASS_SLICE if for_class else STOCK_SLICE, db_url=stock_db,
        slurm=STOCK_SLURM.format(bin=slurm_prefix() / "bin") if SLURM_RELEASE else "")))
    return [str(ENV / "jupyterhub"), "-f", str(data / "stock_config.py")]


CRASH_STEPS = """sleep 5
echo "ImportError: simulated crash of the session server" >&2
exit 1
"""
# the session server of a broken environment: starts, runs a little, dies before answering
CRASH = "#!/bin/sh\n" + CRASH_STEPS


def broken_environment(workdir: Path) -> Path:
    """A user environment whose Jupyter server crashes 5 s after the job started (its Python works)."""
    prefix = workdir / "broken-env"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    real = Path(yaml.safe_load(CONFIG.read_text())["session"]["environment"])
    # dsportal's job starts the server with `python -m portal.session.singleuser`: that one crashes.
    (prefix / "bin" / "python").write_text(
        f'#!/bin/sh\nif [ "$2" = portal.session.singleuser ]; then\n{CRASH_STEPS}fi\nexec {real}/bin/python "$@"\n')
    for name in ("batchspawner-singleuser", "jupyterhub-singleuser"):
        (prefix / "bin" / name).write_text(CRASH)
    for path in (workdir, prefix, prefix / "bin", *(prefix / "bin").iterdir()):
        path.chmod(0o755)
    return prefix


class Hub:
    def __init__(self, kind: str, index: int, workdir: Path, start_timeout: int, broken: bool = False,
                 for_class: bool = False, label: str = "", database: str = "sqlite"):
        self.kind, self.base = kind, f"http://127.0.0.1:{8100 + 10 * index}"
        ports = (8100 + 10 * index, 8101 + 10 * index, 8102 + 10 * index)
        self.data = workdir / f"{kind}{'-broken' if broken else '-class' if for_class else ''}{label}"
        self.command = hub_config(kind, ports, self.data, start_timeout, broken, for_class, database)
        self.log = open(self.data / "hub.log", "ab")
        self._start()

    def kill_and_restart(self) -> None:
        """kill -9 (a crash: no cleanup, its proxy left running), then the same hub started again."""
        self.process.kill()
        self.process.wait()
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.data)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.kind} hub did not start:\n{(self.data / 'hub.log').read_text()[-3000:]}")
            try:
                if requests.get(f"{self.base}/hub/api", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{self.kind} hub did not answer in 60 s")

    def user(self, name: str) -> HubUser:
        return HubUser(self.base, name).must_login(PASSWORDS[name])

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def job_queries() -> int:
    """slurmctld's count of job-information RPCs so far (squeue, scontrol show job, ...)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    return sum(int(n) for n in re.findall(r"REQUEST_JOB_(?:INFO|INFO_SINGLE|USER_INFO)\s+\(\s*\d+\)\s+count:(\d+)", out))


_LOG_TIME = r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] "


def queued_seconds(job_id: str) -> float | None:
    """How long slurmctld held the job before allocating it: its log's submit and allocation lines
    (batch jobs are allocated by the scheduler's periodic pass, or by the backfill pass)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", config, re.M)
    if not found:
        return None
    times = {}
    for line in Path(found.group(1)).read_text(errors="replace").splitlines()[-5000:]:
        if f"JobId={job_id} " not in line:
            continue
        stamp = re.match(_LOG_TIME, line)
        if stamp and "_slurm_rpc_submit_batch_job" in line:
            times["submitted"] = stamp.group(1)
        elif stamp and ("sched: Allocate" in line or "_start_job: Started" in line):
            times["allocated"] = stamp.group(1)
    if len(times) < 2:
        return None
    submitted, allocated = (time.mktime(time.strptime(times[k][:19], "%Y-%m-%dT%H:%M:%S")) + float(times[k][19:])
                            for k in ("submitted", "allocated"))
    return allocated - submitted


def wait_running(job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
        if state.strip() == "RUNNING":
            return
        time.sleep(0.2)
    raise SystemExit(f"job {job_id} did not start")


def wait_gone(user: HubUser, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = user.model()
        if not model.get("servers") and model.get("pending") is None and not active_jobs(user.name):
            return
        time.sleep(0.2)
    raise SystemExit(f"{user.name}'s session did not go away in {timeout} s")


def spawn_seconds(user: HubUser, options: dict, timeout: float) -> float:
    started = time.monotonic()
    response = user.start_server(options)
    if response.status_code not in (201, 202):
        raise SystemExit(f"{user.name}: spawn refused: {response.status_code} {response.text[:300]}")
    user.wait_ready(timeout)
    return time.monotonic() - started


def stop_seconds(user: HubUser) -> float:
    started = time.monotonic()
    response = user.api("DELETE", f"/hub/api/users/{user.name}/server")
    assert response.status_code in (202, 204), response.text
    wait_gone(user)
    return time.monotonic() - started


# A kernel of each runtime in the same session: the host's Python, the demo image through Apptainer
# (--containall) and through Charliecloud.
CONTAINER_KERNELS = {"host": "python3", "apptainer": "dsportal-debian-python", "charliecloud": "dsportal-debian-python-ch"}


def kernel_start_seconds(user, kernel: str) -> float:
    """Wall seconds from asking the session for a kernel to its first answer, as JupyterLab opens
    one: start it, connect its channels, run a cell. (Left running: the session's end stops it.)"""
    started = time.monotonic()
    user.run_code("print(1)", kernel=kernel, timeout=120, keep=True)
    return time.monotonic() - started


def kernel_starts_text(starts: dict) -> str:
    return ", ".join(f"{runtime} {statistics.median(times):.2f} s" for runtime, times in starts.items())


def measure(kind: str, index: int, workdir: Path, args) -> dict:
    options = SLICE if kind == "dsportal" else {}
    result = {"kind": kind}
    hub = Hub(kind, index, workdir, args.start_timeout)
    try:
        alice = hub.user("alice")
        spawns, queued, stops = [], [], []
        for _ in range(args.rounds):
            spawns.append(spawn_seconds(alice, options, args.start_timeout))
            queued.append(queued_seconds(active_jobs("alice")[0]["job_id"]))
            stops.append(stop_seconds(alice))
        result.update(spawn=statistics.median(spawns), spawns=spawns, stop=statistics.median(stops), stops=stops,
                      queued_in_slurm=queued)

        ended, session_cpu, kernel_cpu, kernel_starts = [], [], [], {}
        for _ in range(args.rounds):
            spawn_seconds(alice, options, args.start_timeout)
            job_id = active_jobs("alice")[0]["job_id"]
            session_cpu.append(job_cpu_seconds(job_id))  # what the start cost, read as it became ready
            kernel_cpu.append(kernel_cpu_seconds(alice))
            if kind == "dsportal":  # stock batchspawner's sessions have no container kernels
                for runtime, kernel in CONTAINER_KERNELS.items():
                    kernel_starts.setdefault(runtime, []).append(kernel_start_seconds(alice, kernel))
            started = time.monotonic()
            subprocess.run(["scancel", str(job_id)], check=True)
            wait_gone(alice, timeout=120)
            ended.append(time.monotonic() - started)
        result.update(ended=statistics.median(ended), endeds=ended, session_cpu=statistics.median(session_cpu),
                      session_cpus=session_cpu, kernel_cpu=statistics.median(kernel_cpu), kernel_cpus=kernel_cpu,
                      kernel_starts=kernel_starts)

        users = [hub.user(name) for name in args.users]
        before = job_queries()
        started = time.monotonic()
        with ThreadPoolExecutor(len(users)) as pool:
            each = list(pool.map(lambda u: spawn_seconds(u, options, args.start_timeout), users))
        result.update(concurrent_all=time.monotonic() - started, concurrent_each=each,
                      concurrent_queries=job_queries() - before)
        for user in users:
            stop_seconds(user)

        # The same, while the GPUs are taken: every session waits in the queue for --hold s.
        holder = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--nodes=2", "--gres=gpu:4",
                                 "--job-name=bench-hold", "--output=/dev/null", f"--wrap=sleep {args.hold}"],
                                capture_output=True, text=True, check=True).stdout.strip()
        wait_running(holder)
        before = job_queries()
        started = time.monotonic()
        with ThreadPoolExecutor(len(users)) as pool:
            pool.map(lambda u: spawn_seconds(u, options, args.start_timeout), users)
        result.update(queued_all=time.monotonic() - started, queued_queries=job_queries() - before)
        for user in users:
            stop_seconds(user)
    finally:
        hub.close()

    hub = Hub(kind, index + 2, workdir, args.start_timeout, broken=True)
    try:
        alice = hub.user("alice")
        started = time.monotonic()
        response = alice.start_server(options)
        if response.status_code in (201, 202):
            events = alice.progress_events(timeout=args.start_timeout + 30)
            failed = next((e for e in events if e.get("failed")), None)
            message = (failed or {}).get("message", "no failure reported")
        else:
            message = response.json().get("message", response.text)
        result.update(dead_job=time.monotonic() - started, dead_job_message=message[:200])
        wait_gone(alice, timeout=args.start_timeout + 30)
    finally:
        hub.close()
    return result


KINDS = ("dsportal", "batchspawner")
PLAIN = "dsportal-plain"  # --kinds may add it: dsportal's hub with internal_ssl off (portal.yaml hub.internal_ssl)


def course(name: str) -> list[str]:
    return [u["name"] for u in directory()["users"] if u.get("course") == name]


def nodes_unavailable() -> dict[str, str]:
    """The cluster's nodes that take no new jobs (drained, down, ...): node -> its state and Slurm's reason."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%t|%E"], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        node, state, reason = (line.split("|") + ["", ""])[:3]
        if state.rstrip("*~#$@^-") not in ("idle", "mix", "alloc", "comp"):
            found[node] = f"{state} ({reason})" if reason and reason != "none" else state
    return found


# One hub of each kind takes these in order, without a restart between them (but the one of "restart"):
# an overload must leave nothing behind that slows the next class.
STEPS = {
    "browser": "a class waiting on the progress stream, as browsers do",
    "polling": "a class whose clients each ask for their model every 0.5 s, as scripts and dashboards do",
    "again": "right after, a class waiting on the progress stream again",
    "clicking": "a class with --load-users people clicking through the hub",
    "queued": "a class with --load-users people clicking and --queued other jobs held in the queue",
    "crowd": "a class with --crowd people clicking and --queued other jobs held in the queue",
    "busy": "a class with --queued other jobs held in the queue, no clicks (first in --sequence: the hour's rest "
            "measured beside a department's queue)",
    "restart": "a class right after the hub was killed (kill -9) and started again",
    "slurmctld": "a class right after slurmctld was stopped (SIGSTOP) for 40 s while 5 of its students started",
}


def pause_slurmctld(hub: Hub, seconds: float, starters: list[str]) -> str:
    """SIGSTOP slurmctld for ``seconds`` while ``starters`` ask for sessions, then SIGCONT; what the
    first starter was told meanwhile. Their sessions are stopped before the class."""
    pid = int(subprocess.run(["pgrep", "-o", "-x", "slurmctld"], capture_output=True, text=True, check=True).stdout)
    users = [hub.user(name) for name in starters]
    os.kill(pid, signal.SIGSTOP)
    told = ""
    try:
        answers = [u.start_server(CLASS_SLICE if hub.kind.startswith("dsportal") else {}) for u in users]
        told = f"{answers[0].status_code} {answers[0].text[:200]}"
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    for user in users:
        try:
            events = user.progress_events(timeout=120)
            told += f"; then {events[-1].get('message', '')[:200]!r}" if user is users[0] and events else ""
        except Exception as error:  # noqa: BLE001 - what happened is reported
            told += f"; then {error}" if user is users[0] else ""
        user.api("DELETE", f"/hub/api/users/{user.name}/server")
    leftover_jobs(starters)
    return told


def sequence(args, workdir: Path) -> list[dict]:
    """Each kind's hub takes --sequence's steps in order (STEPS), on one hub: stock batchspawner's
    in the same run, after dsportal's, under the same load."""
    students = course("class101")[:args.students]
    members = course("dept")  # as many as the steps ask for: main checked
    if len(students) < args.students:
        raise SystemExit(f"the demo has {len(students)} students: config/demo/users.yaml declares them (make demo "
                         "makes them)")
    starters = students[:5]  # stopped again before the class starts
    steps = [{"step": step} for step in args.sequence]
    for offset, kind in enumerate(args.kinds):
        hub = Hub(kind, 6 + offset, workdir, args.class_timeout, for_class=True, label="-sequence",
                  database=args.database)
        profiler = profile(hub, args.py_spy, f"{kind}-sequence") if args.py_spy else None
        try:
            for run in steps:
                step, load, told = run["step"], None, ""
                print(f"== {kind}: {STEPS[step]}", flush=True)
                if step == "restart":
                    hub.kill_and_restart()
                if step == "slurmctld":
                    told = pause_slurmctld(hub, 40, starters)
                    print(f"  while slurmctld was stopped, a start was answered: {told}", flush=True)
                clickers = members[:args.crowd if step == "crowd" else args.load_users]
                held_jobs = (queued_jobs(args.queued, clickers, room_for=len(students))
                             if step in ("queued", "crowd", "busy") else nullcontext(0))
                with held_jobs as held:
                    try:
                        if step in ("clicking", "queued", "crowd"):
                            load = HubLoad(hub.base, [(m, PASSWORDS[m]) for m in clickers])
                            print(f"  {load.wait_logged_in(timeout=60 + len(clickers) / 10)} of {len(clickers)} "
                                  "people logged in and clicking", flush=True)
                        result = class_start(hub.user, students, CLASS_SLICE if kind.startswith("dsportal") else {},
                                             hub.user("dave"), args.class_timeout, hub_pid=hub.process.pid,
                                             poll_every=0.5 if step == "polling" else 0.0,
                                             steady=args.steady if run is steps[0] else 0)
                    finally:
                        if load:
                            load.stop()
                leftover_jobs(students)
                drained = nodes_unavailable()
                if drained:  # the next steps' sessions would wait for these nodes: said, not hidden
                    print("  NODES LOST by this step, the next steps are short of them: "
                          + "; ".join(f"{node} {why}" for node, why in drained.items()), flush=True)
                if load:
                    result["load"] = load.window(*result["window"])
                result.update(queued=held, told=told)
                run[kind] = result
                print(f"  class start      {describe(result)}", flush=True)
                if load:
                    print(f"  {len(clickers)} clicking     {clicks(result['load'])}", flush=True)
        finally:
            if profiler:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(timeout=60)
            hub.close()
    return steps


def sequence_summary(steps: list[dict]) -> str:
    parts = []
    for run in steps:
        ours, stock = run["dsportal"], run["batchspawner"]
        text = (f"{run['step']}: last ready {ours['last_ready']:.1f} vs {stock['last_ready']:.1f} s, lost {ours['lost']} "
                f"vs {stock['lost']}, bystander p99 {ours['api_p99']:.2f} vs {stock['api_p99']:.2f} s "
                f"({ours['api_shed']} vs {stock['api_shed']} shed), hub CPU {ours['hub_cpu']:.0f} vs {stock['hub_cpu']:.0f} s")
        if "hub_side_cpu" in ours and "hub_side_cpu" in stock and "load" not in ours:  # a class alone: per student
            text += (f", hub-side CPU per student {ours['hub_side_cpu'] / ours['students']:.3f} vs "
                     f"{stock['hub_side_cpu'] / stock['students']:.3f} "
                     f"({ours['hub_side_cpu'] / max(stock['hub_side_cpu'], 1e-9):.2f}x)")
        if class_hour(ours) is not None and class_hour(stock) is not None:
            text += (f", a class of an hour {class_hour(ours):.3f} vs {class_hour(stock):.3f} per student "
                     f"({class_hour(ours) / max(class_hour(stock), 1e-9):.2f}x)")
        if "load" in ours:
            text += (f", clicks p99 {ours['load']['p99']:.2f} vs {stock['load']['p99']:.2f} s "
                     f"({ours['load'].get('shed', 0)} vs {stock['load'].get('shed', 0)} shed)")
        plain = run.get(PLAIN)
        if plain and "hub_side_cpu" in plain and "load" not in plain:
            text += (f"; without internal TLS: last ready {plain['last_ready']:.1f} s, lost {plain['lost']}, hub-side CPU "
                     f"per student {plain['hub_side_cpu'] / plain['students']:.3f}")
        parts.append(text)
    return " | ".join(parts)


def leftover_jobs(users: list[str], timeout: float = 60) -> None:
    """Cancel what a run left of ``users``' jobs (a session its hub lost), so the next run starts on free nodes."""
    if not jobs_of(users):
        return
    for user in users:  # scancel -u takes one user name
        subprocess.run(["scancel", "-u", user], capture_output=True)
    deadline = time.monotonic() + timeout
    while jobs_of(users) and time.monotonic() < deadline:
        time.sleep(1)


def profile(hub: Hub, py_spy: str, name: str) -> subprocess.Popen:
    """py-spy sampling the hub (its Python threads, idle ones left out) into the hub's folder, collapsed
    stacks (flamegraph.pl or speedscope read them): the class start and whatever follows until stopped."""
    return subprocess.Popen([py_spy, "record", "--nonblocking", "--pid", str(hub.process.pid), "--rate", "50", "--format", "raw",
                             "--output", str(hub.data / f"py-spy-{name}.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def clicks(load: dict) -> str:
    return (f"{load['requests']} requests while the class started ({load['per_second']:.0f}/s), "
            f"p50 {load['p50']:.2f} s, p99 {load['p99']:.2f} s of those answered, {load.get('shed', 0)} shed (429), "
            f"{load['failures']} failed "
            f"({load['logged_in']} of {load['people']} logged in)")


RESULTS = Path(__file__).resolve().parent / "results"


def _commit() -> str:
    found = subprocess.run(["git", "-C", str(RESULTS.parent), "describe", "--always", "--dirty"], capture_output=True,
                           text=True)
    return found.stdout.strip() or "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Slurm allocates batch jobs on its scheduler's once-a-second pass: one spawn varies by up to 1 s
    # for that alone, for both hubs, so a median needs a few rounds.
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ad-logins", type=int, default=100, help="a class of this many logging in at once through "
                        "Active Directory's search bind, both hubs (bench/ad_logins.py; 0: skip)")
    parser.add_argument("--users", default="alice,bob,carol,dave", type=lambda s: s.split(","))
    parser.add_argument("--start-timeout", type=int, default=90, help="both hubs' start_timeout (seconds)")
    parser.add_argument("--hold", type=int, default=20, help="seconds the GPUs are taken in the queued round")
    parser.add_argument("--students", type=int, default=100, help="class start: students starting at once (0: skip "
                        "the department runs)")
    parser.add_argument("--load-users", type=int, default=300, help="people clicking through the hub while the "
                        "class starts (steps clicking and queued)")
    parser.add_argument("--queued", type=int, default=5000, help="other users' jobs held in Slurm's queue (steps queued, "
                        "crowd and busy)")
    parser.add_argument("--crowd", type=int, default=1000, help="people clicking through the hub while the class starts "
                        "(step crowd)")
    parser.add_argument("--curve", type=lambda s: [int(n) for n in s.split(",") if n], default=[100, 300, 1000, 2000],
                        help="the clicks' curve: this many people clicking through each hub in turn, no class "
                        "(bench/curve.py; empty: skip)")
    parser.add_argument("--curve-window", type=float, default=60, help="seconds measured at each point of the curve")
    parser.add_argument("--only-curve", action="store_true", help="the clicks' curve alone")
    parser.add_argument("--class-timeout", type=int, default=300, help="both class hubs' start_timeout, and how long "
                        "a student waits for her session before it counts as lost (seconds)")
    parser.add_argument("--steady", type=float, default=60, help="seconds the class's sessions run untouched while "
                        "slurmctld's job queries and the hub's CPU are counted (first run; 60: two of JupyterHub's "
                        "30 s rounds of checks that each session still runs)")
    parser.add_argument("--kinds", default=",".join(KINDS), type=lambda s: s.split(","),
                        help=f"the department runs' hubs (dsportal,batchspawner; {PLAIN}: dsportal's without internal "
                        "TLS, to see what TLS costs); the summary needs dsportal and batchspawner")
    parser.add_argument("--py-spy", default="", help="py-spy's path: sample each department hub (raw stacks "
                        "in its folder)")
    parser.add_argument("--only-department", action="store_true", help="skip the single spawns, stops, queued and "
                        "dead-job rounds: only the department runs")
    parser.add_argument("--sequence", type=lambda s: s.split(","), default=list(STEPS),
                        help=f"the department runs: one hub of each kind takes these steps in order, without a "
                        f"restart between them ({','.join(STEPS)}): " + "; ".join(f"{k}: {v}" for k, v in STEPS.items()))
    parser.add_argument("--class-profile", choices=tuple(CLASS_PROFILES), default="class",
                        help="the class's sessions: one core each (class), or a ¼ GPU each on the share node "
                        "(class-gpu), stock batchspawner asking for the same slice")
    parser.add_argument("--database", choices=("sqlite", "mariadb"), default="mariadb",
                        help="the department hubs' database: a SQLite file, or a database of each's own on the "
                        "demo's MariaDB (as in production)")
    args = parser.parse_args(argv)
    global CLASS_SLICE, STOCK_CLASS_SLICE
    CLASS_SLICE, STOCK_CLASS_SLICE = CLASS_PROFILES[args.class_profile]
    if os.geteuid() != 0:
        raise SystemExit("run as root, with the demo cluster up (make bench)")
    if not CONFIGLESS:
        os.environ.setdefault("SLURM_CONF", str(slurm_conf_path()))
    busy = [u for u in args.users if active_jobs(u)]
    if busy:
        raise SystemExit(f"these users have jobs on the cluster, stop them first: {', '.join(busy)}")
    unavailable = nodes_unavailable()
    if unavailable:
        raise SystemExit("these nodes take no jobs, and sessions would wait for them (counted lost): "
                         + "; ".join(f"{node} {why}" for node, why in unavailable.items())
                         + ". Find out why (slurmd's log), then: scontrol update nodename=<node> state=resume")
    # Not under /tmp: each job gets a /tmp of its own (job_container/tmpfs), where the broken environment is not.
    workdir = Path(tempfile.mkdtemp(prefix="dsportal-bench-", dir="/var/tmp"))
    results = {}
    unknown = set(args.sequence) - set(STEPS)
    if unknown:
        raise SystemExit(f"--sequence takes {', '.join(STEPS)}, not {', '.join(sorted(unknown))}")
    if args.only_curve:
        args.ad_logins, args.only_department, args.sequence = 0, True, []
    members = course("dept")
    steps = [args.load_users, args.crowd if "crowd" in args.sequence else 0] if args.students and args.sequence else []
    asked = max([*steps, *args.curve], default=0)  # department members the steps and the curve click as
    if len(members) < asked:
        raise SystemExit(f"the demo has {len(members)} department members, the bench asks for {asked}: make bench makes "
                         "its demo with users.yaml's bench_students (DSPORTAL_DEMO_BENCH=1)")
    try:
        if args.ad_logins:
            print(f"== AD logins: {args.ad_logins} students at once, each hub in turn", flush=True)
            results["ad_logins"] = ad_logins.run(args.ad_logins, workdir)
        for index, kind in enumerate(() if args.only_department else KINDS):
            print(f"== {kind}", flush=True)
            results[kind] = measure(kind, 3 * index, workdir, args)
            r = results[kind]
            print(f"  spawn to ready   {r['spawn']:6.2f} s median of {args.rounds} "
                  f"({', '.join(f'{s:.2f}' for s in r['spawns'])}); of these, queued in Slurm "
                  f"({', '.join('?' if q is None else f'{q:.2f}' for q in r['queued_in_slurm'])})")
            print(f"  stop             {r['stop']:6.2f} s median ({', '.join(f'{s:.2f}' for s in r['stops'])})")
            print(f"  session start    {r['session_cpu']:6.2f} CPU-s median, the job's processes when ready "
                  f"({', '.join(f'{s:.2f}' for s in r['session_cpus'])}); a kernel's first answer "
                  f"{r['kernel_cpu']:.2f} CPU-s ({', '.join(f'{s:.2f}' for s in r['kernel_cpus'])})")
            if r["kernel_starts"]:
                print(f"  kernel start     {kernel_starts_text(r['kernel_starts'])} (median of {args.rounds}; "
                      f"each {r['kernel_starts']})")
            print(f"  ended outside    {r['ended']:6.2f} s median until the hub shows it stopped after an external "
                  f"scancel ({', '.join(f'{s:.2f}' for s in r['endeds'])})")
            print(f"  {len(args.users)} at once       {r['concurrent_all']:6.2f} s until all ready "
                  f"(each {', '.join(f'{s:.1f}' for s in r['concurrent_each'])}); "
                  f"{r['concurrent_queries']} slurmctld job queries")
            print(f"  {len(args.users)} queued       {r['queued_all']:6.2f} s until all ready behind a {args.hold} s job "
                  f"holding every GPU; {r['queued_queries']} slurmctld job queries")
            print(f"  dead job         {r['dead_job']:6.2f} s until the user is told: {r['dead_job_message']!r}",
                  flush=True)
        if args.students and args.sequence:
            results["department"] = sequence(args, workdir)
        if args.curve:
            print(f"== the clicks' curve: {', '.join(map(str, args.curve))} people, each hub in turn", flush=True)
            results["curve"] = {}
            curve.run(lambda kind: Hub(kind, 8 + args.kinds.index(kind), workdir, args.class_timeout, for_class=True,
                                       label="-curve", database=args.database),
                      args.kinds, args.curve, [(m, PASSWORDS[m]) for m in members], args.curve_window, workdir,
                      results["curve"])
    finally:
        leftover_jobs(args.users + course("class101") + course("dept"))  # nothing of the bench stays on the cluster
        subprocess.run(["scancel", "--name=bench-hold"], capture_output=True)
        # What was measured, kept even when a later part failed.
        (workdir / "results.json").write_text(json.dumps(results, indent=1))
        # The dated, machine-readable copy that stays with the code (bench/results/README.md sums them up).
        dated = RESULTS / f"spawn-bench-{time.strftime('%Y-%m-%d-%H%M', time.gmtime())}.json"
        dated.write_text(json.dumps({"argv": sys.argv[1:], "commit": _commit(), "date": dated.stem[len("spawn-bench-"):],
                                     "results": results}, indent=1))
        print(f"(hub logs and results.json in {workdir}; a copy in {dated})", flush=True)
    if results.get("curve"):
        png = dated.with_name(dated.stem.replace("spawn-bench", "curve") + ".png")
        try:
            curve.plot(dated, png)
            print(f"(the curve drawn in {png})")
        except (OSError, subprocess.CalledProcessError) as error:
            print(f"(the curve not drawn: {error}; bench/plot_curve.py {dated} {png} draws it)")
    both = set(KINDS) <= set(args.kinds)
    in_department = ""
    if "department" in results:
        in_department = (f"one hub each, in order, {args.database}, class profile {args.class_profile}: "
                         f"{sequence_summary(results['department'])}" if both
                         else "; ".join(f"{run['step']}: {describe(run[kind])}" for run in results["department"]
                                        for kind in args.kinds))  # one kind: its figures alone, not a summary
    if "ad_logins" in results:
        in_department += (" | " if in_department else "") + ad_logins.summary(results["ad_logins"], args.ad_logins)
    if "curve" in results:
        in_department += (" | " if in_department else "") + curve.summary(results["curve"])
    if args.only_department:
        print(f"bench: {in_department}")
        return 0
    ours, stock = results["dsportal"], results["batchspawner"]
    def queued(r):  # median time in Slurm's queue over the spawn rounds
        known = [q for q in r["queued_in_slurm"] if q is not None]
        return f"{statistics.median(known):.2f}" if known else "?"

    print(f"bench: spawn {ours['spawn']:.2f} s vs stock batchspawner {stock['spawn']:.2f} s "
          f"({ours['spawn'] / stock['spawn']:.2f}x; queued in Slurm {queued(ours)} vs {queued(stock)} s) | "
          f"session start {ours['session_cpu']:.2f} vs {stock['session_cpu']:.2f} CPU-s, kernel "
          f"{ours['kernel_cpu']:.2f} vs {stock['kernel_cpu']:.2f} CPU-s | "
          f"kernel start {kernel_starts_text(ours['kernel_starts'])} | "
          f"stop {ours['stop']:.2f} vs {stock['stop']:.2f} s | external scancel seen in {ours['ended']:.1f} vs "
          f"{stock['ended']:.1f} s | {len(args.users)} at once "
          f"{ours['concurrent_all']:.2f} vs {stock['concurrent_all']:.2f} s with "
          f"{ours['concurrent_queries']} vs {stock['concurrent_queries']} slurmctld job queries | queued "
          f"{ours['queued_queries']} vs {stock['queued_queries']} job queries | "
          f"dead job reported in {ours['dead_job']:.1f} vs {stock['dead_job']:.1f} s "
          f"(start_timeout {args.start_timeout} s)" + (f" | {in_department}" if in_department else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
