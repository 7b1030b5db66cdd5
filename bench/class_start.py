"""A class starts at once: N students log in and start a session at the same moment (9:00, the first
lecture), each runs one cell, then all stop. Used by spawn_bench.py on each hub.

Reported: logins, last and median ready (from the moment all asked), sessions lost, the first cell's
answer, a bystander's (an admin's) hub API latency while it happens, slurmctld's RPCs by type
(sdiag) and the time until every job of the class is gone. The students' 30 clients stand in for
browsers on machines of their own: they run niced, and the bystander calls from its own process.
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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import requests

import hubclient
from hubclient import HubUser, active_jobs


def rpc_counts() -> dict[str, int]:
    """slurmctld's RPC counts by message type so far (sdiag)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    return {name: int(count) for name, count in re.findall(r"^\s*(REQUEST_\w+|MESSAGE_\w+)\s+\(\s*\d+\)\s+count:(\d+)",
                                                          out, flags=re.MULTILINE)}


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
            env={**os.environ, "DSPORTAL_BENCH_TOKEN": admin.token, "PYTHONPATH": os.path.dirname(hubclient.__file__)})
        self.latencies: list[float] = []

    def stop(self) -> None:
        out, _ = self.process.communicate("stop\n", timeout=60)
        self.latencies = json.loads(out)


def bystander_main(base: str, name: str) -> None:
    """The bystander's process: calls until a line arrives on stdin, then prints the latencies (JSON)."""
    stopping = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stopping.set()), daemon=True).start()
    admin = HubUser(base, name, token=os.environ["DSPORTAL_BENCH_TOKEN"])
    latencies = []
    while not stopping.is_set():
        started = time.monotonic()
        try:
            admin.api("GET", f"/hub/api/users/{name}")
        except requests.RequestException:  # a failed call counts as slow as it was
            pass
        latencies.append(time.monotonic() - started)
        stopping.wait(0.2)
    print(json.dumps(latencies))


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


def class_start(login, students: list[str], options: dict, admin: HubUser, timeout: float) -> dict:
    """``login(name)`` -> a logged-in HubUser of the hub under test."""
    started = time.monotonic()
    with ThreadPoolExecutor(len(students)) as pool:
        users = list(pool.map(login, students))
    logins = time.monotonic() - started

    bystander = Bystander(admin)
    before = rpc_counts()
    start = time.monotonic()

    def one(user: HubUser) -> tuple[float | None, float | None]:
        """(ready, first cell answered), seconds from the start; None for what did not happen."""
        try:
            response = user.start_server(options)
            if response.status_code not in (201, 202):
                return None, None
            user.wait_ready(timeout)
        except Exception:  # noqa: BLE001 - a lost session is counted, not raised
            return None, None
        ready = time.monotonic() - start
        try:
            user.run_code("print(6 * 7)", timeout=timeout)
        except Exception:  # noqa: BLE001
            return ready, None
        return ready, time.monotonic() - start

    with deprioritized(), ThreadPoolExecutor(len(users)) as pool:
        results = list(pool.map(one, users))
    bystander.stop()
    rpcs = rpc_counts()
    ready = [r for r, _ in results if r is not None]
    cells = [c for _, c in results if c is not None]

    stopping = time.monotonic()
    with ThreadPoolExecutor(len(users)) as pool:
        pool.map(lambda u: u.api("DELETE", f"/hub/api/users/{u.name}/server"), users)
    deadline = time.monotonic() + 120
    while any(active_jobs(name) for name in students) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {
        "students": len(students), "logins": logins,
        "last_ready": max(ready) if ready else float("nan"),
        "median_ready": statistics.median(ready) if ready else float("nan"),
        "lost": len(students) - len(ready), "first_cell_last": max(cells) if cells else float("nan"),
        "cells_failed": len(ready) - len(cells),
        "api_p50": percentile(bystander.latencies, 0.5), "api_p99": percentile(bystander.latencies, 0.99),
        "rpcs": {k: rpcs[k] - before.get(k, 0) for k in rpcs if rpcs[k] - before.get(k, 0) > 0},
        "all_gone": time.monotonic() - stopping,
    }


def describe(result: dict) -> str:
    top = ", ".join(f"{k.removeprefix('REQUEST_')} {v}" for k, v in
                    sorted(result["rpcs"].items(), key=lambda item: -item[1])[:5])
    return (f"{result['students']} students: logins {result['logins']:.1f} s; last ready {result['last_ready']:.1f} s, "
            f"median {result['median_ready']:.1f} s, {result['lost']} lost; last first cell {result['first_cell_last']:.1f} s "
            f"({result['cells_failed']} failed); "
            f"bystander hub API p50 {result['api_p50'] * 1000:.0f} ms, p99 {result['api_p99'] * 1000:.0f} ms; "
            f"slurmctld RPCs {top}; all jobs gone {result['all_gone']:.1f} s after the stop")


if __name__ == "__main__" and sys.argv[1:2] == ["bystander"]:
    bystander_main(*sys.argv[2:4])
