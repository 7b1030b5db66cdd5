"""The walltime's end, or a preemption: every open document saved, the kernels shut down cleanly, the user told.

Slurm signals the session's batch script shortly before the time limit (``--signal=B:USR1@N``,
templates/session.sbatch.j2), which passes the signal to this server. It sends the same signal as it
preempts the job for higher-priority work (a partition with a PreemptMode and a GraceTime, and
SlurmctldParameters=preempt_send_user_signal): squeue then shows the job's PreemptTime, and the time left
is the grace time. The server then
1. emits :data:`SCHEMA_ID` on Jupyter's event bus: each open JupyterLab saves every document with
   unsaved changes and says which (POST dsportal/api/walltime/saved);
2. writes which files were saved to the session's log (the user's own file): the hub quotes that
   line on the page that tells her the walltime ended (sessionvars.WALLTIME_SAVED);
3. shuts the kernels down cleanly once a JupyterLab answered, or after GRACE seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from tornado import web

from portal.core import sessionspec, sessionvars
from portal.session.api import MessageAPIHandler

SCHEMA_ID = "https://dsportal.invalid/events/walltime-ending/v1"
SCHEMA = {
    "$id": SCHEMA_ID,
    "version": "1",
    "title": "The session's walltime is ending",
    "personal-data": False,
    "description": "Slurm will stop this session soon: open documents should be saved now.",
    "type": "object",
    "required": ["seconds_left"],
    "properties": {
        "seconds_left": {"type": "integer", "description": "About how long the session has left."},
        "reason": {"enum": ["walltime", "preempted", "preempted-requeue"],
                   "description": "Why: the walltime's end, or Slurm preempting the job (which runs again later: "
                   "preempted-requeue)."},
    },
}
GRACE = 45  # seconds the open JupyterLabs get to save before the kernels are shut down
MOST_FILES, LONGEST_PATH = 50, 300  # what one report may name


class _Ending:
    started = False
    saved: asyncio.Event | None = None


def _say(line: str) -> None:
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def setup(server_app) -> list:
    """Registers the event; the routes. The signal is taken once the loop runs (listen())."""
    server_app.event_logger.register_event_schema(SCHEMA)
    server_app.web_app.settings["dsportal_walltime"] = _Ending()
    return [("dsportal/api/walltime/saved", SavedHandler)]


def listen(server_app) -> None:
    ending = server_app.web_app.settings["dsportal_walltime"]
    ending.saved = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, lambda: asyncio.ensure_future(_walltime_ending(server_app, ending)))


async def _walltime_ending(server_app, ending: _Ending) -> None:
    if ending.started:
        return
    ending.started = True
    left, reason = sessionspec.current().save_ahead, "walltime"
    preempted = await preemption()
    if preempted is not None:
        left, reason = preempted
        _say(f"{sessionvars.PREEMPTED} for higher-priority work in about {left} s"
             f"{' (it runs again later)' if reason == 'preempted-requeue' else ''}: JupyterLab saves every open "
             "document, then the kernels are shut down")
    else:
        _say(f"dsportal: the walltime ends in about {left} s: JupyterLab saves every open document, then the kernels "
             "are shut down")
    server_app.event_logger.emit(schema_id=SCHEMA_ID, data={"seconds_left": left, "reason": reason})
    try:
        await asyncio.wait_for(ending.saved.wait(), GRACE)
    except TimeoutError:
        _say(f"dsportal: no JupyterLab was open to save documents within {GRACE} s")
    await server_app.kernel_manager.shutdown_all()
    _say("dsportal: kernels shut down before the walltime's end" if reason == "walltime" else
         "dsportal: kernels shut down before the preemption")


async def preemption() -> tuple[int, str] | None:
    """(seconds left, reason) where Slurm is preempting this job (squeue shows its PreemptTime); None where it is
    not, or where squeue does not answer within 3 s (then the walltime's words: the save is the same). squeue from
    the job's PATH, as the session's job launcher runs Slurm's commands."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    try:
        asked = await asyncio.create_subprocess_exec(
            "squeue", "-h", "-j", job, "-O", "PreemptTime:30|,EndTime:30|,Requeue:10|",
            env={**os.environ, "SLURM_TIME_FORMAT": "%s"}, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(asked.communicate(), 3)
    except TimeoutError:
        asked.kill()
        return None
    fields = [field.strip() for field in out.decode(errors="replace").split("|")]
    if len(fields) < 3 or not fields[0].isdigit():  # N/A: not preempted
        return None
    left = max(0, int(fields[1]) - int(time.time())) if fields[1].isdigit() else 0
    return left, "preempted-requeue" if fields[2] in ("1", "yes", "YES") else "preempted"


class SavedHandler(MessageAPIHandler):
    """POST {"saved": [paths]}: what a JupyterLab saved when the walltime ending was announced."""

    @web.authenticated
    async def post(self):
        body = self.get_json_body()
        saved = body.get("saved") if isinstance(body, dict) else None
        if (not isinstance(saved, list) or len(saved) > MOST_FILES
                or not all(isinstance(p, str) and 0 < len(p) <= LONGEST_PATH and p.isprintable() for p in saved)):
            raise web.HTTPError(400, f"expected {{'saved': [up to {MOST_FILES} file paths]}}")
        _say(f"{sessionvars.WALLTIME_SAVED} {', '.join(saved) if saved else '(nothing was unsaved)'}")
        ending = self.settings["dsportal_walltime"]
        if ending.saved is not None:
            ending.saved.set()
        self.finish({"message": "noted"})
