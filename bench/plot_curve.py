"""Draw the clicks' curve (bench/curve.py) of a spawn_bench results file as a PNG: the clicks' p50 and p99
against the people clicking (with the share shed, 429, where any was), and the hub's CPU (hub-side: the hub,
its commands and services) per second and per request, both hubs. Runs in the bench's environment
(matplotlib): /opt/dsportal/bench-env/bin/python.

    python bench/plot_curve.py bench/results/spawn-bench-DATE.json bench/results/curve-DATE.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

KNEE = 1.0
COLOURS = {"dsportal": "tab:blue", "batchspawner": "tab:orange", "dsportal-plain": "tab:green"}
NAMES = {"dsportal": "dsportal", "batchspawner": "stock batchspawner", "dsportal-plain": "dsportal without internal TLS"}


def main(source: str, target: str) -> None:
    data = json.load(open(source))
    curve = data.get("results", data).get("curve") or {}
    if not curve:
        sys.exit(f"{source}: no curve in it")
    figure, (latency, cpu) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, points in curve.items():
        people = [p["people"] for p in points]
        colour = COLOURS.get(kind)
        latency.plot(people, [p["p99"] for p in points], "o-", color=colour, label=f"{NAMES.get(kind, kind)} p99")
        latency.plot(people, [p["p50"] for p in points], "s--", color=colour, alpha=0.6,
                     label=f"{NAMES.get(kind, kind)} p50")
        cpu.plot(people, [p["hub_side_cpu"] / p["seconds"] for p in points], "o-", color=colour,
                 label=f"{NAMES.get(kind, kind)}: hub CPU (cores)")
        cpu.plot(people, [p["generator_share"] for p in points], ":", color=colour, alpha=0.6,
                 label=f"{NAMES.get(kind, kind)}: load generator (cores)")
        for p in points:
            if p.get("shed") and p.get("requests"):
                latency.annotate(f"{100 * p['shed'] / p['requests']:.1f} % shed", (p["people"], p["p99"]),
                                 textcoords="offset points", xytext=(4, -10), fontsize=7, color=colour)
            cpu.annotate(f"{p['hub_side_ms_per_request']:.1f} ms/req", (p["people"], p["hub_side_cpu"] / p["seconds"]),
                         textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
    latency.set(xscale="log", yscale="log", xlabel="people logged in and clicking", ylabel="click latency (s)",
                title="Clicks through one hub")
    latency.axhline(KNEE, color="grey", linewidth=0.8, linestyle=":")
    latency.text(0.01, KNEE, " knee: p99 1 s", va="bottom", fontsize=8, color="grey",
                 transform=latency.get_yaxis_transform())
    cpu.set(xscale="log", xlabel="people logged in and clicking", ylabel="cores busy",
            title="Hub-side CPU (hub, its commands and services)")
    sizes = sorted({p["people"] for points in curve.values() for p in points})
    for axes in (latency, cpu):
        axes.set_xticks(sizes, [f"{n:,}" for n in sizes])
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)
    figure.suptitle(f"{data.get('commit', '')} {data.get('date', '')}: 2-core demo machine, hubs in turn, locust "
                    "niced on the same machine", fontsize=8)
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
