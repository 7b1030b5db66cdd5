"""A department around a class start (issue 33): what spawn_bench.py adds to bench/class_start.py.

- :class:`HubLoad`: 300 people logged in and clicking through the hub (locust, headless, niced: they
  stand in for browsers elsewhere), each request's time kept, so the class's window can be cut out;
- :func:`queued_jobs`: thousands of other users' jobs in Slurm's queue, held so they never run,
  cancelled at the end.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from class_start import percentile

BENCH_ENV = Path(os.environ.get("DSPORTAL_PREFIX", "/opt/dsportal")) / "bench-env"
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
class HubLoad:
    """``accounts`` ([(name, password)]) logged in to the hub at ``base`` and clicking (bench/locustfile.py),
    one simulated person each, from a niced locust process of its own."""

    def __init__(self, base: str, accounts: list[tuple[str, str]], wait: tuple[float, float] = (5, 15),
                 ramp_per_second: float = 25):
        locust = BENCH_ENV / "bin" / "locust"
        if not locust.exists():
            raise SystemExit(f"{locust} is missing: make bench installs it (scripts/install-bench.sh)")
        self.folder = Path(tempfile.mkdtemp(prefix="dsportal-load-", dir="/var/tmp"))
        self.record, self.logins = self.folder / "requests.json", self.folder / "logins"
        self.count = len(accounts)
        self.log = open(self.folder / "locust.log", "wb")
        self.process = subprocess.Popen(
            ["nice", "-n", "10", str(locust), "-f", str(LOCUSTFILE), "--headless", "--host", base,
             "--users", str(self.count), "--spawn-rate", str(ramp_per_second), "--run-time", "30m",
             "--only-summary", "--loglevel", "WARNING", "--stop-timeout", "5"],
            stdout=self.log, stderr=subprocess.STDOUT,
            env={"PATH": f"{BENCH_ENV}/bin:/usr/bin:/bin", "HOME": str(self.folder),
                 "DSPORTAL_LOAD_USERS": json.dumps(accounts), "DSPORTAL_LOAD_WAIT": f"{wait[0]},{wait[1]}",
                 "DSPORTAL_LOAD_RECORD": str(self.record), "DSPORTAL_LOAD_LOGINS": str(self.logins)})
        self.requests: list = []

    def logged_in(self) -> int:
        return len(self.logins.read_text().splitlines()) if self.logins.exists() else 0

    def wait_logged_in(self, timeout: float = 180) -> int:
        """Until every person has logged in (or ``timeout``); how many did."""
        deadline = time.monotonic() + timeout
        while self.logged_in() < self.count and time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"locust ended early:\n{(self.folder / 'locust.log').read_text()[-3000:]}")
            time.sleep(1)
        return self.logged_in()

    def stop(self) -> None:
        self.process.terminate()  # locust writes the record as it quits
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        self.requests = json.loads(self.record.read_text()) if self.record.exists() else []

    def window(self, start: float, end: float) -> dict:
        """Requests that ended between ``start`` and ``end`` (time.time()): count, failures, shed (429:
        the hub asked to come back later), and p50/p99 (s) of those the hub answered (shed ones left out:
        a person was not served by them)."""
        inside = [r for r in self.requests if start <= r[0] <= end]
        shed = [r for r in inside if len(r) > 4 and r[4] == 429]
        seconds = [r[1] / 1000 for r in inside if not (len(r) > 4 and r[4] == 429)]
        return {"requests": len(inside), "failures": sum(1 for r in inside if not r[2]) - len(shed), "shed": len(shed),
                "per_second": len(inside) / max(end - start, 1e-9),
                "p50": statistics.median(seconds) if seconds else float("nan"), "p99": percentile(seconds, 0.99),
                "logged_in": self.logged_in(), "people": self.count}


QUEUED_NAME = "bench-queued"


def _submit_held(user: str, count: int) -> int:
    """``count`` held five-minute jobs of ``user`` in the cpu partition, from one shell of hers; how many went in."""
    loop = (f"n=0; while [ $n -lt {int(count)} ]; do sbatch --hold --parsable --partition=cpu --time=5 --mem=100M "
            f"--job-name={QUEUED_NAME} --output=/dev/null --chdir=/tmp --wrap=true >/dev/null || break; "
            "n=$((n+1)); done; echo $n")
    done = subprocess.run(["nice", "-n", "10", "runuser", "-u", user, "--", "sh", "-c", loop],
                          capture_output=True, text=True, timeout=900)
    return int(done.stdout.strip() or 0)


def queued_count() -> int:
    out = subprocess.run(["squeue", "-h", "-t", "PD", f"--name={QUEUED_NAME}", "-o", "%A"],
                         capture_output=True, text=True).stdout
    return len(out.split())


def cancel_queued(timeout: float = 180) -> None:
    subprocess.run(["scancel", f"--name={QUEUED_NAME}"], capture_output=True)
    deadline = time.monotonic() + timeout
    while queued_count() and time.monotonic() < deadline:
        time.sleep(2)


def slurm_config_number(name: str, default: int) -> int:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(rf"^{name}\s*=\s*(\d+)", out, re.MULTILINE)
    return int(found.group(1)) if found else default


def jobs_remembered() -> int:
    """Every job slurmctld holds, ended ones included (until MinJobAge): what counts against MaxJobCount."""
    out = subprocess.run(["squeue", "-h", "--all", "--states=all", "-o", "%A"], capture_output=True, text=True).stdout
    return len(out.split())


def wait_for_room(jobs: int, margin: int = 200) -> None:
    """Until slurmctld can take ``jobs`` more (MaxJobCount counts the jobs it still remembers, those a step before
    cancelled too, for MinJobAge): the next hub's class must not find the queue full of the last one's leftovers."""
    most = slurm_config_number("MaxJobCount", 10000)
    deadline = time.monotonic() + slurm_config_number("MinJobAge", 300) + 120
    waited = time.monotonic()
    while jobs_remembered() + jobs + margin > most and time.monotonic() < deadline:
        time.sleep(10)
    if time.monotonic() - waited > 1:
        print(f"  waited {time.monotonic() - waited:.0f} s for slurmctld to forget the jobs of the step before "
              f"(MaxJobCount {most}, {jobs_remembered()} remembered)", flush=True)


@contextmanager
def queued_jobs(count: int, users: list[str], submitters: int = 4, room_for: int = 0):
    """``count`` jobs of ``users`` (in turn) held in Slurm's queue for the duration, once slurmctld has room for
    them and ``room_for`` more (a class); yields how many are there. They are named bench-queued and cancelled at
    the end, whatever happens."""
    shares = [count // len(users) + (1 if i < count % len(users) else 0) for i in range(len(users))]
    wait_for_room(count + room_for)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(submitters) as pool:
            list(pool.map(_submit_held, users, shares))
        there = queued_count()
        print(f"  {there} held jobs of {len(users)} other users in the queue ({time.monotonic() - started:.0f} s "
              "to submit)", flush=True)
        yield there
    finally:
        cancel_queued()
