"""The clicks' curve (issue 72): more and more people of the department logged in and clicking through one hub
(bench/locustfile.py: home page, who am I, token page, every 5-15 s each), each kind of hub in turn.

At each point (100, 300, 1,000, 2,000 people by default), once all have logged in, a window of ``window`` seconds:
- the clicks' p50 and p99 (answered ones; 429s counted apart as shed) and failures;
- the hub's CPU: its own, its commands', its services' (dsportal's) and its proxy's, and per request;
- how busy the whole machine was (every CPU: the database, the proxy and the generator too);
- the load generator's own CPU: one locust process, at most one core; past about 0.9 of a core its people click
  late and the point measures the generator as much as the hub (said in the point's line);
- py-spy of the hub through the window (raw stacks, ``rate`` a second), summarized by owner (bench/owners.py).

The knee of a hub is its first point whose p99 passes 1 s, or where more than 1 % of the clicks were shed (429)
or failed. spawn_bench.py runs this (``--curve``) and draws the
curve (bench/plot_curve.py) into bench/results.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from class_start import machine_busy
from cpu import process_cpu
from department import BENCH_ENV, HubLoad
from hubprocess import HubResources
from owners import owners

KNEE = 1.0  # seconds: a click's p99 past this is a hub too slow to use
SHED_AT_KNEE = 0.01  # of the clicks shed (429) or failed: past this, a hub that answers fast serves too few
PY_SPY = BENCH_ENV / "bin" / "py-spy"
SETTLE = 15  # seconds after the last login before the window: everyone in the clicking rhythm


def point(base: str, hub_pid: int, accounts: list[tuple[str, str]], window: float, profile_to: Path | None,
          rate: int = 20) -> dict:
    """``accounts`` logged in to the hub at ``base`` and clicking; the window's figures."""
    load = HubLoad(base, accounts, ramp_per_second=25)
    profiler = None
    try:
        logged_in = load.wait_logged_in(timeout=60 + len(accounts) / 10)
        time.sleep(SETTLE)
        if profile_to:  # --nonblocking: the hub is not paused at each sample of the window it is timed in
            profiler = subprocess.Popen([str(PY_SPY), "record", "--nonblocking", "--pid", str(hub_pid), "--rate",
                                         str(rate), "--format", "raw", "--output", str(profile_to), "--duration",
                                         str(int(window))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        resources = HubResources(hub_pid)
        generator_before = process_cpu(load.process.pid, waited_children=False)
        busy_before, cpus = machine_busy()
        start = time.time()
        time.sleep(window)
        end = time.time()
        used = resources.stop()
        generator = process_cpu(load.process.pid, waited_children=False) - generator_before
        machine = (machine_busy()[0] - busy_before) / (cpus * (end - start))
    finally:
        load.stop()
        if profiler:
            try:
                profiler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                profiler.kill()
    clicks = load.window(start, end)
    answered = clicks["requests"] - clicks["shed"]
    result = {**clicks, **used, "people": len(accounts), "logged_in": logged_in, "seconds": end - start,
              "generator_cpu": generator, "generator_share": generator / (end - start), "machine_busy_share": machine,
              "hub_side_ms_per_request": 1000 * used["hub_side_cpu"] / answered if answered else float("nan"),
              "proxy_ms_per_request": 1000 * used["proxy_cpu"] / answered if answered else float("nan")}
    if profile_to and profile_to.exists():
        lines = profile_to.read_text(encoding="utf-8", errors="replace").splitlines()
        counts, total = owners(lines)
        functions, _ = owners(lines, by_function=True)
        result["owners"] = {name: samples / total for name, samples in counts.most_common(12)} if total else {}
        result["functions"] = {name: samples / total for name, samples in functions.most_common(15)} if total else {}
        result["profile"] = str(profile_to)
    return result


def describe(p: dict) -> str:
    saturated = " (the generator near a whole core: its people clicked late)" if p["generator_share"] > 0.9 else ""
    owners_text = ", ".join(f"{name} {100 * share:.0f} %" for name, share in list(p.get("owners", {}).items())[:5])
    return (f"{p['people']} clicking ({p['logged_in']} logged in): {p['requests']} requests in {p['seconds']:.0f} s "
            f"({p['per_second']:.0f}/s), p50 {p['p50']:.2f} s, p99 {p['p99']:.2f} s, {p['shed']} shed, "
            f"{p['failures']} failed; hub-side CPU {p['hub_side_cpu']:.1f} s (hub {p['hub_cpu']:.1f}, commands "
            f"{p['hub_commands_cpu']:.1f}, service {p['service_cpu']:.1f}) = {p['hub_side_ms_per_request']:.1f} ms "
            f"per request, proxy {p['proxy_ms_per_request']:.1f} ms; generator {100 * p['generator_share']:.0f} % of a "
            f"core{saturated}; the machine {100 * p.get('machine_busy_share', float('nan')):.0f} % busy (every CPU, "
            "the database and the generator included)" + (f"; hub profile: {owners_text}" if owners_text else ""))


def past_knee(p: dict) -> bool:
    """The clicks' p99 past KNEE, or more than 1 % of them shed (429: a person not served is no faster click),
    or failed."""
    return not p["p99"] <= KNEE or p["shed"] + p["failures"] > SHED_AT_KNEE * max(p["requests"], 1)


def knee(points: list[dict]) -> int | None:
    """The first point's people past the knee (past_knee); None where none was."""
    return next((p["people"] for p in points if past_knee(p)), None)


def knee_text(points: list[dict]) -> str:
    found = knee(points)
    return f"{found}" if found is not None else f"past {points[-1]['people']}" if points else "?"


def run(make_hub, kinds: list[str], sizes: list[int], accounts: list[tuple[str, str]], window: float,
        profiles: Path | None, results: dict[str, list[dict]]) -> dict:
    """Each kind's hub (``make_hub(kind)``, closed after) through every point of ``sizes`` (smallest first), each
    point added to ``results`` (by kind) as it is measured: a run cut short keeps what it measured."""
    if profiles and not PY_SPY.exists():
        raise SystemExit(f"{PY_SPY} is missing: make bench installs it (scripts/install-bench.sh)")
    sizes = sorted(sizes)
    for kind in kinds:
        hub = make_hub(kind)
        results[kind] = []
        try:
            for size in sizes:
                profile = profiles / f"py-spy-curve-{kind}-{size}.txt" if profiles else None
                found = point(hub.base, hub.process.pid, accounts[:size], window, profile)
                results[kind].append(found)
                print(f"  {kind:12} {describe(found)}", flush=True)
        finally:
            hub.close()
        at = knee_point(results[kind])
        if at and at.get("functions"):
            print(f"  {kind:12} at {at['people']} people ({'the knee' if knee(results[kind]) else 'no knee: the last point'}), "
                  "the hub's time by function (py-spy): " + "; ".join(
                      f"{100 * share:.1f} % {name}" for name, share in list(at["functions"].items())[:10]), flush=True)
    return results


def knee_point(points: list[dict]) -> dict | None:
    """The point at the knee, else the last one: where the hub's profile tells what limits it."""
    found = knee(points)
    return next((p for p in points if p["people"] == found), points[-1] if points else None)


def summary(results: dict[str, list[dict]]) -> str:
    parts = []
    for kind, points in results.items():
        at = "; ".join(f"{p['people']}: p99 {p['p99']:.2f} s, {p['hub_side_ms_per_request']:.1f} ms hub CPU/request"
                       for p in points)
        parts.append(f"{kind} knee {knee_text(points)} ({at})")
    return "curve: " + " | ".join(parts)


def plot(results_json: Path, png: Path) -> None:
    """The curve as a PNG (bench/plot_curve.py in the bench's environment, where matplotlib is)."""
    subprocess.run([str(BENCH_ENV / "bin" / "python"), str(Path(__file__).with_name("plot_curve.py")),
                    str(results_json), str(png)], check=True)
