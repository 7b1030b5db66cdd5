"""`dsportal usage`: who used which GPUs and CPUs, from Slurm accounting (slurmdbd, `sacct`).

Rows are per user, Slurm account (a course or group is charged to its own account) and portal
profile. The profile comes from the job's comment (`dsportal-profile=NAME`, which session and
multi-node jobs carry; slurm.conf needs `AccountingStoreFlags=job_comment`); jobs without one show
their partition in brackets. Sessions (jobs named dsportal-<user>) and multi-node jobs are counted
apart. GPU-hours are the job's allocated GPUs (AllocTRES gres/gpu, all nodes) times its elapsed
time, a share of a GPU (gres/shard) counting as its part of one (its partition's shards per GPU, from
sinfo: what Slurm gave, whatever the job says of itself);
CPU-hours likewise with AllocTRES cpu. One sacct call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from portal.slurm.slurmclient import SlurmCommands
from portal.slurm.slurmparse import SlurmError, gpus_and_shards, profile_of

FIELDS = ("JobID", "User", "JobName", "Partition", "Account", "Comment", "State", "ElapsedRaw", "AllocTRES")
KEYS = ("user", "account", "profile")
_GPUS = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")
_CPUS = re.compile(r"(?:^|,)cpu=(\d+)")
_SINCE = re.compile(r"^(\d+)([hdw])$")


class UsageUnavailable(RuntimeError):
    """sacct failed: no accounting on this cluster, or slurmdbd does not answer."""


@dataclass
class Row:
    user: str
    account: str
    profile: str
    sessions: int = 0
    session_gpu_s: float = 0.0
    jobs: int = 0
    job_gpu_s: float = 0.0
    cpu_s: float = 0.0
    states: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_hours(self) -> float:
        return (self.session_gpu_s + self.job_gpu_s) / 3600

    def add(self, other: Row) -> None:
        self.sessions += other.sessions
        self.session_gpu_s += other.session_gpu_s
        self.jobs += other.jobs
        self.job_gpu_s += other.job_gpu_s
        self.cpu_s += other.cpu_s
        for state, n in other.states.items():
            self.states[state] = self.states.get(state, 0) + n


def since_time(text: str, now: datetime | None = None) -> datetime:
    """'7d', '12h', '2w' (back from now) or a date '2026-11-01' -> the start of the report."""
    now = now or datetime.now()
    match = _SINCE.match(text.strip())
    if match:
        number, unit = int(match.group(1)), match.group(2)
        return now - {"h": timedelta(hours=number), "d": timedelta(days=number), "w": timedelta(weeks=number)}[unit]
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a time like 7d, 12h, 2w or 2026-11-01") from None


def gpus_of(tres: str) -> int:
    # Typed GPUs (gres/gpu:h100=2) appear beside the untyped total (gres/gpu=2): take the total.
    untyped = re.search(r"(?:^|,)gres/gpu=(\d+)", tres or "")
    return int(untyped.group(1)) if untyped else sum(int(n) for n in _GPUS.findall(tres or ""))


_SHARDS = re.compile(r"(?:^|,)gres/shard=(\d+)")


def gpu_seconds(tres: str, elapsed: int, shares_per_gpu: int) -> float:
    """GPU-seconds of a job: its whole GPUs, and its GPU shares as their part of a GPU."""
    shards = _SHARDS.search(tres or "")
    shared = int(shards.group(1)) / shares_per_gpu if shards and shares_per_gpu else 0.0
    return (gpus_of(tres) + shared) * elapsed


def shards_per_gpu(slurm: SlurmCommands) -> dict[str, int]:
    """Each partition's shards per GPU (its nodes' Gres: shard count over GPU count; the most common
    where its nodes differ); partitions without shards are left out."""
    ratios: dict[str, list[int]] = {}
    for line in slurm.run([slurm.tool("sinfo"), "-h", "-N", "-o", "%P %G"]).splitlines():
        partition, _, gres = line.strip().partition(" ")
        gpus, shards = gpus_and_shards(gres)
        if gpus and shards:
            ratios.setdefault(partition.rstrip("*"), []).append(shards // gpus)
    return {partition: max(set(found), key=found.count) for partition, found in ratios.items()}


def summed(records: list[dict[str, str]], shares_per_gpu: dict[str, int] | None = None) -> dict[tuple[str, str, str], Row]:
    """Accounting's records (FIELDS) summed per user, account and profile (``shares_per_gpu``: each
    partition's shards per GPU, for jobs holding shares of a GPU)."""
    rows: dict[tuple[str, str, str], Row] = {}
    for record in records:
        profile = profile_of(record["Comment"]) or f"({record['Partition']})"
        key = (record["User"], record["Account"] or "-", profile)
        row = rows.setdefault(key, Row(*key))
        elapsed = int(record["ElapsedRaw"] or 0)
        gpu_s = gpu_seconds(record["AllocTRES"], elapsed, (shares_per_gpu or {}).get(record["Partition"], 0))
        cpus = _CPUS.search(record["AllocTRES"] or "")
        row.cpu_s += (int(cpus.group(1)) if cpus else 0) * elapsed
        if record["JobName"].startswith("dsportal-") and not record["JobName"].startswith("dsportal-schedule-"):
            row.sessions += 1
            row.session_gpu_s += gpu_s
        else:
            row.jobs += 1
            row.job_gpu_s += gpu_s
        state = (record["State"].split() or ["?"])[0]
        row.states[state] = row.states.get(state, 0) + 1
    return rows


def grouped(rows: dict[tuple[str, str, str], Row], by: tuple[str, ...]) -> dict[tuple[str, ...], Row]:
    """The rows summed over what `by` leaves out (by: some of user, account, profile)."""
    result: dict[tuple[str, ...], Row] = {}
    for key, row in rows.items():
        named = dict(zip(KEYS, key, strict=True))
        short = tuple(named[k] for k in by)
        target = result.setdefault(short, Row(*(named[k] if k in by else "*" for k in KEYS)))
        target.add(row)
    return result


def collect(since: datetime, slurm: SlurmCommands, user: str | None = None) -> dict[tuple[str, str, str], Row]:
    try:
        return summed(slurm.accounting_since(since.strftime("%Y-%m-%dT%H:%M:%S"), FIELDS, user=user),
                      shards_per_gpu(slurm))
    except SlurmError as error:
        raise UsageUnavailable(str(error)) from None


def report(rows: dict[tuple[str, str, str], Row], since: datetime, by: tuple[str, ...] = KEYS) -> str:
    widths = {"user": 12, "account": 12, "profile": 14}
    table = grouped(rows, by)
    lines = [" ".join(f"{k:<{widths[k]}}" for k in by) +
             f" {'sessions':>8} {'session GPU-h':>13} {'jobs':>5} {'job GPU-h':>9} {'CPU-h':>9}  states"]
    for key, row in sorted(table.items(), key=lambda item: (-item[1].gpu_hours, -item[1].cpu_s, item[0])):
        states = ", ".join(f"{state} {n}" for state, n in sorted(row.states.items()))
        lines.append(" ".join(f"{value:<{widths[k]}}" for k, value in zip(by, key, strict=True)) +
                     f" {row.sessions:>8} {row.session_gpu_s / 3600:>13.3f} {row.jobs:>5} {row.job_gpu_s / 3600:>9.3f}"
                     f" {row.cpu_s / 3600:>9.3f}  {states}")
    users = len({user for user, _, _ in rows})
    lines.append(f"usage: {sum(r.gpu_hours for r in rows.values()):.3f} GPU-hours and "
                 f"{sum(r.cpu_s for r in rows.values()) / 3600:.3f} CPU-hours by {users} user(s) since "
                 f"{since:%Y-%m-%d %H:%M} ({sum(r.sessions for r in rows.values())} sessions, "
                 f"{sum(r.jobs for r in rows.values())} jobs)")
    return "\n".join(lines)
