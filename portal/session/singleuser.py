"""The session job's entry point: pick a free port, report it (and the job id) to the hub once,
then run jupyterhub-singleuser on it.

batchspawner-singleuser, with two differences: the report names the Slurm job it comes from
(the hub accepts one report, from the job it is starting, and refuses later ones with 409),
and a refused report ends the job with the hub's reason instead of serving on an unknown port.
"""

from __future__ import annotations

import os
import sys
from runpy import run_path
from shutil import which
from urllib.parse import urlparse, urlunparse

import requests
from jupyterhub.services.auth import HubAuth
from jupyterhub.utils import random_port, url_path_join


def report_port(port: int) -> None:
    hub_auth = HubAuth()
    kwargs = {}
    if hub_auth.certfile and hub_auth.keyfile:
        kwargs["cert"] = (hub_auth.certfile, hub_auth.keyfile)
    if hub_auth.client_ca:
        kwargs["verify"] = hub_auth.client_ca
    response = requests.post(
        url_path_join(hub_auth.api_url, "batchspawner"),
        headers={"Authorization": f"token {hub_auth.api_token}"},
        json={"port": port, "job_id": os.environ.get("SLURM_JOB_ID", "")},
        timeout=60,
        **kwargs,
    )
    if response.status_code != 201:
        try:
            reason = response.json().get("message") or ""
        except ValueError:
            reason = response.text.strip()
        if not reason and response.status_code == 403:
            # The hub revoked this session's token: its start was given up (e.g. sbatch timed out
            # while slurmctld hung, and Slurm took the job in later). Nobody waits for this job.
            reason = "the hub no longer knows this session (its start was given up); this job ends"
        sys.exit(f"dsportal: the hub refused this session's port ({response.status_code}): {reason}")


def main() -> None:
    port = random_port()
    report_port(port)
    service_url = os.environ.get("JUPYTERHUB_SERVICE_URL", "")
    if service_url:
        url = urlparse(service_url)
        os.environ["JUPYTERHUB_SERVICE_URL"] = urlunparse(url._replace(netloc=f"{url.hostname}:{port}"))
    else:
        sys.argv.append(f"--port={port}")
    command = which(sys.argv[1]) or sys.argv[1]
    sys.argv = sys.argv[1:]
    run_path(command, run_name="__main__")


if __name__ == "__main__":
    main()
