"""``dsportal templates check``: run every template notebook headless and report each.

Each notebook runs top to bottom with nbclient in the session environment's ``python3``
kernel, as a chosen user (``--user``: the launcher magics then submit that user's jobs), in a
scratch copy of its folder, with ``DSPORTAL_TEMPLATE_CHECK=1`` so notebooks pick their short
settings (fewer epochs). Whatever a notebook started (TensorBoard, ...) is stopped after it.
The last line is the summary; the exit status is 0 only when every notebook passed.
"""

from __future__ import annotations

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

from spawner.form import may_use, unix_groups

from ..launchpolicy import POLICY_ENV, LaunchPolicy
from ..templatesources import notebooks

CHECK_ENV = "DSPORTAL_TEMPLATE_CHECK"
RUN_MARK = "DSPORTAL_TEMPLATE_RUN"


def run_one(notebook: Path, timeout: int) -> dict:
    """Execute one notebook in a scratch copy of its folder; never raises."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    started = time.monotonic()
    mark = uuid.uuid4().hex
    os.environ[RUN_MARK] = mark
    result = {"notebook": str(notebook), "passed": False, "seconds": 0.0, "error": ""}
    scratch = Path(tempfile.mkdtemp(prefix="dsportal-template-check-"))
    try:
        shutil.copytree(notebook.parent, scratch, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        nb = nbformat.read(scratch / notebook.name, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(scratch)}})
        client.execute()
        result["passed"] = True
    except (CellExecutionError, CellTimeoutError) as error:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()  # no terminal colours
        result["error"] = next((line for line in reversed(text) if line.strip()), type(error).__name__)[:300]
    except DeadKernelError as error:
        result["error"] = f"the kernel died: {error}"[:300]
    except Exception as error:  # a broken notebook file is a failed check, not a crash of the check
        result["error"] = f"{type(error).__name__}: {error}"[:300]
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
    """``python -m portal.cluster.templatecheck TIMEOUT NOTEBOOK...``: one JSON line per notebook."""
    timeout, paths = int(argv[0]), argv[1:]
    for path in paths:
        print(json.dumps(run_one(Path(path), timeout)), flush=True)
    return 0


def _user_env(settings, user: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JUPYTER", "DSPORTAL_LAUNCH"))}
    prefix = str(settings.session.environment)
    env.update(settings.slurm_env())
    env[CHECK_ENV] = "1"
    env["PATH"] = f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin"
    if user:
        entry = pwd.getpwnam(user)
        env.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
        profiles = [p for p in settings.profiles if may_use(p, unix_groups(user))]
        if profiles:  # what the hub would give this user's session: the job launcher works in templates
            default = settings.profile().name if settings.profile() in profiles else profiles[0].name
            env[POLICY_ENV] = LaunchPolicy(
                profiles=profiles, default_profile=default, images=settings.images,
                data_mounts=settings.data_mounts, environment=prefix).to_env()
    return env


def check(settings, user: str | None = None, sources: list[str] | None = None, timeout: int = 600,
          out=sys.stdout) -> int:
    chosen = [s for s in settings.templates.sources if not sources or s.name in sources]
    unknown = sorted(set(sources or []) - {s.name for s in chosen})
    if unknown:
        print(f"dsportal templates check: unknown source(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    rows, problems = [], []
    for source in chosen:
        folder = Path(source.path)
        if not folder.is_dir():
            problems.append(f"{source.name}: {folder} is not a folder")
            continue
        rows += [(source.name, folder, nb) for nb in notebooks(folder)]
    if not rows and not problems:
        print("dsportal templates check: no template notebooks found", file=out)
        return 1
    command = [f"{settings.session.environment}/bin/python", "-m", "portal.cluster.templatecheck", str(timeout),
               *[str(nb) for _, _, nb in rows]]
    if user and user != pwd.getpwuid(os.geteuid()).pw_name:
        command = [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", *command]
    print(f"dsportal templates check: {len(rows)} notebook(s)" + (f" as {user}" if user else ""), file=out, flush=True)
    results = []
    log = tempfile.NamedTemporaryFile("w", prefix="dsportal-template-check-", suffix=".log", delete=False)
    if rows:
        # The kernels' own chatter (TensorFlow start-up, ...) goes to a log shown only on failure.
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                env=_user_env(settings, user), cwd="/tmp")
        names = iter(rows)
        for line in proc.stdout:
            try:
                result = json.loads(line)
            except ValueError:
                continue
            source, folder, nb = next(names)
            result["name"] = f"{source}/{nb.relative_to(folder).as_posix()}"
            results.append(result)
            verdict = "PASS" if result["passed"] else "FAIL"
            print(f"  {verdict}  {result['name']:<44} {result['seconds']:7.1f} s"
                  + (f"   {result['error']}" if result["error"] else ""), file=out, flush=True)
        proc.wait()
        if len(results) < len(rows):
            problems.append(f"the runner stopped early (exit status {proc.returncode})")
    log.close()
    for problem in problems:
        print(f"  FAIL  {problem}", file=out)
    passed = sum(r["passed"] for r in results)
    total_time = sum(r["seconds"] for r in results)
    ok = passed == len(rows) and not problems
    if ok:
        os.unlink(log.name)
    else:
        print(f"  kernels' messages: {log.name}", file=out)
    print(f"templates check: {passed}/{len(rows)} passed in {total_time:.1f} s"
          + (f"; {len(rows) - passed} failed" if passed < len(rows) else "")
          + (f"; {len(problems)} other problem(s)" if problems else ""), file=out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_runner_main(sys.argv[1:]))
