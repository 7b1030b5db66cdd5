"""A class starts at once: N students log in and start a session at the same moment (9:00, the first
lecture), each runs one cell, then all stop. Used by spawn_bench.py on each hub.

Each student waits as her browser does, on the hub's progress stream of her start; or (``poll_every``)
as scripts and dashboards do, asking the hub for her own model (GET /hub/api/users/<name>) every
``poll_every`` seconds until it shows her session ready, whatever the hub answers meanwhile (a 429
does not slow such a script down).

Reported: logins, last and median ready (from the moment all asked), sessions lost, starts the hub
refused past its concurrent_spawn_limit (429: the student waits as told, Retry-After, and asks again;
lost only if never ready), the first cell's answer, a bystander's (an admin's) hub API latency while
it happens, slurmctld's RPCs by type (sdiag) and its job queries per minute, while the class starts
and while it runs (``steady`` seconds with every session up), the hub's CPU seconds (its own, its
commands' and its service's) while the class starts, while it runs and while it stops (what a class of an
hour costs the hub per student: :func:`class_hour`), the peak memory of the hub and its proxy (bench/department.py), and the time until
every job of the class is gone. The students' clients stand in for browsers on machines of their
own: they run niced, and the bystander calls from its own process.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import requests

import hubclient
from hubclient import HubUser
from hubprocess import HubResources

JOB_QUERIES = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_USER_INFO")
MOST_RETRIES = 10  # a student told to retry (429) asks again at most this often


def job_queries_in(rpcs: dict[str, int]) -> int:
    """slurmctld's job-information RPCs (squeue, scontrol show job, ...) among ``rpcs``."""
    return sum(rpcs.get(name, 0) for name in JOB_QUERIES)


def rpc_counts() -> dict[str, int]:
    """slurmctld's RPC counts by message type so far (sdiag)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    return {name: int(count) for name, count in re.findall(r"^\s*(REQUEST_\w+|MESSAGE_\w+)\s+\(\s*\d+\)\s+count:(\d+)",
                                                          out, flags=re.MULTILINE)}


def machine_busy() -> tuple[float, int]:
    """(CPU seconds this machine's CPUs were busy so far, how many CPUs it has), from /proc/stat: every
    process counted, the hub's, the proxy's, Slurm's, the sessions' and these clients'."""
    fields = [int(f) for f in open("/proc/stat").readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1


def class_jobs_cpu(students: list[str]) -> dict[str, float]:
    """CPU seconds the students' running session jobs used so far, in parts (bench/cpu.py job_cpu_parts):
    ``running`` (servers, kernels still running) and ``reaped`` (kernels shut down after the first cell),
    which add up to all of it, and ``system`` (kernel-mode time of both)."""
    from cpu import job_cpu_parts

    out = subprocess.run(["squeue", "-h", "-t", "R", "-u", ",".join(students), "-o", "%A"],
                         capture_output=True, text=True).stdout
    total = {"running": 0.0, "reaped": 0.0, "system": 0.0}
    for job_id in out.split():
        try:
            parts = job_cpu_parts(int(job_id))
        except (RuntimeError, ValueError):
            continue
        for name, seconds in parts.items():
            total[name] += seconds
    return total


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))] if ordered else float("nan")


class Bystander:
    """An admin's hub API calls (GET /hub/api/users/<self>) every 0.2 s, from a process of its own (not
    behind the GIL of the students' 30 client threads); their latencies."""

    def __init__(self, admin: HubUser):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "bystander", admin.base, admin.name], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
            env={**os.environ, "DSPORTAL_BENCH_TOKEN": admin.token,  # the tests' client, and the demo's package it reads
                 "PYTHONPATH": os.pathsep.join((os.path.dirname(hubclient.__file__),
                                                os.path.dirname(os.path.dirname(hubclient.__file__))))})
        self.latencies: list[float] = []
        self.shed = 0  # calls answered 429 (the hub shedding reads that can wait)

    def stop(self) -> None:
        out, _ = self.process.communicate("stop\n", timeout=60)
        answer = json.loads(out)
        self.latencies, self.shed = answer["latencies"], answer["shed"]


def bystander_main(base: str, name: str) -> None:
    """The bystander's process: calls until a line arrives on stdin, then prints the latencies (JSON)."""
    stopping = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stopping.set()), daemon=True).start()
    admin = HubUser(base, name, token=os.environ["DSPORTAL_BENCH_TOKEN"])
    latencies, shed = [], 0
    while not stopping.is_set():
        started = time.monotonic()
        try:
            shed += admin.api("GET", f"/hub/api/users/{name}").status_code == 429
        except requests.RequestException:  # a failed call counts as slow as it was
            pass
        latencies.append(time.monotonic() - started)
        stopping.wait(0.2)
    print(json.dumps({"latencies": latencies, "shed": shed}))


@contextmanager
def deprioritized(nice: int = 10):
    """The students' clients stand in for browsers on their own machines: niced (threads started
    meanwhile inherit it), they do not take the 2 shared cores from the hub they measure."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def poll_until_ready(user: HubUser, every: float, deadline: float) -> tuple[bool, int, int]:
    """(ready, polls, polls refused 429): her model asked for every ``every`` s until her session is ready."""
    polls = refused = 0
    while time.monotonic() < deadline:
        polls += 1
        try:
            response = user.api("GET", f"/hub/api/users/{user.name}")
        except requests.RequestException:
            response = None
        if response is not None and response.status_code == 429:
            refused += 1
        elif response is not None and response.ok:
            model = response.json()
            server = model.get("servers", {}).get("")
            if server and server.get("ready"):
                user._learn_server_origins(model)
                return True, polls, refused
            if not server and not model.get("pending"):
                return False, polls, refused  # failed: no server, none starting
        time.sleep(every)
    return False, polls, refused


def class_start(login, students: list[str], options: dict, admin: HubUser, timeout: float,
                hub_pid: int | None = None, steady: float = 0, on_start=None, poll_every: float = 0.0) -> dict:
    """``login(name)`` -> a logged-in HubUser of the hub under test; ``hub_pid``: its process, for its
    CPU and memory; ``on_start()``: called (time.time()) as the students press Start; ``poll_every``:
    students poll their model instead of waiting on the progress stream."""
    started = time.monotonic()
    with ThreadPoolExecutor(min(len(students), 32)) as pool:  # as fast as the hub's logins go
        users = list(pool.map(login, students))
    logins = time.monotonic() - started

    resources = HubResources(hub_pid) if hub_pid else None
    bystander = Bystander(admin)
    before = rpc_counts()
    busy_before, cpus = machine_busy()
    clients_before = sum(os.times()[:2])  # this process: the students' clients (threads)
    start, start_wall = time.monotonic(), time.time()
    refused: list[str] = []  # 429s: the message of each
    polled: list[tuple[int, int]] = []  # (polls, of them refused 429) of each polling student
    cell_failures: list[str] = []  # why each failed first cell failed

    def one(user: HubUser) -> tuple[float | None, float | None]:
        """(ready, first cell answered), seconds from the start; None for what did not happen."""
        try:
            for _ in range(MOST_RETRIES):
                response = user.start_server(options)
                if response.status_code != 429:
                    break
                refused.append(response.json().get("message", ""))
                time.sleep(min(float(response.headers.get("Retry-After", 30)), 120))  # as the message says
            if response.status_code not in (201, 202):
                return None, None
            if poll_every:
                ready, polls, shed = poll_until_ready(user, poll_every, start + timeout)
                polled.append((polls, shed))
                if not ready:
                    return None, None
                return cell(user)
            # As her browser's pending page does: the hub's progress stream, one request that the hub
            # writes to until the session is ready. (Asking for her model every second, as before, was
            # 100 API requests a second for a class of 100: the largest share of the hub's CPU.)
            events = user.progress_events(timeout=max(1.0, timeout - (time.monotonic() - start)))
            if not (events and events[-1].get("ready")):  # failed, or the stream ended: what the hub says now
                if not poll_until_ready(user, 1.0, start + timeout)[0]:
                    return None, None
        except Exception:  # noqa: BLE001 - a lost session is counted, not raised
            return None, None
        return cell(user)

    def cell(user: HubUser) -> tuple[float, float | None]:
        ready = time.monotonic() - start
        try:
            user.run_code("print(6 * 7)", timeout=60)
        except Exception as error:  # noqa: BLE001 - a failed cell is counted, and why
            cell_failures.append(f"{type(error).__name__}: {error}"[:160])
            return ready, None
        return ready, time.monotonic() - start

    if on_start:
        on_start(start_wall)
    with deprioritized(), ThreadPoolExecutor(len(users)) as pool:
        results = list(pool.map(one, users))
    ended, ended_wall = time.monotonic(), time.time()
    busy = machine_busy()[0] - busy_before
    clients_cpu = sum(os.times()[:2]) - clients_before
    jobs_cpu = class_jobs_cpu(students)
    bystander.stop()
    rpcs = rpc_counts()
    used = resources.stop() if resources else {}
    ready = [r for r, _ in results if r is not None]
    cells = [c for _, c in results if c is not None]
    running_queries = None
    life = {}  # the hub's CPU for the rest of the class's life: its sessions running untouched, then stopped
    if steady and ready:  # every session up, nobody starting: the hub's checks that they still run
        at_rest = rpc_counts()
        minutes = []  # the hub-side CPU of each minute of it (the last one: less than a minute where steady says so)
        parts = []  # and of each minute: the hub's own, its commands', its service's
        left = steady
        while left > 0:
            resting = HubResources(hub_pid) if hub_pid else None
            time.sleep(min(60.0, left))
            if resting:
                rested = resting.stop()  # not `used`: that is the class start's, returned below
                minutes.append(rested["hub_side_cpu"] * 60 / min(60.0, left))
                parts.append({k: rested[k] * 60 / min(60.0, left) for k in ("hub_cpu", "hub_commands_cpu", "service_cpu")})
            left -= 60.0
        running_queries = job_queries_in(rpc_counts()) - job_queries_in(at_rest)
        if minutes:
            life.update(running_hub_side_cpu=sum(m * min(60.0, steady - 60 * i) / 60 for i, m in enumerate(minutes)),
                        running_seconds=steady, running_minutes=minutes, running_minutes_parts=parts)

    stopping = time.monotonic()
    ending = HubResources(hub_pid) if hub_pid else None
    with ThreadPoolExecutor(min(len(users), 32)) as pool:
        list(pool.map(lambda u: u.api("DELETE", f"/hub/api/users/{u.name}/server"), users))
    deadline = time.monotonic() + 180
    while jobs_of(students) and time.monotonic() < deadline:
        time.sleep(1)
    if ending:
        life["stop_hub_side_cpu"] = ending.stop()["hub_side_cpu"]
    delta = {k: rpcs[k] - before.get(k, 0) for k in rpcs if rpcs[k] - before.get(k, 0) > 0}
    return {
        "students": len(students), "logins": logins,
        "last_ready": max(ready) if ready else float("nan"),
        "median_ready": statistics.median(ready) if ready else float("nan"),
        "lost": len(students) - len(ready), "first_cell_last": max(cells) if cells else float("nan"),
        "cells_failed": len(ready) - len(cells), "told_to_retry": len(refused),
        "cell_failure": Counter(cell_failures).most_common(1)[0][0] if cell_failures else "",
        "retry_message": refused[0] if refused else "",
        "polls": sum(p for p, _ in polled), "polls_refused": sum(r for _, r in polled),
        "api_p50": percentile(bystander.latencies, 0.5), "api_p99": percentile(bystander.latencies, 0.99),
        "api_calls": len(bystander.latencies), "api_shed": bystander.shed,
        "rpcs": delta,
        "job_queries_per_min_starting": job_queries_in(delta) * 60 / (ended - start),
        "job_queries_per_min_running": running_queries * 60 / steady if running_queries is not None else None,
        "window": (start_wall, ended_wall), **used,
        "machine_busy": busy, "machine_cpus": cpus, "machine_seconds": ended - start,
        "class_jobs_cpu": jobs_cpu["running"] + jobs_cpu["reaped"],
        "class_jobs_running_cpu": jobs_cpu["running"], "class_jobs_reaped_cpu": jobs_cpu["reaped"],
        "class_jobs_system_cpu": jobs_cpu["system"],
        "clients_cpu": clients_cpu,
        "all_gone": time.monotonic() - stopping, **life,
    }


HOUR = 3600.0


def class_hour(result: dict) -> float | None:
    """The hub-side CPU seconds per student of a class that runs an hour: its start, an hour of its sessions
    running untouched and its stop; None where not measured. The hour: the minutes measured as measured (the
    first ones still hold the reports of the class's own use), the rest of the hour at the last minute's rate,
    or, where the minutes were not told apart, at the rate of the whole time measured."""
    if not {"hub_side_cpu", "running_hub_side_cpu", "stop_hub_side_cpu"} <= result.keys() or "load" in result:
        return None
    minutes = result.get("running_minutes") or []
    if len(minutes) > 1:
        measured = result["running_hub_side_cpu"]
        running = measured + minutes[-1] * (HOUR - result["running_seconds"]) / 60
    else:
        running = result["running_hub_side_cpu"] * HOUR / result["running_seconds"]
    return (result["hub_side_cpu"] + running + result["stop_hub_side_cpu"]) / result["students"]


def jobs_of(users: list[str]) -> int:
    """How many jobs of ``users`` Slurm still lists (pending, running or ending): one squeue for all."""
    out = subprocess.run(["squeue", "-h", "-t", "PD,R,CG,CF", "-u", ",".join(users), "-o", "%A"],
                         capture_output=True, text=True).stdout
    return len(out.split())


def describe(result: dict) -> str:
    top = ", ".join(f"{k.removeprefix('REQUEST_')} {v}" for k, v in
                    sorted(result["rpcs"].items(), key=lambda item: -item[1])[:5])
    running = result.get("job_queries_per_min_running")
    resources = (f"; hub CPU {result['hub_cpu']:.1f} s + {result['hub_commands_cpu']:.1f} s in its commands"
                 + (f" + {result['service_cpu']:.1f} s in its service" if "service_cpu" in result else "")
                 + (f" = {result['hub_side_cpu'] / result['students']:.3f} CPU-s per student"
                    if "hub_side_cpu" in result and "load" not in result else "")
                 + (f"; running {60 * result['running_hub_side_cpu'] / result['running_seconds']:.2f} CPU-s a minute"
                    + (" (each minute: " + ", ".join(f"{m:.2f}" for m in result["running_minutes"]) + "; the last: "
                       + ", ".join(f"{name} {result['running_minutes_parts'][-1][k]:.2f}" for name, k in
                                   (("hub", "hub_cpu"), ("commands", "hub_commands_cpu"), ("service", "service_cpu")))
                       + ")"
                       if len(result.get("running_minutes_parts") or []) > 1 else "") + ", "
                    f"stop {result['stop_hub_side_cpu']:.1f} CPU-s: a class of an hour {class_hour(result):.3f} CPU-s "
                    "per student" if class_hour(result) is not None else "")
                 + f", peak RSS hub {result['hub_rss_mb']:.0f} MB, proxy {result['proxy_rss_mb']:.0f} MB"
                 if "hub_cpu" in result else "")
    machine = (f"; machine busy {result['machine_busy']:.0f} of {result['machine_cpus']} x "
               f"{result['machine_seconds']:.0f} CPU-s "
               f"({100 * result['machine_busy'] / (result['machine_cpus'] * result['machine_seconds']):.0f} %), "
               f"the class's jobs {result['class_jobs_cpu']:.0f} CPU-s ({result['class_jobs_cpu'] / result['students']:.2f} per student"
               + (f": servers {result['class_jobs_running_cpu']:.0f}, kernels shut down {result['class_jobs_reaped_cpu']:.0f}, "
                  f"of all system time {result['class_jobs_system_cpu']:.0f}" if "class_jobs_running_cpu" in result else "")
               + ")"
               + (f", proxy {result['proxy_cpu']:.0f} CPU-s" if "proxy_cpu" in result else "")
               + (f", the students' clients {result['clients_cpu']:.0f} CPU-s" if "clients_cpu" in result else "")
               if "machine_busy" in result else "")
    return (f"{result['students']} students: logins {result['logins']:.1f} s; last ready {result['last_ready']:.1f} s, "
            f"median {result['median_ready']:.1f} s, {result['lost']} lost, {result['told_to_retry']} told to retry; "
            + (f"{result['polls']} polls of their models, {result['polls_refused']} answered 429; " if result.get("polls") else "")
            +
            f"last first cell {result['first_cell_last']:.1f} s ({result['cells_failed']} failed"
            + (f", most as {result['cell_failure']!r}" if result.get("cell_failure") else "") + "); "
            f"bystander hub API p50 {result['api_p50'] * 1000:.0f} ms, p99 {result['api_p99'] * 1000:.0f} ms"
            f" ({result.get('api_shed', 0)} of {result.get('api_calls', 0)} answered 429){resources}{machine}; "
            f"slurmctld job queries {result['job_queries_per_min_starting']:.0f}/min while starting"
            + (f", {running:.0f}/min while all run" if running is not None else "")
            + f"; RPCs {top}; all jobs gone {result['all_gone']:.1f} s after the stop")


if __name__ == "__main__" and sys.argv[1:2] == ["bystander"]:
    bystander_main(*sys.argv[2:4])
