"""Launch multi-node jobs from a notebook: a Python API and the ``%%horovod`` cell magic.

    %%horovod --nodes 2 --gpus-per-node 4 --image horovod
    import horovod.torch as hvd
    hvd.init()
    print(hvd.rank(), hvd.size())

    %%torchrun --nodes 2 --gpus-per-node 4
    import torch.distributed as dist
    dist.init_process_group("nccl")

submits the cell as a job and shows every rank's output live below it, each line prefixed by
its rank; the job handle is the cell's result (``_``). From Python::

    from portal.session.job.magics import launch
    job = launch(script="train.py", nodes=2, gpus_per_node=2, image="horovod")
    job.follow()      # print the log so far and then live, until the job ends
    job.status()      # 'RUNNING', 'COMPLETED', ...
    job.cancel()

Loaded in every session's Python kernel (``ipython_kernel_config.py`` of the environment).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from portal.upstream.onuse import after_import, module_on_use

# Every Python kernel of a session loads this module; the job machinery (the rules, the settings'
# models, the Slurm client: slow to import, and most kernels never launch a job) loads when a cell
# first launches a job.
jobs = module_on_use("portal.session.job.launcher")
_rules = module_on_use("portal.core.rules")
_slurm = module_on_use("portal.slurm.slurmclient")


class Job:
    """A handle to a launched job: state, live log, wait, cancel."""

    def __init__(self, job_id: int):
        self.id = int(job_id)
        self._follower: jobs.LogFollower | None = None

    def info(self) -> jobs.JobInfo:
        return jobs.load(self.id)

    def status(self) -> str:
        return self.info().state

    def cancel(self) -> str:
        jobs.cancel(self.id)
        return f"job {self.id}: cancel requested"

    def wait(self, poll: float = 1.0) -> jobs.JobInfo:
        while True:
            info = self.info()
            if info.finished:
                return info
            time.sleep(poll)

    def follow(self, poll: float = 0.25, out=None, err=None) -> jobs.JobInfo:
        """Print each rank's lines as they are written until the job ends; interrupting only stops
        the printing (the job goes on: ``cancel()`` stops it)."""
        out, err = out or sys.stdout, err or sys.stderr
        if self._follower is None:
            self._follower = jobs.LogFollower(folder=Path(self.info().folder))
        checked, info = 0.0, self.info()
        try:
            while True:
                if time.monotonic() - checked >= 1.0:
                    checked, info = time.monotonic(), self.info()
                for event in self._follower.poll(final=info.finished):
                    print(jobs.format_event(event), file=err if event["stream"] == "stderr" else out, flush=True)
                if self._follower.behind:
                    continue  # more written than one slice: the rest at once
                if info.finished:
                    print(f"job {self.id}: {info.state} (exit code {info.exit_code or '-'})", file=out, flush=True)
                    return info
                time.sleep(poll)
        except KeyboardInterrupt:
            print(f"job {self.id} keeps running; job.follow() resumes, job.cancel() stops it", file=out)
            return self.info()

    def __repr__(self) -> str:
        try:
            info = self.info()
            return f"<dsportal job {self.id} {info.state}: {info.description}>"
        except Exception:  # noqa: BLE001 - a repr must not raise
            return f"<dsportal job {self.id}>"


def launch(**request) -> Job:
    """Submit a job (same fields as the REST API: script or code, nodes, gpus_per_node, image, ...)."""
    from portal.core import sessionspec

    policy = jobs.with_cluster_limits(sessionspec.launch_policy())
    request = {key: value for key, value in request.items() if value is not None}  # Python's "not given"
    plan = jobs.plan(request, policy, os.getcwd())
    info = jobs.submit(plan, policy)
    print(f"Submitted job {info.job_id}: {info.description}\nLogs: {info.folder}", flush=True)
    return Job(info.job_id)


def _parse(line: str) -> tuple[dict, bool]:
    import argparse

    parser = argparse.ArgumentParser(prog="%%horovod", add_help=False, exit_on_error=False)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--tasks-per-node", type=int)
    parser.add_argument("--image")
    parser.add_argument("--walltime")
    parser.add_argument("--profile")
    parser.add_argument("--name")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--no-wait", action="store_true")
    parser.add_argument("--launcher", choices=["mpi", "torchrun"])
    try:
        args, rest = parser.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as error:
        raise _rules.RequestError(f"%%horovod: {error}") from None
    if rest:
        raise _rules.RequestError(f"%%horovod: unknown option(s) {' '.join(rest)}")
    env = {}
    for item in args.env:
        if "=" not in item:
            raise _rules.RequestError(f"%%horovod: --env takes NAME=VALUE, not {item!r}")
        key, value = item.split("=", 1)
        env[key] = value
    request = {k: v for k, v in {
        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "tasks_per_node": args.tasks_per_node,
        "image": args.image, "walltime": args.walltime, "profile": args.profile, "name": args.name,
        "env": env or None, "launcher": args.launcher}.items() if v is not None}
    return request, not args.no_wait


def horovod(line: str, cell: str, launcher: str | None = None):
    """%%horovod [--nodes N] [--gpus-per-node G] [--image NAME] [--walltime HH:MM:SS] [--profile P]
    [--env NAME=VALUE ...] [--launcher mpi|torchrun] [--no-wait]: run this cell as a multi-node
    job (MPI ranks: Horovod), its output live below."""
    from IPython.core.error import UsageError

    # A refused request or a failed job fails the cell (no traceback): "Run All" stops there, and
    # `dsportal templates check` sees it.
    try:
        request, wait = _parse(line)
        if launcher:
            request["launcher"] = launcher
        job = launch(code=cell, **request)
    except _slurm.SlurmUnavailable as error:
        raise UsageError(f"The cluster scheduler is not answering right now, please retry: {error}") from None
    except (_rules.RequestError, _slurm.SlurmError) as error:
        raise UsageError(f"Job refused: {error}") from None
    if wait:
        info = job.follow()
        if info.finished and info.state != "COMPLETED":
            raise UsageError(f"job {job.id} ended {info.state} (exit code {info.exit_code or '-'}): "
                             "each rank's output is above and in " + str(info.folder))
    return job


def torchrun(line: str, cell: str):
    """%%torchrun [--nodes N] [--gpus-per-node G] [--tasks-per-node P] [--image NAME] [...]: run this
    cell with torch.distributed, one torchrun per node starting P processes (default: one per GPU);
    RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR are set, so ``init_process_group()`` needs no
    arguments. Each rank's output live below, as for %%horovod."""
    return horovod(line, cell, launcher="torchrun")


def session_tensorboard(args_string: str = ""):
    """``%tensorboard --logdir DIR`` in a session: the session's own TensorBoard for DIR (a unix
    socket only its user reaches, see portal/session/tool/tensorboards.py), shown below the cell.

    TensorBoard's stock magic starts it on a TCP port of the node, where every other user's
    session could open it; in a session, ``%load_ext tensorboard`` leads here instead.
    """
    import argparse
    import json
    import ssl
    import urllib.error
    import urllib.request
    from urllib.parse import urlparse

    from IPython.core.error import UsageError
    from IPython.display import HTML, IFrame, display

    parser = argparse.ArgumentParser(prog="%tensorboard", add_help=False, exit_on_error=False)
    parser.add_argument("--logdir")
    try:
        args, _ = parser.parse_known_args(shlex.split(args_string))
    except (argparse.ArgumentError, ValueError) as error:
        raise UsageError(f"%tensorboard: {error}") from None
    if not args.logdir:
        raise UsageError("%tensorboard --logdir FOLDER: the folder of your event files, e.g. runs")
    logdir = os.path.abspath(os.path.expanduser(args.logdir))
    server = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    context = None
    if server.scheme == "https":  # internal TLS: the user's own client certificate (spawner/certs.py)
        folder = Path(os.environ["JUPYTERHUB_SSL_CERTFILE"]).parent
        context = ssl.create_default_context(cafile=folder / "sessions-ca.crt")
        context.load_cert_chain(folder / "local-client.crt", folder / "local-client.key")
    request = urllib.request.Request(
        f"{server.scheme}://127.0.0.1:{server.port}{server.path.rstrip('/')}/dsportal/api/tensorboards",
        data=json.dumps({"logdir": logdir}).encode(), method="POST",
        headers={"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=90, context=context) as response:
            board = json.load(response)["tensorboard"]
    except urllib.error.HTTPError as error:
        try:
            reason = json.load(error).get("message", error.reason)
        except ValueError:
            reason = error.reason
        raise UsageError(f"%tensorboard: {reason}") from None
    display(HTML(f'<a href="{board["url"]}" target="_blank">TensorBoard for {board["logdir"]}</a> '
                 "(your session's own; open it in a tab of its own here)"))
    display(IFrame(board["url"], width="100%", height=800))


def _start_session_tensorboard(notebook) -> None:
    """tensorboard.notebook.start, which %tensorboard calls, opens the session's own board: where the
    installed TensorBoard is the one this was checked against (PATCHES: tensorboard-magic). Else it stands
    aside, saying so: %tensorboard is then TensorBoard's own (a server on a port of this node)."""
    from portal.upstream.session import (
        PATCHES,  # here: only a kernel that loads TensorBoard's magic reads the checklist
    )

    if next(p for p in PATCHES if p.name == "tensorboard-magic").changed():
        print("dsportal: %tensorboard is TensorBoard's own here: the installed TensorBoard is a release this portal "
              "has not been checked against yet (open a board from the file browser: right-click a folder)",
              file=sys.stderr)
        return
    notebook.start = session_tensorboard


def load_ipython_extension(ipython):
    ipython.register_magic_function(horovod, magic_kind="cell", magic_name="horovod")
    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
    ipython.push({"launch_job": launch}, interactive=True)
    if os.environ.get("JUPYTERHUB_SERVICE_URL") and os.environ.get("JUPYTERHUB_API_TOKEN"):
        # %load_ext tensorboard registers a magic that calls tensorboard.notebook.start at run time;
        # TensorBoard's module is not loaded for a kernel that never asks for it.
        after_import("tensorboard.notebook", _start_session_tensorboard)
