"""Whether the process a pidfile names still runs: the demo's daemons, the hub (dsportal db move)."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pidfile: Path) -> int | None:
    """The pid a daemon's pidfile names, while that daemon runs; None once it is gone.

    Pids come round again (pid_max may be as low as 32768, and a demo start spawns thousands of
    short processes): a pidfile left behind by a daemon that was killed can name some other program
    by the next start. A daemon writes its pidfile after it starts, so a process that started after
    the pidfile was written is not the one it names.
    """
    try:
        pid = int(pidfile.read_text().split()[0])
        written = pidfile.stat().st_mtime
        os.kill(pid, 0)
        started = process_started(pid)
    except (OSError, ValueError, IndexError):
        return None
    if started > written + 2:  # boot time is whole seconds in /proc/stat
        return None
    return pid


def process_started(pid: int) -> float:
    """When a process started, in seconds since the epoch (/proc's start time in clock ticks since boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has exited
        raise ProcessLookupError(pid)
    booted = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                  if line.startswith("btime "))
    return booted + int(fields[19]) / os.sysconf("SC_CLK_TCK")
