"""What one click costs each hub (issue 72): the curve's pages (bench/locustfile.py: the home page, who am I,
the token page), each asked ``--requests`` times in a row by one logged-in person over one kept-alive
connection, on a quiet hub of each kind (spawn_bench.py's department hubs, on the demo's MariaDB).

For each page and hub: the hub's own CPU per request (its process's utime + stime, /proc), its proxy's, the
answer's size, and with ``--py-spy`` whose code that CPU went to (bench/owners.py, by owner and by function).
One request at a time: the cost of the work itself, without the queueing of the curve's crowd.

    python bench/click_cost.py [--requests 500] [--kinds dsportal,dsportal-plain,batchspawner] [--py-spy]

As root, with the demo up (make bench's demo). The last line sums up.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import spawn_bench
from curve import PY_SPY
from hubprocess import HubResources
from owners import owners

PAGES = {"home": "/hub/home", "who am I": "/hub/api/user", "token page": "/hub/token"}
PERSON = "alice"


def cost(hub, requests_each: int, py_spy: bool, warm: int = 50) -> dict:
    """Each page's hub CPU (ms) and proxy CPU (ms) per request, answer bytes; the py-spy owners if asked."""
    person = hub.user(PERSON)
    person.web.headers.pop("Connection", None)  # kept alive, as a browser's and the curve's locust's
    results = {}
    for name, path in PAGES.items():
        url, headers = f"{person.hub_origin}{path}", person.xsrf if path.startswith("/hub/api") else {}
        for _ in range(warm):
            person.web.get(url, headers=headers, timeout=30)
        profiler = None
        stacks = hub.data / f"py-spy-click-{name.replace(' ', '-')}.txt"
        if py_spy:
            profiler = subprocess.Popen([str(PY_SPY), "record", "--nonblocking", "--pid", str(hub.process.pid),
                                         "--rate", "500", "--format", "raw", "--output", str(stacks)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        resources = HubResources(hub.process.pid)
        size, started = 0, time.monotonic()
        for _ in range(requests_each):
            answer = person.web.get(url, headers=headers, timeout=30)
            if answer.status_code != 200 or "/hub/login" in answer.url:
                raise SystemExit(f"{hub.kind}: {path} answered {answer.status_code} ({answer.url})")
            size = len(answer.content)
        wall = time.monotonic() - started
        used = resources.stop()
        result = {"hub_ms": 1000 * used["hub_cpu"] / requests_each, "proxy_ms": 1000 * used["proxy_cpu"] / requests_each,
                  "wall_ms": 1000 * wall / requests_each, "bytes": size}
        if profiler:
            profiler.send_signal(2)
            profiler.wait(timeout=60)
            if stacks.exists():
                with stacks.open(encoding="utf-8", errors="replace") as lines:
                    by_owner, total = owners(lines)
                with stacks.open(encoding="utf-8", errors="replace") as lines:
                    by_function, _ = owners(lines, by_function=True)
                result["owners"] = {k: round(100 * v / max(total, 1), 1) for k, v in by_owner.most_common(8)}
                result["functions"] = {k: round(100 * v / max(total, 1), 1) for k, v in by_function.most_common(12)}
        results[name] = result
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="requests of each page, one after the other")
    parser.add_argument("--kinds", default="dsportal,dsportal-plain,batchspawner", type=lambda s: s.split(","))
    parser.add_argument("--py-spy", action="store_true", help="sample each hub at 500 a second through each page")
    parser.add_argument("--database", choices=("sqlite", "mariadb"), default="mariadb")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="dsportal-clicks-", dir="/var/tmp"))
    found = {}
    for offset, kind in enumerate(args.kinds):
        hub = spawn_bench.Hub(kind, 20 + offset, workdir, 90, for_class=True, label="-clicks", database=args.database)
        try:
            found[kind] = cost(hub, args.requests, args.py_spy)
        finally:
            hub.close()
        for name, r in found[kind].items():
            print(f"{kind:15} {name:11} hub {r['hub_ms']:5.2f} ms, proxy {r['proxy_ms']:5.2f} ms, "
                  f"{r['wall_ms']:5.1f} ms a request, {r['bytes']} bytes", flush=True)
            for key in ("owners", "functions"):
                if key in r:
                    print(f"    {key}: " + "; ".join(f"{k} {v} %" for k, v in r[key].items()), flush=True)
    if "dsportal" in found and "batchspawner" in found:
        ours, stock = found["dsportal"], found["batchspawner"]
        print("click cost (hub CPU a request, dsportal vs stock): " + ", ".join(
            f"{name} {ours[name]['hub_ms']:.2f} vs {stock[name]['hub_ms']:.2f} ms" for name in PAGES) + " | " +
            f"results in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
