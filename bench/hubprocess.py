"""The hub's CPU seconds (its own, its commands': squeue, sbatch through the mediator, ..., and its services':
dsportal's, a JupyterHub service the hub started) and the peak memory (RSS) of the hub and of its proxy, read
from /proc while a class starts (bench/class_start.py) or people click (bench/curve.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from cpu import process_cpu

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # fields from the state on (the name may hold blanks)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _command_has(pid: int, *words: bytes) -> bool:
    """Whether process ``pid``'s command line holds any of ``words``."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return any(word in command for word in words)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


class HubResources:
    """The hub process's CPU (and its proxy's) and the peak RSS of the hub and its proxy (configurable-http-proxy, a
    child of the hub in the bench), sampled every half second on a thread until stop()."""

    def __init__(self, hub_pid: int):
        self.hub_pid = hub_pid
        children = _children(hub_pid)
        self.proxy_pids = [p for p in children if _command_has(p, b"configurable-http-proxy", b"proxy.js")]
        # The hub's long-lived helpers (dsportal's service; stock's hub has none): counted as the hub's own.
        self.service_pids = [p for p in children if _command_has(p, b"portal.hub.extend")]
        self.hub_peak_mb = self.proxy_peak_mb = 0.0
        self._before = self._cpu()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _cpu(self) -> tuple[float, float, float, float]:
        """(the hub's own CPU seconds, its waited-for children's: the commands it ran, its proxy's, its services')."""
        fields = _stat(self.hub_pid)
        return ((int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK,
                sum(map(process_cpu, self.proxy_pids)), sum(map(process_cpu, self.service_pids)))

    def _sample(self) -> None:
        while not self._stopping.wait(0.5):
            try:
                self.hub_peak_mb = max(self.hub_peak_mb, _rss_mb(self.hub_pid))
                self.proxy_peak_mb = max(self.proxy_peak_mb, sum(_rss_mb(p) for p in self.proxy_pids))
            except OSError:
                return

    def stop(self) -> dict:
        self._stopping.set()
        self._thread.join(timeout=5)
        after = self._cpu()
        return {"hub_cpu": after[0] - self._before[0], "hub_commands_cpu": after[1] - self._before[1],
                "proxy_cpu": after[2] - self._before[2], "service_cpu": after[3] - self._before[3],
                "hub_side_cpu": sum(after[i] - self._before[i] for i in (0, 1, 3)),
                "hub_rss_mb": self.hub_peak_mb, "proxy_rss_mb": self.proxy_peak_mb}
