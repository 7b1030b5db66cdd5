"""The hub's CPU seconds (its own, and its commands': squeue, sbatch through the mediator, ...) and the
peak memory (RSS) of the hub and of its proxy, read from /proc while a class starts (bench/class_start.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # fields from the state on (the name may hold blanks)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


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
        self.proxy_pids = [p for p in _children(hub_pid) if self._is_proxy(p)]
        self.hub_peak_mb = self.proxy_peak_mb = 0.0
        self._before = self._cpu()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _is_proxy(pid: int) -> bool:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            return False
        return b"configurable-http-proxy" in command or b"proxy.js" in command

    def _cpu(self) -> tuple[float, float, float]:
        """(the hub's own CPU seconds, its waited-for children's: the commands it ran, its proxy's)."""
        fields = _stat(self.hub_pid)
        proxy = 0.0
        for pid in self.proxy_pids:
            try:
                proxy += sum(int(f) for f in _stat(pid)[11:13]) / TICK
            except OSError:
                pass
        return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK, proxy

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
                "proxy_cpu": after[2] - self._before[2], "hub_rss_mb": self.hub_peak_mb, "proxy_rss_mb": self.proxy_peak_mb}
