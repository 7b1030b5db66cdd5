"""Notebooks run on a schedule ("every night at 02:00"), through Slurm's own cron, scrontab.

A schedule is an entry of its user's Slurm crontab, written from her session as her. Each time it
fires, Slurm starts a small job (one CPU, a few minutes) that submits the notebook as a notebook job
of its own (jobs.submit): every run is then a job like any other in the Jobs panel, with its own id,
log and executed notebook. The entry's job keeps one Slurm job id across firings (scrontab requeues
it with its next BeginTime), which is why the runs are jobs of their own.

Each schedule has a folder ``~/.dsportal/schedules/<id>/`` (the user's alone) with the notebook as it
was when the schedule was made (``input.ipynb``), the request and the launch policy it was checked
against (``schedule.json``), and the firing job's own log (``cron.log``). The user's other crontab
lines are kept as they are: dsportal rewrites only the blocks between its own marks.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from portal.core.rules import LaunchPolicy, RequestError, check_length, shown
from portal.core.wholefile import write_whole
from portal.session.job import launcher as jobs
from portal.slurm.slurmclient import SlurmError

SCHEDULES_DIR = ".dsportal/schedules"
# cron's own PATH: a schedule's line names the session's Slurm folder before it where that is elsewhere.
CRON_PATH = "/usr/local/bin:/usr/bin:/bin"
BEGIN, END = "# dsportal-schedule {id} begin: made in JupyterLab's Jobs panel; change it there", "# dsportal-schedule {id} end"
PAUSED = "#dsportal-paused# "
PROBLEM = "last-problem"  # why the last firing submitted no run, if it did not
MAX_CRON_CHARS = 100
PRESETS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@weekly": "0 0 * * 0",
           "@monthly": "0 0 1 * *"}
FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_ID = re.compile(r"^[0-9a-f]{8}$")
_SLURM_MARKS = re.compile(r"^(?:#(?:DISABLED|BAD): )+")
_ELEMENT = re.compile(r"^(\*|([0-9]{1,2})(?:-([0-9]{1,2}))?)(?:/([0-9]{1,2}))?$")


class ScheduleNotFound(LookupError):
    pass


# ------------------------------------------------------------------------------ cron expressions
def parse_cron(text) -> tuple[str, list[set[int]]]:
    """A crontab time (five fields: minute hour day-of-month month day-of-week, each *, N, N-M, a
    list of those, /STEP; or @hourly, @daily, @weekly, @monthly) as its canonical text and each
    field's values; RequestError in words otherwise."""
    if not isinstance(text, str):
        raise RequestError(f"schedule must be a crontab time like '0 2 * * *' (every day at 02:00), not {shown(text)}")
    check_length("schedule", text, MAX_CRON_CHARS)
    canonical = PRESETS.get(text.strip(), " ".join(text.split()))
    parts = canonical.split(" ")
    if len(parts) != 5:
        raise RequestError(f"schedule {shown(text)} needs five fields, minute hour day-of-month month day-of-week "
                           "(e.g. '0 2 * * 1' is every Monday at 02:00), or @hourly, @daily, @weekly, @monthly")
    values = []
    for part, (name, low, high) in zip(parts, FIELDS, strict=True):
        found: set[int] = set()
        for element in part.split(","):
            match = _ELEMENT.match(element)
            if not match:
                raise RequestError(f"schedule's {name} {shown(part)} is not *, a number, a range N-M or a list of those "
                                   "(with /STEP)")
            first = low if match.group(1) == "*" else int(match.group(2))
            last = high if match.group(1) == "*" else int(match.group(3) or match.group(2))
            step = int(match.group(4) or 1)
            # Slurm counts a step from the field's start over the whole field: only */N (N >= 2) of minutes
            # and hours means the same here and there.
            if match.group(4) and (match.group(1) != "*" or name not in ("minute", "hour") or step < 2):
                raise RequestError(f"schedule's {name} {shown(part)}: a step (/N) is allowed only as */N, N of 2 or "
                                   "more, for minutes and hours (e.g. */15 * * * *)")
            if not (low <= first <= high and low <= last <= high):
                raise RequestError(f"schedule's {name} {shown(part)} is outside {low}-{high}")
            if first > last or step < 1:
                raise RequestError(f"schedule's {name} {shown(part)} is not a range from low to high with a step of "
                                   "1 or more")
            found.update(range(first, last + 1, step))
        values.append(found)
    if 7 in values[4]:
        values[4] = (values[4] - {7}) | {0}  # 7 is Sunday too
    return canonical, values


def _day_matches(values: list[set[int]], day: dt.date, parts: list[str]) -> bool:
    if day.month not in values[3]:
        return False
    in_month, in_week = day.day in values[2], (day.isoweekday() % 7) in values[4]
    if parts[2] != "*" and parts[4] != "*":  # cron: either one, when both are restricted
        return in_month or in_week
    return in_month and in_week


WINDOW_DAYS = 4 * 366  # every pattern of days repeats within it (29 February included)


def _days(canonical: str, values: list[set[int]], start: dt.date, days: int = WINDOW_DAYS) -> list[dt.date]:
    parts = canonical.split(" ")
    found = (start + dt.timedelta(days=offset) for offset in range(days + 1))
    return [day for day in found if _day_matches(values, day, parts)]


def next_run(canonical: str, values: list[set[int]], now: dt.datetime) -> dt.datetime | None:
    """The first time at or after ``now`` (to the minute) the schedule fires."""
    minutes = sorted(h * 60 + m for h in values[1] for m in values[0])
    for day in _days(canonical, values, now.date()):
        for minute in minutes:
            at = dt.datetime.combine(day, dt.time(), now.tzinfo) + dt.timedelta(minutes=minute)
            if at >= now:
                return at
    return None


def shortest_gap_minutes(canonical: str, values: list[set[int]]) -> int | None:
    """The shortest time between two firings (None: it fires on no day, or once)."""
    minutes = sorted(h * 60 + m for h in values[1] for m in values[0])
    days = _days(canonical, values, dt.date(2026, 1, 1))
    gaps = [b - a for a, b in zip(minutes, minutes[1:], strict=False)] if days else []
    gaps += [(d2 - d1).days * 1440 - minutes[-1] + minutes[0] for d1, d2 in zip(days, days[1:], strict=False)]
    return min(gaps) if gaps else None


def describe(canonical: str) -> str:
    """The schedule in words where it is a common one, else its crontab time."""
    minute, hour, dom, month, dow = canonical.split(" ")
    if minute.isdigit() and hour == "*" and dom == month == dow == "*":
        return f"every hour at :{int(minute):02d}"
    if minute.isdigit() and hour.isdigit():
        at = f"{int(hour):02d}:{int(minute):02d}"
        if dom == month == "*" and dow == "*":
            return f"every day at {at}"
        if dom == month == "*" and dow.isdigit():
            return f"every {DAY_NAMES[int(dow) % 7]} at {at}"
        if dom.isdigit() and month == dow == "*":
            return f"on day {int(dom)} of every month at {at}"
    if canonical == "* * * * *":
        return "every minute"
    return f"at crontab time {canonical}"


def check_schedule(text, minimum_minutes: int) -> tuple[str, str]:
    """The canonical crontab time and its words, if it fires at all and never more often than the
    profile's ``jobs.min_schedule_minutes``."""
    canonical, values = parse_cron(text)
    if not _days(canonical, values, dt.date(2026, 1, 1)):
        raise RequestError(f"schedule {shown(text)} never runs (no such date)")
    gap = shortest_gap_minutes(canonical, values)
    if gap is not None and gap < minimum_minutes:
        raise RequestError(f"schedule {shown(text)} would run every {gap} minute(s); this profile allows a run at "
                           f"most every {minimum_minutes} minutes")
    return canonical, describe(canonical)


# ------------------------------------------------------------------------------ the user's crontab
def _root(home: str | None = None) -> Path:
    return Path(home or os.path.expanduser("~")) / SCHEDULES_DIR


class _Locked:
    """One writer of the user's crontab at a time (her sessions and their threads)."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = root / ".lock"

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def read_crontab() -> str:
    """The user's Slurm crontab ('' when she has none)."""
    try:
        return jobs.slurm().run([jobs.slurm().tool("scrontab"), "-l"])
    except SlurmError as error:
        if "no crontab" in str(error).lower():
            return ""
        raise


def write_crontab(text: str, home: str | None = None) -> None:
    """Replace the user's Slurm crontab with ``text`` (scrontab checks it and refuses it whole)."""
    root = _root(home)
    fd, path = tempfile.mkstemp(dir=root, prefix=".crontab-", text=True)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        jobs.slurm().run([jobs.slurm().tool("scrontab"), path])
    finally:
        os.unlink(path)
    _in_crontab.update(at=time.monotonic(), ids=set(_blocks(text)[1]))


_in_crontab: dict = {"at": float("-inf"), "ids": set()}  # the schedules her Slurm crontab holds, as last read
CRONTAB_MAX_AGE = 15.0  # seconds: the Jobs panel lists schedules every few seconds; scrontab -l asks slurmctld


def in_crontab(max_age: float = CRONTAB_MAX_AGE) -> set[str] | None:
    """The ids of the schedules in her Slurm crontab (read at most every ``max_age`` s); None if Slurm does
    not answer."""
    if time.monotonic() - _in_crontab["at"] > max_age:
        try:
            _in_crontab.update(at=time.monotonic(), ids=set(_blocks(read_crontab())[1]))
        except SlurmError:
            return None
    return _in_crontab["ids"]


def _blocks(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The crontab's lines outside dsportal's blocks, and each block's lines by schedule id."""
    outside, blocks, current = [], {}, None
    for line in text.splitlines():
        line = _SLURM_MARKS.sub("", line)  # what Slurm marks: a cancelled entry's lines, a refused one's
        begin = re.match(r"^# dsportal-schedule ([0-9a-f]{8}) begin\b", line)
        if begin:
            current = begin.group(1)
            blocks[current] = [line]
            continue
        if current is not None:
            blocks[current].append(line)
            if line == END.format(id=current):
                current = None
            continue
        outside.append(line)
    return outside, blocks


def _join(outside: list[str], blocks: dict[str, list[str]]) -> str:
    lines = [line for line in outside]
    while lines and not lines[-1].strip():
        lines.pop()
    for block in blocks.values():
        lines.extend(block)
    return "\n".join(lines) + "\n" if lines else ""


def _block(schedule: dict, paused: bool) -> list[str]:
    """The crontab lines of one schedule: its firing job's options, then its time and command."""
    folder, profile = schedule["folder"], schedule["profile"]
    options = [f"--job-name=dsportal-schedule-{schedule['id']}", f"--partition={profile['partition']}",
               "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--mem=1G", "--time=00:10:00",
               f"--output={folder}/cron.log", f"--chdir={schedule['home']}",
               f"--comment=dsportal-profile={profile['name']},dsportal-schedule={schedule['id']}"]
    options += [f"--{key}={profile[key]}" for key in ("account", "qos", "reservation") if profile.get(key)]
    command = [schedule["python"], "-P", "-m", "portal.session.job.schedules", "fire", folder]  # -P: not from ~
    # The session's own Slurm commands (a cluster's /opt/slurm/bin), where cron's PATH would not find them.
    slurm_bin = schedule.get("slurm_bin", "")
    path = [f"PATH={slurm_bin}:{CRON_PATH}"] if slurm_bin and slurm_bin not in CRON_PATH.split(":") else []
    conf = [f"SLURM_CONF={schedule['slurm_conf']}"] if schedule.get("slurm_conf") else []
    if path or conf:
        command = ["/usr/bin/env", *conf, *path, *command]
    entry = f"{schedule['cron']} {shlex.join(command)}"
    lines = [*(f"#SCRON {option}" for option in options), entry]
    if paused:  # every line, options too: Slurm carries #SCRON options over plain comments to the next entry
        lines = [PAUSED + line for line in lines]
    return [BEGIN.format(id=schedule["id"]), *lines, END.format(id=schedule["id"])]


# ------------------------------------------------------------------------------ schedules
def _load(schedule_id: str, home: str | None = None) -> dict:
    if not isinstance(schedule_id, str) or not _ID.match(schedule_id):
        raise ScheduleNotFound(f"no schedule {shown(schedule_id)}")
    folder = _root(home) / schedule_id
    try:
        schedule = json.loads((folder / "schedule.json").read_text())
        if not isinstance(schedule, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        raise ScheduleNotFound(f"no schedule {schedule_id} of yours") from None
    # Its folder by its id, whatever the file says: the files removed or written are always these.
    return {**schedule, "id": schedule_id, "folder": str(folder), "home": str(Path(home or os.path.expanduser("~")))}


def _save(schedule: dict) -> None:
    write_whole(Path(schedule["folder"]) / "schedule.json", json.dumps(schedule, indent=1))


def create(request: dict, policy: LaunchPolicy, base_dir: str, home: str | None = None) -> dict:
    """A schedule for a notebook job request: checked now as the job itself would be (profile, GPUs,
    image, walltime, parameters), the notebook copied, the crontab entry written."""
    home = home or os.path.expanduser("~")
    if not isinstance(request, dict):
        raise RequestError("a schedule is a notebook job request with a 'schedule', e.g. {'notebook': 'a.ipynb', "
                           "'schedule': '0 2 * * *'}")
    request = dict(request)
    when = request.pop("schedule", None)
    plan = jobs.plan(request, policy, base_dir)
    if plan.notebook is None:
        raise RequestError("only a notebook runs on a schedule: give 'notebook'")
    if plan.array:
        raise RequestError("a grid of parameters cannot run on a schedule: schedule one set of parameters")
    canonical, words = check_schedule(when, plan.profile.jobs.min_schedule_minutes)
    notebook = jobs._read_notebook(plan.notebook)
    root = _root(home)
    with _Locked(root):
        mine = [s for s in list_schedules(home) if s["profile"]["name"] == plan.profile.name]
        if len(mine) >= plan.profile.jobs.max_schedules:
            raise RequestError(f"you have {len(mine)} schedule(s) on {plan.profile.display_name}, the most it allows "
                               f"({plan.profile.jobs.max_schedules}): delete one first")
        schedule_id = secrets.token_hex(4)
        folder = root / schedule_id
        folder.mkdir(mode=0o700)
        (folder / jobs.INPUT).write_bytes(notebook)
        schedule = {
            "id": schedule_id, "folder": str(folder), "home": home, "created": time.time(), "cron": canonical,
            "words": words, "notebook": plan.notebook, "paused": False,
            # Each run named after her notebook (not the copy), as a job she launched herself would be.
            "request": {**request, "notebook": str(folder / jobs.INPUT), "name": plan.name},
            "policy": json.loads(policy.to_env()),
            "profile": plan.profile.model_dump(mode="json"), "description": plan.describe(),
            "python": f"{policy.environment.rstrip('/')}/bin/python", "slurm_conf": os.environ.get("SLURM_CONF", ""),
            "slurm_bin": os.path.dirname(shutil.which("sbatch") or ""),
        }
        _save(schedule)
        outside, blocks = _blocks(read_crontab())
        blocks[schedule_id] = _block(schedule, paused=False)
        try:
            write_crontab(_join(outside, blocks), home)
        except Exception:
            try:  # slurmctld may have taken it and not answered in time: then it is made
                taken = schedule_id in _blocks(read_crontab())[1]
            except SlurmError:
                taken = False
            if not taken:
                shutil.rmtree(folder, ignore_errors=True)
                raise
    return _public(schedule)


def listed(home: str | None = None) -> list[dict]:
    """Her schedules as the Jobs panel shows them, each one her crontab lost (``scrontab -r`` in a
    terminal, say) saying so."""
    found = [_public(s) for s in list_schedules(home)]
    held = in_crontab() if _root(home).is_dir() else set()  # (one who never made a schedule: no Slurm call)
    for schedule in found:
        if held is not None and schedule["id"] not in held:
            schedule["next"] = None
            schedule["problem"] = ("no longer in your Slurm crontab (changed outside the Jobs panel, e.g. scrontab -r): "
                                   "it does not run; delete it and schedule the notebook again")
    # And the other way round: an entry of dsportal's whose record is gone (its folder removed by hand).
    for orphan in sorted((held or set()) - {s["id"] for s in found}):
        found.append({"id": orphan, "schedule": "", "words": "", "next": None, "notebook": "(unknown)", "paused": False,
                      "created": 0, "profile": "", "description": "", "runs": 0, "last_run": None,
                      "problem": "in your Slurm crontab, but its record in ~/.dsportal/schedules is gone: delete it"})
    return found


def list_schedules(home: str | None = None) -> list[dict]:
    """The user's schedules, newest first."""
    root, found = _root(home), []
    if not root.is_dir():
        return []
    for folder in root.iterdir():
        if _ID.match(folder.name):
            try:
                found.append(_load(folder.name, home))
            except ScheduleNotFound:
                continue
    return sorted(found, key=lambda s: -s["created"])


def set_paused(schedule_id: str, paused: bool, home: str | None = None) -> dict:
    """Pause (its crontab line commented out: Slurm drops its pending run) or resume a schedule."""
    with _Locked(_root(home)):
        schedule = _load(schedule_id, home)  # inside the lock: not one a Delete just removed
        outside, blocks = _blocks(read_crontab())
        blocks[schedule_id] = _block(schedule, paused=paused)
        write_crontab(_join(outside, blocks), home)
        schedule["paused"] = paused
        _save(schedule)
    return _public(schedule)


def delete(schedule_id: str, home: str | None = None) -> dict:
    """The schedule's crontab entry removed (Slurm cancels its pending run); its past runs stay jobs."""
    with _Locked(_root(home)):
        try:
            schedule = _load(schedule_id, home)
        except ScheduleNotFound:
            schedule = None  # its record gone: its crontab entry, if any, goes all the same
        outside, blocks = _blocks(read_crontab())
        if schedule is None and schedule_id not in blocks:
            raise ScheduleNotFound(f"no schedule {shown(schedule_id)} of yours")
        blocks.pop(schedule_id, None)
        write_crontab(_join(outside, blocks), home)
        public = _public(schedule) if schedule else {"id": schedule_id}
        shutil.rmtree(_root(home) / schedule_id, ignore_errors=True)  # a run that starts now finds nothing to run
    return {**public, "deleted": True}


def runs(folder: Path) -> tuple[int, int | None]:
    """How many runs the schedule in ``folder`` submitted, and the latest one's job id."""
    try:
        ids = [line for line in (folder / "runs").read_text().split() if line.isdigit()]
    except OSError:
        return 0, None
    return len(ids), int(ids[-1]) if ids else None


def _public(schedule: dict) -> dict:
    canonical, values = parse_cron(schedule["cron"])
    now = dt.datetime.now().replace(second=0, microsecond=0) + dt.timedelta(minutes=1)  # this minute's run has gone
    upcoming = None if schedule["paused"] else next_run(canonical, values, now)
    return {"next": upcoming.strftime("%Y-%m-%d %H:%M") if upcoming else None,
            "id": schedule["id"], "schedule": schedule["cron"], "words": schedule["words"],
            "notebook": schedule["notebook"], "paused": schedule["paused"], "created": schedule["created"],
            "profile": schedule["profile"]["name"], "description": schedule["description"],
            **dict(zip(("runs", "last_run"), runs(Path(schedule["folder"])), strict=True)),
            "problem": _problem(Path(schedule["folder"]))}


def _problem(folder: Path) -> str:
    try:
        return (folder / PROBLEM).read_text()[:1000]
    except OSError:
        return ""


# ------------------------------------------------------------------------------ a firing
def fire(folder: Path) -> int:
    """Run by the schedule's Slurm cron job: submit the notebook as a notebook job of its own."""
    os.environ.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")  # cron's jobs may start with a bare one
    try:
        schedule = json.loads((folder / "schedule.json").read_text())
    except FileNotFoundError:  # deleted while this run waited to start
        print(f"dsportal: the schedule in {folder} was deleted: nothing to run", flush=True)
        return 0
    except (OSError, ValueError) as error:
        return _not_submitted(folder, f"its record cannot be read ({error})")
    print(f"dsportal: schedule {folder.name} fires at {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    try:
        policy = LaunchPolicy.model_validate(schedule["policy"])
        home = schedule["home"]
        plan = jobs.plan(schedule["request"], policy, home)
        info = jobs.submit(plan, policy, home, shown_as=schedule["notebook"], schedule=folder.name)
    except (RequestError, SlurmError, OSError) as error:
        return _not_submitted(folder, str(error))
    except Exception as error:  # noqa: BLE001 - e.g. a record an older dsportal wrote: said on the schedule's row
        return _not_submitted(folder, f"{type(error).__name__}: {error}")
    try:
        with open(folder / "runs", "a") as file:
            file.write(f"{info.job_id}\n")
        (folder / PROBLEM).unlink(missing_ok=True)
    except OSError:  # deleted meanwhile
        pass
    print(f"dsportal: submitted job {info.job_id}: {schedule.get('description', '')}", flush=True)
    return 0


def _not_submitted(folder: Path, why: str) -> int:
    print(f"dsportal: this run was not submitted: {why}", flush=True)
    try:  # the Jobs panel shows it on the schedule's row
        write_whole(folder / PROBLEM, f"{time.strftime('%Y-%m-%d %H:%M')}: the run was not submitted: {why}"[:1000])
    except OSError:
        pass
    return 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "fire":
        print("usage: python -m portal.session.job.schedules fire SCHEDULE_FOLDER", file=sys.stderr)
        return 2
    return fire(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main())
