"""What every part of the demo cluster shares: its state folder, its daemons' pid files, its config files."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from portal.admin.pidfiles import alive as alive  # the demo's modules take it from here

STATE = Path(os.environ.get("DSPORTAL_DEMO_DIR", "/var/lib/dsportal-demo"))
# The Slurm release the demo runs: $DSPORTAL_SLURM (make demo SLURM=24.11 sets it), else the release the demo's
# Slurm state is of (STATE/slurm/release: a demo on 24.11 stays on 24.11 until another is asked for). Empty or
# 22.05: the machine's own (Debian bookworm's slurm-wlm 22.05, in /usr); else scripts/build-slurm.sh's installation of
# that release in /opt/dsportal-slurm/RELEASE. A newer release runs configless, as sites do: the login node (the
# hub, the tests) has no slurm.conf, and sackd there fetches it from slurmctld (SlurmctldParameters=enable_configless).
DEBIANS_OWN = "22.05"
SLURM_PREFIXES = Path(os.environ.get("DSPORTAL_SLURM_PREFIX", "/opt/dsportal-slurm"))


def release_file() -> Path:
    """Where the demo records the release its Slurm state is of (written once slurmctld's is)."""
    return STATE / "slurm" / "release"


def recorded_release() -> str | None:
    """The release the demo's Slurm state is of ("": Debian's own); None before any was recorded."""
    return release_file().read_text().strip() if release_file().is_file() else None


def _release() -> str:
    asked = os.environ.get("DSPORTAL_SLURM")
    if asked is None:
        asked = recorded_release() or ""
    asked = "" if asked in ("", DEBIANS_OWN) else asked
    if asked and not re.fullmatch(r"[0-9]{2}\.[0-9]{2}", asked):
        raise SystemExit(f"DSPORTAL_SLURM={asked!r}: a Slurm release is YY.MM (24.11, 26.05) or {DEBIANS_OWN} (Debian's)")
    return asked


SLURM_RELEASE = _release()
CONFIGLESS = bool(SLURM_RELEASE)


class DemoError(RuntimeError):
    pass


def demo_file(name: str) -> Path:
    """A file of the checkout's config/demo/: the demo runs from the checkout, never from the installed package."""
    return Path(__file__).resolve().parents[1] / "config" / "demo" / name


def render(name: str, **context) -> str:
    return jinja2.Template(demo_file(name).read_text(), undefined=jinja2.StrictUndefined).render(**context)


def has_pmix() -> bool:
    """Whether the demo's Slurm has its PMIx plugin (srun --mpi=pmix)."""
    plugins = slurm_build().get("plugin_dir") or str(slurm_prefix() / "lib" / "slurm")
    return not SLURM_RELEASE or (Path(plugins) / "mpi_pmix.so").exists()


def release_config(config: Path) -> Path:
    """The portal.yaml the demo runs on SLURM_RELEASE: ``config`` (the checkout's by default) with slurm.bin_dir
    that release's commands and, configless, no slurm.conf (and the jobs' ranks started by mpirun where that Slurm
    has no PMIx plugin): STATE/config/portal-RELEASE.yaml, which the
    Makefile names ($DSPORTAL_CONFIG) for make demo, make test and make check with SLURM=RELEASE.
    ``config`` as it is on Debian's own release."""
    if not SLURM_RELEASE:
        return config
    target = STATE / "config" / f"portal-{SLURM_RELEASE}.yaml"
    source = demo_file("../portal.yaml") if Path(os.path.realpath(config)) == Path(os.path.realpath(target)) else config
    values = {"bin_dir": str(slurm_prefix() / "bin"), "conf": "null" if CONFIGLESS else str(slurm_conf_path())}
    text, pmix = Path(source).read_text(), has_pmix()
    # A Slurm built without its PMIx plugin (Debian unstable's 26.05.5): the jobs' ranks through Open MPI's mpirun
    # inside the allocation (dsportal check names the plugin a profile asks for and this Slurm lacks), for the
    # profiles whose jobs say srun and for those without a jobs section (whose default is srun --mpi=pmix).
    bare = set() if pmix else {p["name"] for p in yaml.safe_load(text).get("profiles", []) if "jobs" not in p}
    no_pmix = f"   # Slurm {SLURM_RELEASE} here has no mpi/pmix"
    lines, found, section = [], set(), ""
    for line in text.splitlines(keepends=True):
        if line[:1].isalpha():
            section = line.split(":", 1)[0]
        key = line.strip().split(":", 1)[0]
        if section == "slurm" and line.startswith("  ") and line[2:3].isalpha() and key in values:
            line = f"  {key}: {values[key]}   # make demo SLURM={SLURM_RELEASE}\n"
            found.add(key)
        elif line.strip() == "launcher: srun" and not pmix:
            line = line.replace("launcher: srun", f"launcher: mpirun{no_pmix}")
        lines.append(line)
        if section == "profiles" and line.startswith("  - name: ") and line.split(":", 1)[1].split("#")[0].strip() in bare:
            lines.append(f"    jobs: {{launcher: mpirun}}{no_pmix}\n")
    if {"bin_dir", "conf"} - found:
        raise DemoError(f"{source}: no slurm.bin_dir and slurm.conf to set for Slurm {SLURM_RELEASE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(target.parent, 0o755)
    write_if_changed(target, "".join(lines), 0o644)
    return target


BENCH = "DSPORTAL_DEMO_BENCH"  # "1": each course as many as its bench_students (make bench's department)


def directory() -> dict:
    """users.yaml, with each course's students added as users, group members and a Slurm account (with
    DSPORTAL_DEMO_BENCH=1, a course's bench_students where it gives them)."""
    data = yaml.safe_load(demo_file("users.yaml").read_text())
    for course in data.get("courses", []):
        count = course.get("bench_students", course["students"]) if os.environ.get(BENCH) == "1" else course["students"]
        students = [f"{course['prefix']}{n:02d}" for n in range(1, int(count) + 1)]
        data["users"] += [{"name": name, "uid": int(course["first_uid"]) + n, "full_name": f"Student {name}",
                           "password": f"{name}-demo", "role": f"student of {course['name']}", "student": True,
                           "course": course["name"]}
                          for n, name in enumerate(students)]
        data["groups"].append({"name": course["name"], "gid": course["gid"],
                               "members": [course["instructor"], *students]})
        next(g for g in data["groups"] if g["name"] == data["login_group"])["members"] += students
        data["slurm_accounts"].append({"name": course["name"], "description": course["description"],
                                       "users": [course["instructor"], *students]})
    return data


def write_if_changed(path: Path, text: str, mode: int) -> bool:
    """Write ``text`` unless the file already holds it (an unchanged config keeps its mtime, which
    decides whether daemons restart); the mode is set either way. True when written."""
    changed = not path.exists() or path.read_text() != text
    if changed:
        path.write_text(text)
    os.chmod(path, mode)
    return changed


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def secret_file(path: Path, owner_of: Path) -> None:
    """A random secret at ``path`` (made once, never rewritten), mode 0600, owned as ``owner_of`` is,
    each time: the hub's data folder, which may have changed hands since (the hub's own account)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
        say(f"secret written to {path}")
    owner = os.stat(owner_of if owner_of.exists() else path.parent)
    os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)
    os.chmod(path, 0o600)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise DemoError(f"{' '.join(argv)} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}")
    return result


def stop_pid(pidfile: Path, name: str, wait: float = 10.0, group: bool = False) -> None:
    """TERM, then KILL after ``wait`` s, to the pid in ``pidfile`` (``group``: its whole process group,
    whose leader it is)."""
    pid = alive(pidfile)
    if not pid:
        return
    kill = os.killpg if group else os.kill
    try:
        kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and alive(pidfile):
            time.sleep(0.2)
        if alive(pidfile):
            kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    say(f"stopped {name}")
    pidfile.unlink(missing_ok=True)


def wait_for(check, what: str, timeout: float = 30.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as error:  # noqa: BLE001 - any failure means "not yet"
            last_error = error
        time.sleep(interval)
    raise DemoError(f"{what} did not come up within {timeout:.0f} s" + (f": {last_error}" if last_error else ""))


@dataclass(frozen=True)
class Paths:
    root: Path

    def __getattr__(self, name):  # state.munge, state.slurm, state.ldap, state.log, state.run, state.gpus
        return self.root / name


def paths() -> Paths:
    return Paths(STATE)


def slurm_conf_path() -> Path:
    return paths().slurm / "slurm.conf"


def slurm_prefix(release: str | None = None) -> Path:
    """Where ``release``'s Slurm is installed (bin, sbin; None: the demo's release)."""
    release = SLURM_RELEASE if release is None else release
    return SLURM_PREFIXES / release if release else Path("/usr")


def slurm_build(release: str | None = None) -> dict[str, str]:
    """What scripts/build-slurm.sh or unpack-slurm.sh wrote of ``release``'s installation (its stamp): version,
    source, and for Debian's binary packages (unpack-slurm.sh) the plugin_dir and slurmstepd that Debian
    compiled in elsewhere. Empty for Debian's own Slurm."""
    release = SLURM_RELEASE if release is None else release
    if not release:
        return {}
    stamp = slurm_prefix(release) / ".dsportal-slurm"
    if not stamp.is_file():
        raise DemoError(f"Slurm {release} is not installed in {slurm_prefix(release)}: make demo SLURM={release} "
                        f"builds it (scripts/build-slurm.sh {release})")
    return dict(line.split("=", 1) for line in stamp.read_text().splitlines() if "=" in line)


def slurm_daemon(name: str, release: str | None = None) -> str:
    """slurmctld, slurmd, slurmdbd or sackd of the demo's release."""
    return str(slurm_prefix(release) / "sbin" / name)


def slurm_env(release: str | None = None) -> dict[str, str]:
    """The environment of the daemons and of the demo's own Slurm commands (the cluster's admin, on the
    controller's host: it reads slurm.conf), with ``release``'s commands first on the PATH."""
    release = SLURM_RELEASE if release is None else release
    path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    if release:
        path = f"{slurm_prefix(release) / 'bin'}:{path}"
    return {**os.environ, "PATH": path, "SLURM_CONF": str(slurm_conf_path())}
