"""One run of a notebook job, inside its Slurm job (templates/notebook_job.sbatch.j2).

``python -m portal.session.notebookjob <job folder> <run>`` executes the copy of the notebook taken when
the job was submitted (``input.ipynb``) with nbclient and a real Jupyter kernel: the environment's
Python 3 kernel, or the chosen image's (the same kernelspec a session writes for it). The run's
parameters (``notebook-job.json``: one point per run of a grid, a Slurm array task each) are injected
after the cell tagged ``parameters``, as papermill does.

What it leaves in the job's folder, for the Jobs panel (portal/session/job/launcher.py):
- the executed notebook (``output.ipynb``, ``output-<run>.ipynb`` for a grid), saved after every cell,
  so it can be opened while the job runs;
- its log (Slurm's ``batch.log`` / ``task-<run>.log``): which cell runs, then what that cell printed;
- ``run-<run>.json``: how it ended (the failing cell and its error) and what the cell tagged
  ``results`` printed as JSON (the grid's results table).

The kernel runs in the notebook's folder, as when the notebook is opened, or in the job's folder where
the user cannot write to the notebook's (a course's read-only template).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from portal.core.notebookcells import (
    cell_label,
    code_cells,
    failure_reason,
    full_traceback,
    inject_parameters,
    one_line,
    results_of,
)
from portal.core.wholefile import write_whole

SPEC = "notebook-job.json"
INPUT = "input.ipynb"
IMAGE_KERNEL = "dsportal-image"
MAX_RESULTS = 64 * 1024  # characters of a run's results (one row of a table, not a data set)


def output_name(run: int, runs: int) -> str:
    return f"output-{run}.ipynb" if runs > 1 else "output.ipynb"


def record_name(run: int) -> str:
    return f"run-{run}.json"


def _save(nb, path: Path) -> None:
    import nbformat

    write_whole(path, nbformat.writes(nb))  # the Jobs panel may open it meanwhile


def _unsafe_folder(folder: str) -> str | None:
    """Why a kernel must not run in ``folder`` (None: it may): not the user's, or writable by others."""
    try:
        st = os.stat(folder)
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    if not os.access(folder, os.W_OK):
        return "is read-only for you"
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is not yours alone (others may put files there)"
    # Nor may anyone else swap the folder for one of theirs between this check and the kernel's start:
    # each folder above it is hers or root's, and one that others may write to is sticky (as /tmp is).
    above = os.path.dirname(os.path.abspath(folder))
    while True:
        try:
            st = os.stat(above)
        except OSError as error:
            return f"lies in {above}, which cannot be read ({error.strerror})"
        if st.st_uid not in (0, os.getuid()):
            return f"lies in {above}, which another user owns (they could swap the folder)"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"lies in {above}, where others may rename folders (not sticky)"
        if above == os.path.dirname(above):
            return None
        above = os.path.dirname(above)


def _kernel(spec: dict, runtime: Path) -> str:
    """The kernel's name: the image's kernelspec, written into ``runtime`` (on JUPYTER_PATH), or python3."""
    if not spec.get("image"):
        return "python3"
    from portal.session.kernel.specs import ensure_kernel_pipe_config, kernel_spec

    image = SimpleNamespace(**spec["image"])
    mounts = [SimpleNamespace(**mount) for mount in spec.get("mounts", [])]
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES") if spec.get("gpus") else None
    ensure_kernel_pipe_config(str(runtime))
    folder = runtime / "kernels" / IMAGE_KERNEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps(kernel_spec(image, mounts, spec["home"], str(runtime), cuda)))
    os.environ["JUPYTER_PATH"] = str(runtime)
    return IMAGE_KERNEL


def _echo_outputs(cell) -> None:
    """What a cell printed, into the run's log after the cell ran (the log follower streams it)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            text = output.get("text", "")
            (sys.stdout if output.get("name") == "stdout" else sys.stderr).write(text if text.endswith("\n") else text + "\n")
        elif output.get("output_type") == "execute_result":
            print(output.get("data", {}).get("text/plain", ""))
    sys.stdout.flush()
    sys.stderr.flush()


def run(job_dir: Path, number: int) -> int:
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    spec = json.loads((job_dir / SPEC).read_text())
    points = spec["points"]
    parameters = {**spec.get("parameters", {}), **points[number]}
    output = job_dir / output_name(number, len(points))
    record = {"run": number, "parameters": parameters, "state": "RUNNING", "error": "", "results": None,
              "output": output.name, "started": time.time()}
    (job_dir / record_name(number)).write_text(json.dumps(record))
    nb = nbformat.read(str(job_dir / INPUT), as_version=4)
    inject_parameters(nb, parameters)
    if parameters:
        print(f"dsportal: parameters {json.dumps(parameters)}", flush=True)
    cells = code_cells(nb.cells)
    # The kernel's channels are unix sockets in a folder of this run's own (mkdtemp-like: 0700), not TCP ports.
    runtime = job_dir / f"runtime-{number}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    running: dict[str, str] = {}

    def starting(cell, cell_index, **_):
        label = cell_label(nb.cells, cell_index)
        running["cell"] = label
        print(f"dsportal: running {label}, of {cells} code cells", flush=True)

    def executed(cell, cell_index, **_):
        _echo_outputs(cell)
        _save(nb, output)

    # Where the kernel runs: the notebook's folder, as when it is opened, where it is the user's own. A
    # folder she cannot write to (a course's read-only template) gives way to the job's own folder, where
    # what the notebook saves lands; so does one others can write to (/tmp, a shared scratch folder): the
    # kernel imports from its folder first, and a stranger's numpy.py there would run as her.
    cwd = spec.get("cwd") or str(job_dir)
    why = _unsafe_folder(cwd)
    if why:
        print(f"dsportal: {cwd} {why}: the notebook runs in the job's folder {job_dir}", flush=True)
        cwd = str(job_dir)
    kernel_name = _kernel(spec, runtime)
    kernel = KernelManager(kernel_name=kernel_name, transport="ipc", connection_file=str(runtime / "kernel.json"))
    client = NotebookClient(nb, km=kernel, kernel_name=kernel_name, timeout=None,
                            resources={"metadata": {"path": cwd}},
                            on_cell_execute=starting, on_cell_executed=executed)
    try:
        client.execute()
    except Exception as error:  # noqa: BLE001 - every failure is the run's result, told in words
        record.update(state="FAILED", error=failure_reason(error, running.get("cell"), None)[:1000])
        print(f"dsportal: {record['error']}", flush=True)
        print(full_traceback(error), file=sys.stderr, flush=True)
    else:
        found = results_of(nb)
        try:
            size = len(json.dumps(found, allow_nan=False)) if found is not None else 0
        except (ValueError, TypeError) as error:  # NaN or infinity (a diverged run), a set, bytes: not JSON
            print(f"dsportal: the cell tagged results gave what JSON cannot hold ({error}): not kept in the results "
                  "table (the executed notebook has it)", flush=True)
            found, size = None, 0
        if size > MAX_RESULTS:
            print(f"dsportal: the cell tagged results printed more than {MAX_RESULTS:,} characters of JSON: not "
                  "kept in the results table (the executed notebook has it)", flush=True)
            found = None
        record.update(state="COMPLETED", results=found)
        print(f"dsportal: all {cells} code cells ran", flush=True)
    finally:
        _save(nb, output)
        record["ended"] = time.time()
        write_whole(job_dir / record_name(number), json.dumps(record))
    return 0 if record["state"] == "COMPLETED" else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m portal.session.notebookjob <job folder> <run>", file=sys.stderr)
        return 2
    job_dir, number = Path(argv[0]), int(argv[1])
    try:
        return run(job_dir, number)
    except Exception as error:  # noqa: BLE001 - whatever it is, the run's record and log say it, in words
        reason = f"the run could not go on: {type(error).__name__}: {one_line(str(error))}"[:1000]
        print(f"dsportal: {reason}", flush=True)
        try:
            record = json.loads((job_dir / record_name(number)).read_text())
        except (OSError, ValueError):
            record = {"run": number}
        if record.get("state") != "FAILED":
            record.update(state="FAILED", error=reason, ended=time.time())
            (job_dir / record_name(number)).write_text(json.dumps(record))
        return 1


if __name__ == "__main__":
    sys.exit(main())
