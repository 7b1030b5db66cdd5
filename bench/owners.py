"""Whose code a process spent its CPU in: py-spy's raw stacks, each sample given to the package of
its deepest frame outside Python's standard library (dsportal for portal/ and spawner/), threads
waiting idle left out.

    py-spy record --rate 250 --format raw --output hub.txt --pid HUB_PID --duration 60
    python bench/owners.py hub.txt [more.txt ...]

A module that imports another is charged only for its own top-level code; what the imported module
runs is the imported module's. A standard-library function is charged to its caller (``re.compile``
called by SQLAlchemy counts as SQLAlchemy). The last line is a summary: dsportal's share, and the
largest owners.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

FRAME = re.compile(r"\(([^()]+?):\d+\)$")
# A waiting thread: py-spy's raw output keeps some of them (C waits it cannot tell from work).
IDLE = ("select (selectors.py", "wait (threading.py", "_do_waitpid (asyncio", "_run_safe_shutdown_loop (pycares",
        "_worker (concurrent", "get (queue.py", "_wait_for_tstate_lock (threading.py")
DSPORTAL = ("portal/", "spawner/")


def owner(frame_file: str) -> str | None:
    """The package a frame's file belongs to; None for the standard library and the interpreter.
    py-spy names a file by its path below the folder it was imported from (``jupyterhub/orm.py``,
    ``asyncio/events.py``), a script by its full path."""
    if frame_file.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return None
    path = frame_file.split("site-packages/", 1)[-1]
    if path.startswith("/"):  # a script (jupyterhub-singleuser, dsportal) or the standard library by full path
        return None if path.startswith(sys.base_prefix) else "scripts"
    if path.startswith(DSPORTAL):
        return "dsportal"
    top = path.split("/", 1)[0].removesuffix(".py")
    return None if top in sys.stdlib_module_names else top


def owners(lines, by_function: bool = False) -> tuple[Counter, int]:
    """(samples by owner, samples in all) of py-spy raw lines ("frame;frame;... COUNT"); ``by_function``: by
    the owner's function instead ("sqlalchemy: execute (sqlalchemy/engine/base.py)")."""
    counts: Counter = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if any(mark in frames[-1] for mark in IDLE):
            continue
        found = "standard library"
        for frame in reversed(frames):
            match = FRAME.search(frame)
            if match and (name := owner(match.group(1))):
                found = f"{name}: {frame[:match.start()].strip()} ({match.group(1).split('site-packages/')[-1]})" \
                    if by_function else name
                break
        counts[found] += int(count)
        total += int(count)
    return counts, total


def main(paths: list[str]) -> None:
    counts: Counter = Counter()
    total = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as lines:
            found, samples = owners(lines)
        counts.update(found)
        total += samples
    if not total:
        sys.exit("owners: no samples in " + ", ".join(paths))
    for name, samples in counts.most_common(25):
        print(f"{100 * samples / total:5.1f} %  {name}")
    largest = ", ".join(f"{name} {100 * samples / total:.1f} %" for name, samples in counts.most_common(4))
    print(f"owners: {total} samples; dsportal {100 * counts['dsportal'] / total:.1f} %; largest: {largest}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
