"""``dsportal templates check``: run every template notebook headless and report each.

Each notebook runs top to bottom with nbclient in the session environment's ``python3``
kernel, as a portal user with the job launch policy a session of theirs would get (so the
launcher magics submit that user's jobs): ``--user``, else per source its owner or a user who
may open it (:func:`check_user`); one runner process per user. It runs in a scratch copy of its
folder, with ``DSPORTAL_TEMPLATE_CHECK=1`` so notebooks pick their short settings (fewer epochs).
Whatever a notebook started (TensorBoard, ...) is stopped after it. A failure names the cell and
the error; full tracebacks and the kernels' messages go to a log, each part under the notebook's
name. The last line is the summary; the exit status is 0 only when every notebook passed.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from portal.core import sessionvars
from portal.core.notebookcells import cell_label, failure_reason, full_traceback
from portal.core.rules import LaunchPolicy, may_use
from portal.core.sessionspec import SessionSpec
from portal.core.templatesources import notebooks
from portal.core.userjson import unix_groups
from portal.slurm.slurmclient import slurm_first

CHECK_ENV = sessionvars.TEMPLATE_CHECK
RUN_MARK = sessionvars.TEMPLATE_RUN
RESULT_CHARS = 64 * 1024  # the longest line root reads from a runner (a result is far shorter)


def run_one(notebook: Path, timeout: int) -> dict:
    """Execute one notebook in a scratch copy of its folder; never raises.

    A failure's reason names the cell and the error. Its full traceback goes to stderr (the
    check's log), after a line naming the notebook, which the kernel's own messages follow too.
    """
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    started = time.monotonic()
    mark = uuid.uuid4().hex
    os.environ[RUN_MARK] = mark
    result = {"notebook": str(notebook), "passed": False, "seconds": 0.0, "error": ""}
    scratch = Path(tempfile.mkdtemp(prefix="dsportal-template-check-"))
    print(f"==== {notebook} (as {pwd.getpwuid(os.getuid()).pw_name}) ====", file=sys.stderr, flush=True)
    running = {}  # the cell being executed: nbclient's errors do not say which one
    try:
        shutil.copytree(notebook.parent, scratch, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        nb = nbformat.read(scratch / notebook.name, as_version=4)
        # The kernel's channels are unix sockets in the scratch folder (mkdtemp: 0700), not TCP
        # ports of the login node that anyone there could connect to.
        kernel = KernelManager(kernel_name="python3", transport="ipc", connection_file=str(scratch / "kernel.json"))
        # The kernel's temporary files too (TensorBoard's .tensorboard-info, which it makes 0777):
        # on the login node /tmp is everybody's, unlike in a session job.
        os.environ["TMPDIR"] = str(scratch)
        client = NotebookClient(nb, km=kernel, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(scratch)}},
                                on_cell_execute=lambda cell, cell_index: running.update(
                                    cell=cell_label(nb.cells, cell_index)))
        client.execute()
        result["passed"] = True
    except Exception as error:  # noqa: BLE001 - a broken notebook file is a failed check too, not a crash of the check
        result["error"] = failure_reason(error, running.get("cell"), timeout)[:300]
        print(f"---- {notebook}: {result['error']}\n{full_traceback(error)}", file=sys.stderr, flush=True)
    finally:
        result["seconds"] = round(time.monotonic() - started, 1)
        _stop_leftovers(mark)
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def _stop_leftovers(mark: str) -> None:
    """Stop processes the notebook left running (they inherited the run's mark)."""
    needle = f"{RUN_MARK}={mark}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def _runner_main(argv: list[str]) -> int:
    """``python -m portal.admin.templatecheck TIMEOUT NOTEBOOK...``: one JSON line per notebook."""
    timeout, paths = int(argv[0]), argv[1:]
    for path in paths:
        print(json.dumps(run_one(Path(path), timeout)), flush=True)
    return 0


def _result(line: str) -> dict:
    """A runner's JSON line as the result it must be; ValueError for anything else."""
    result = json.loads(line)
    if not isinstance(result, dict) or not isinstance(result.get("passed"), bool):
        raise ValueError("not a result")
    return {"notebook": _printable(result.get("notebook", "")), "passed": result["passed"],
            "seconds": float(result.get("seconds") or 0), "error": _printable(result.get("error") or "")}


def _printable(value) -> str:
    """Text from the user's runner, as root's terminal may show it: short, no control characters."""
    return "".join(char if char.isprintable() else "?" for char in str(value)[:300])


class NoCheckUser(Exception):
    """No portal user to run a source's notebooks as; the message says what to pass instead."""


class Row(NamedTuple):
    source: str
    folder: Path
    notebook: Path
    user: str

    @property
    def name(self) -> str:
        return f"{self.source}/{self.notebook.relative_to(self.folder).as_posix()}"


def login_groups(settings) -> list[str]:
    """The Unix names of ldap.allowed_groups (cn=datascience,ou=groups,... -> datascience), or oidc.allowed_groups."""
    if settings.oidc:
        return list(settings.oidc.allowed_groups)
    found = (re.match(r"\s*[^=,]+=([^,]+)", dn) for dn in settings.ldap.allowed_groups)
    return [match.group(1).strip() for match in found if match]


def group_members(group: str) -> list[str]:
    """The group's members, sorted; accounts having it as their primary group included."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return []
    primary = {account.pw_name for account in pwd.getpwall() if account.pw_gid == entry.gr_gid}
    return sorted(set(entry.gr_mem) | primary)


def may_open(settings, source, user: str) -> bool:
    """The user may log in, sees the source and may start a session (so gets a job launch policy)."""
    groups = unix_groups(user)
    allowed = set(login_groups(settings))
    return ((not allowed or bool(groups & allowed))
            and (not source.groups or bool(groups & set(source.groups)))
            and any(may_use(profile, groups) for profile in settings.profiles))


def check_user(settings, source) -> tuple[str, str]:
    """Whom a source's notebooks run as when root checks them without --user, and why.

    Its owner; else the first member (sorted) who may open it of the groups that see it, else of
    those that may use the default profile, else of those that may log in. Root's own kernel has
    no job launch policy, so a notebook launching a job could never pass as root.
    """
    if source.owner:
        return _account(source.owner, f"source {source.name}: its owner"), "its owner"
    groups = source.groups or settings.profile().groups or login_groups(settings)
    for group in groups:
        for user in group_members(group):
            if may_open(settings, source, user):
                return user, f"a member of {group}"
    where = (f"no member of {', '.join(groups)} may log in, see it and start a session" if groups else
             "neither it, the default profile nor ldap.allowed_groups names a group to take a user from")
    raise NoCheckUser(f"source {source.name} has no owner and {where}; pass --user NAME, an account that "
                      "may start a portal session and see the source (or set the source's owner)")


def _account(user: str, named_by: str) -> str:
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise NoCheckUser(f"{named_by} {user!r} is no account here; pass --user NAME, "
                          "an account that may start a portal session") from None
    return user


def users_for(settings, sources: list, user: str | None) -> dict[str, tuple[str, str]]:
    """Source name -> (the account its notebooks run as, why that one)."""
    if user:
        return {source.name: (_account(user, "--user"), "--user") for source in sources}
    if os.geteuid() != 0:  # only root may run them as someone else
        yourself = pwd.getpwuid(os.geteuid()).pw_name
        return {source.name: (yourself, "yourself") for source in sources}
    return {source.name: check_user(settings, source) for source in sources}


def _user_env(settings, user: str) -> dict[str, str]:
    """The runner's whole environment, built here: what a session of the user's would hold that
    a notebook needs, never root's own (its secrets, PYTHON* variables, ...)."""
    prefix = str(settings.session.environment)
    entry = pwd.getpwnam(user)
    path = slurm_first(settings.slurm.bin_dir, "/usr/local/bin:/usr/bin:/bin")  # the cluster's Slurm, as a session's
    env = {"PATH": f"{prefix}/bin:{path}", "HOME": entry.pw_dir, "USER": user,
           "LOGNAME": user, "SHELL": entry.pw_shell or "/bin/sh", "LANG": os.environ.get("LANG") or "C.UTF-8",
           "TERM": "dumb", CHECK_ENV: "1", **settings.slurm_env()}
    profiles = [p for p in settings.profiles if may_use(p, unix_groups(user))]
    if profiles:  # what the hub would give this user's session: the job launcher works in templates
        default = settings.profile().name if settings.profile() in profiles else profiles[0].name
        env[sessionvars.SESSION] = SessionSpec(launch_policy=LaunchPolicy(
            profiles=profiles, default_profile=default, images=settings.images,
            data_mounts=settings.data_mounts, environment=prefix)).to_env()
    return env


def _run_as(settings, user: str, rows: list[Row], timeout: int, log, out) -> tuple[list[dict], str | None]:
    """One runner process as ``user`` for its notebooks: prints and returns a result per notebook,
    and what went wrong if the runner stopped early."""
    # -I: the runner's imports come from the session environment only, never from its folder, a
    # PYTHONPATH or the user's site-packages (with plain -m, a module planted in the folder, /tmp
    # for one, would be imported first and run as this user); and it runs in a folder nobody writes.
    command = [f"{settings.session.environment}/bin/python", "-I", "-m", "portal.admin.templatecheck",
               str(timeout), *[str(row.notebook) for row in rows]]
    if user != pwd.getpwuid(os.geteuid()).pw_name:
        command = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", *command]
    print(f"#### {len(rows)} notebook(s) as {user}", file=log, flush=True)
    # The kernels' own chatter (TensorFlow start-up, ...) and full tracebacks go to the log.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                            env=_user_env(settings, user), cwd="/")
    results, pending = [], iter(rows)
    # The runner runs as the user, who may make it print anything: one line at most RESULT_CHARS.
    for line in iter(lambda: proc.stdout.readline(RESULT_CHARS), ""):
        try:
            result = _result(line)
        except (ValueError, TypeError):
            continue
        row = next(pending, None)
        if row is None:  # more results than notebooks: not from the runner's own code
            break
        result["name"] = row.name
        results.append(result)
        verdict = "PASS" if result["passed"] else "FAIL"
        print(f"  {verdict}  {result['name']:<44} {result['seconds']:7.1f} s"
              + (f"   {result['error']}" if result["error"] else ""), file=out, flush=True)
    proc.wait()
    if len(results) < len(rows):
        return results, f"the runner as {user} stopped early (exit status {proc.returncode})"
    return results, None


def check(settings, user: str | None = None, sources: list[str] | None = None, timeout: int = 600,
          out=sys.stdout) -> int:
    chosen = [s for s in settings.templates.sources if not sources or s.name in sources]
    unknown = sorted(set(sources or []) - {s.name for s in chosen})
    if unknown:
        print(f"dsportal templates check: unknown source(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    present = [s for s in chosen if Path(s.path).is_dir()]
    problems = [f"{s.name}: {s.path} is not a folder" for s in chosen if s not in present]
    try:
        runs_as = users_for(settings, present, user)
    except NoCheckUser as error:
        print(f"dsportal templates check: {error}", file=sys.stderr)
        return 2
    rows = [Row(s.name, Path(s.path), nb, runs_as[s.name][0]) for s in present for nb in notebooks(Path(s.path))]
    if not rows and not problems:
        print("dsportal templates check: no template notebooks found", file=out)
        return 1
    print(f"dsportal templates check: {len(rows)} notebook(s)", file=out)
    for source in present:
        print(f"  {source.name:<16} as {runs_as[source.name][0]} ({runs_as[source.name][1]})", file=out, flush=True)
    log = tempfile.NamedTemporaryFile("w", prefix="dsportal-template-check-", suffix=".log", delete=False)
    results = []
    for runner in dict.fromkeys(row.user for row in rows):  # one runner per user, in the sources' order
        done, stopped = _run_as(settings, runner, [row for row in rows if row.user == runner], timeout, log, out)
        results += done
        problems += [stopped] if stopped else []
    log.close()
    return _report(results, len(rows), problems, log.name, out)


def _report(results: list[dict], expected: int, problems: list[str], log: str, out) -> int:
    """The other problems, where the log is (kept only on failure), the summary line; the exit status."""
    for problem in problems:
        print(f"  FAIL  {problem}", file=out)
    passed = sum(r["passed"] for r in results)
    total_time = sum(r["seconds"] for r in results)
    ok = passed == expected and not problems
    if ok:
        os.unlink(log)
    else:
        print(f"  kernels' messages and tracebacks: {log}", file=out)
    print(f"templates check: {passed}/{expected} passed in {total_time:.1f} s"
          + (f"; {expected - passed} failed" if passed < expected else "")
          + (f"; {len(problems)} other problem(s)" if problems else ""), file=out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_runner_main(sys.argv[1:]))
