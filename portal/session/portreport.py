"""The session's one port report to the hub, sent once its Jupyter server listens.

The hub's start() returns when the report arrives, and JupyterHub then checks the server over
HTTP with a growing back-off (0.2 s, 0.4 s, ...): time lost while a server already up waits for
its next try. Reported from the running server, the first check finds it answering.

The hub, not the session, decides when a start has failed. A hub that answers slowly (a class
starting, an overload) is waited for; one that does not answer at all (a restart, connections
refused) is asked again, with a growing pause. Only once the hub's own limit for this start
(hub.start_timeout, which the hub passes in the session's spec: portal.core.sessionspec) has passed with no answer has
the hub given up on it: then the job ends, saying so, rather than serve a session nobody routes to.

The report names the Slurm job it comes from: the hub accepts one report, from the job it is
starting, and refuses later ones (409). A refused report ends the session with the hub's reason
instead of serving on a port nobody routes to.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from portal.core import sessionspec, sessionvars
from portal.session import hubapi


def refusal(response) -> str:
    reason = hubapi.message_of(response)
    if not reason and response.code == 403:
        # The hub revoked this session's token: its start was given up (e.g. sbatch timed out
        # while slurmctld hung, and Slurm took the job in later). Nobody waits for this job.
        reason = "the hub no longer knows this session (its start was given up); this job ends"
    return reason


PORT_RETRIES = 50  # jupyter_server's own default
# No answer, none from the hub itself, or the hub asking to be asked again later.
UNANSWERED = frozenset({599, 502, 503, 504, 429})


def allow_port_retries(server_app) -> None:
    """The port singleuser.py chose is free when chosen, but the server binds it only after its
    imports and extensions, seconds later where a class starts on one node, and meanwhile another
    session's server or an outgoing connection may take it. jupyterhub-singleuser forbids other
    ports (port_retries 0) because its hub must know the port in advance; this session reports the
    port it bound once it listens, so it takes another free one instead of failing. Called while
    the extensions load, before the server looks for its port."""
    if not server_app.sock and server_app.port_retries < PORT_RETRIES:
        server_app.port_retries = PORT_RETRIES


def _report_wait() -> float:
    return sessionspec.current().report_wait


async def report(server_app) -> None:
    if not os.environ.pop(sessionvars.REPORT_PORT, ""):
        return
    port = server_app.port  # the one it bound (the chosen one, unless taken meanwhile)
    body = {"port": port, "job_id": os.environ.get("SLURM_JOB_ID", "")}
    waits_for = _report_wait()
    deadline, pause = time.monotonic() + waits_for, 0.5
    while True:
        # A slow answer is waited for, to the end: sent again, the report would only queue twice.
        response = await hubapi.post("batchspawner", body, timeout=max(1.0, deadline - time.monotonic()))
        if response.code not in UNANSWERED or time.monotonic() + pause >= deadline:
            break
        server_app.log.warning("dsportal: the hub did not take this session's port (%s: %s); trying again in %.1f s",
                               response.code, hubapi.message_of(response), pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 8.0)
    if response.code in UNANSWERED:
        sys.stderr.write(f"dsportal: the hub did not answer this session's report for {waits_for:.0f} s, "
                         f"the longest it waits for a session to start ({hubapi.message_of(response)}); "
                         "this job ends\n")
        sys.stderr.flush()
        os._exit(1)
    if response.code == 201:
        server_app.log.info("dsportal: port %s reported to the hub", port)
        return
    reason = refusal(response)
    sys.stderr.write(f"dsportal: the hub refused this session's port ({response.code}): {reason}\n")
    sys.stderr.flush()
    os._exit(1)  # nothing of the session has started yet: no kernel, no terminal
