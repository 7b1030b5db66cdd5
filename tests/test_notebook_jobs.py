"""Issue 50: a notebook run as a batch job from a session, once with its parameters or once per point of a
grid (a Slurm array), its executed notebook and results table in the Jobs panel's API.

The request's checks and the batch script need no cluster; the runner executes a real notebook on a
real kernel; the rest is alice's real session submitting real Slurm jobs, and bob refused all of it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time

import nbformat
import pytest

from test_jobs import _policy, jobs_api, stream
from test_session_mail import MAIL_WAIT, mail_since, mailbox_size

TRAIN = [  # (source, tags)
    ("lr = 0.1\nseed = 0\nlabel = 'default'", ["parameters"]),
    ("import json\nscore = round(1 / (1 + lr) + seed / 100, 4)\nprint('score', score, label)", []),
    ("print(json.dumps({'score': score, 'label': label}))", ["results"]),
]
FAILING = [("x = 1", ["parameters"]), ("y = x + 1", []), ("z = y / 0", []), ("print('never')", [])]


def notebook(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


# -- the request and the batch script (no cluster) ------------------------------------------------------
@pytest.mark.quick
@pytest.mark.parametrize("request_fields,expected", [
    ({"parameters": {"lr; import os": 1}}, "is not a Python name"),
    ({"parameters": {"class": 1}}, "is not a Python name"),
    ({"parameters": {"__import__('os').system('id')": 1}}, "is not a Python name"),
    ({"parameters": {"ｌｒ": 1}}, "is not a Python name"),  # NFKC makes it lr in Python
    ({"parameters": {"__debug__": 1}}, "is not a Python name"),
    ({"parameters": {"state": 1}}, "taken by the results table"),
    ({"parameters": {"lr": {"nested": 1}}}, "must be null, true/false, a number, text or a list"),
    ({"parameters": {"lr": "x" * 1001}}, "at most 1,000"),
    ({"parameters": {"lr": list(range(101))}}, "at most 100"),
    ({"parameters": {f"p{n}": ["x" * 999] * 100 for n in range(2)}}, "at most 65,536 are allowed"),
    ({"parameters": {"lr": float("nan")}}, "finite number"),
    ({"parameters": "lr=1"}, "must be an object"),
    ({"grid": {"lr": []}}, "one value or more"),
    ({"grid": {"lr": list(range(9)), "seed": list(range(9))}}, "the grid makes 81 runs; GPU allows at most 64"),
    ({"grid": {"lr": [1, 2]}, "parameters": {"lr": 3}}, "given both in parameters and in grid"),
    ({"grid": {"lr": [1, 2]}, "max_running": 0}, "max_running must be at least 1"),
    ({"nodes": 2}, "a notebook runs as one job on one node"),
    ({"launcher": "torchrun"}, "a notebook runs as one job on one node"),
    ({"notebook": "train.py"}, "notebook must be the name of a .ipynb file"),
    ({"notebook": "missing.ipynb"}, "no such notebook"),
    ({"notebook": "train.ipynb", "code": "print(1)"}, "give one of 'script'"),
    ({"mail": "yes"}, "mail must be true or false (an e-mail when the job ends)"),
])
def test_a_notebook_job_request_is_judged_before_anything_is_submitted(tmp_path, request_fields, expected):
    from portal.core.rules import RequestError
    from portal.session.job import launcher as jobs

    nbformat.write(notebook(TRAIN), str(tmp_path / "train.ipynb"))
    with pytest.raises(RequestError) as refused:
        jobs.plan({"notebook": "train.ipynb", **request_fields}, _policy(), tmp_path)
    assert expected in str(refused.value), str(refused.value)


@pytest.mark.quick
def test_parameters_belong_to_notebooks_only(tmp_path):
    from portal.core.rules import RequestError
    from portal.session.job import launcher as jobs

    with pytest.raises(RequestError, match="grid is for a notebook run as a job"):
        jobs.plan({"code": "print(1)", "grid": {"lr": [1, 2]}}, _policy(), tmp_path)


@pytest.mark.quick
def test_a_grid_is_one_slurm_array_with_at_most_k_running(tmp_path):
    from portal.session.job import launcher as jobs

    nbformat.write(notebook(TRAIN), str(tmp_path / "train.ipynb"))
    policy = _policy()
    plan = jobs.plan({"notebook": "train.ipynb", "grid": {"lr": [0.1, 0.2, 0.3], "seed": [1, 2]}, "max_running": 2,
                      "parameters": {"label": "sweep"}, "gpus_per_node": 1}, policy, tmp_path)
    assert plan.points == tuple({"lr": lr, "seed": seed} for lr in (0.1, 0.2, 0.3) for seed in (1, 2))
    assert plan.parameters == {"label": "sweep"}  # shared by every run, kept once
    script = jobs.render_notebook_script(plan, policy, "/home/u/.dsportal/jobs/x", "/home/u")
    for line in ("#SBATCH --array=0-5%2", "#SBATCH --output=/home/u/.dsportal/jobs/x/task-%a.log", "#SBATCH --nodes=1",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=8", "#SBATCH --gres=gpu:1",
                 "#SBATCH --job-name=nb-train", 'task=${SLURM_ARRAY_TASK_ID:-0}',
                 'exec /opt/dsportal/env/bin/python -P -m portal.session.notebookjob "$job_dir" "$task"'):
        assert line in script, (line, script)
    assert "6 runs (a Slurm array, at most 2 at once)" in plan.describe()
    assert "--mail-type" not in script
    single = jobs.plan({"notebook": "train.ipynb", "parameters": {"lr": 0.5}, "mail": True}, policy, tmp_path)
    script = jobs.render_notebook_script(single, policy, "/j", "/home/u")
    assert "--array" not in script and "#SBATCH --output=/j/batch.log" in script
    assert single.points == ({},) and single.parameters == {"lr": 0.5}
    assert "#SBATCH --mail-type=END,FAIL" in script  # Slurm's mail to <user>@MailDomain, as a session's start


@pytest.mark.quick
@pytest.mark.parametrize("value", ["it's \"quoted\"", "line\nbreak\\n", "'); import os; os.system('id'); ('", None, True,
                                   -3, 1e-300, ["a", 1, None, False]])
def test_an_injected_value_is_the_same_value_in_python_never_code(value):
    from portal.core.notebookcells import inject_parameters

    nb = notebook(TRAIN)
    inject_parameters(nb, {"value": value})
    injected = nb.cells[1]
    assert injected.metadata["tags"] == ["injected-parameters"] and nb.cells[0].metadata["tags"] == ["parameters"]
    tree = ast.parse(injected.source)
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Assign)  # one assignment, nothing else
    assert ast.literal_eval(tree.body[0].value) == value


def run_locally(tmp_path, cells, points) -> tuple[int, dict, nbformat.NotebookNode, str]:
    """The runner as its Slurm job starts it, here on this machine: exit status, its record, the executed
    notebook, its log."""
    from portal.session.notebookjob import INPUT, SPEC

    nbformat.write(notebook(cells), str(tmp_path / INPUT))
    (tmp_path / SPEC).write_text(json.dumps({"parameters": {"label": "shared"}, "points": points, "cwd": str(tmp_path),
                                             "image": None}))
    done = subprocess.run([sys.executable, "-m", "portal.session.notebookjob", str(tmp_path), str(len(points) - 1)],
                          capture_output=True, text=True, timeout=120)
    output = "output.ipynb" if len(points) == 1 else f"output-{len(points) - 1}.ipynb"
    record = json.loads((tmp_path / f"run-{len(points) - 1}.json").read_text())
    return done.returncode, record, nbformat.read(str(tmp_path / output), as_version=4), done.stdout + done.stderr


@pytest.mark.quick
def test_the_runner_executes_with_its_parameters_and_records_the_results(tmp_path):
    status, record, executed, log = run_locally(tmp_path, TRAIN, [{"lr": 0.1}, {"lr": 1.0, "seed": 2, "label": "b"}])
    assert status == 0, log
    assert record["state"] == "COMPLETED" and record["results"] == {"score": 0.52, "label": "b"}, record
    assert "dsportal: running cell 2 (import json), of 3 code cells" in log and "score 0.52 b" in log, log
    assert executed.cells[1].metadata["tags"] == ["injected-parameters"]
    assert executed.cells[2].outputs[0]["text"] == "score 0.52 b\n"


@pytest.mark.quick
def test_a_notebook_in_a_folder_others_can_write_runs_in_its_job_folder_not_importing_what_they_left(tmp_path):
    """alice runs /tmp/x.ipynb (or one in a shared scratch folder): bob's planted module there must
    not be what her kernel imports, as it would be from the kernel's working folder."""
    from portal.session.notebookjob import INPUT, SPEC

    shared, job = tmp_path / "shared", tmp_path / "job"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # like /tmp
    job.mkdir(mode=0o700)
    (shared / "planted.py").write_text("raise SystemExit('bob was here')\n")
    nbformat.write(notebook([("import os, importlib.util\nprint('cwd', os.getcwd())\n"
                              "print('planted', importlib.util.find_spec('planted'))", [])]), str(job / INPUT))
    (job / SPEC).write_text(json.dumps({"parameters": {}, "points": [{}], "cwd": str(shared), "image": None}))
    done = subprocess.run([sys.executable, "-m", "portal.session.notebookjob", str(job), "0"],
                          capture_output=True, text=True, timeout=120)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert f"dsportal: {shared} is not yours alone (others may put files there): the notebook runs in the job's " \
           f"folder {job}" in log, log
    assert f"cwd {job}" in log and "planted None" in log, log


@pytest.mark.quick
def test_a_folder_of_hers_inside_one_others_may_rename_in_is_not_where_a_kernel_runs(tmp_path):
    """Her own folder in a group project folder that is not sticky: bob could swap it for one of his
    (a rename) between the runner's check and the kernel's start; each run, a scheduled one unattended."""
    from portal.session.notebookjob import _unsafe_folder

    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o777)
    (project / "mine").mkdir(mode=0o700)
    assert "where others may rename folders (not sticky)" in _unsafe_folder(str(project / "mine"))
    project.chmod(0o1777)  # sticky, as /tmp: only its owner renames her folder
    assert _unsafe_folder(str(project / "mine")) is None


@pytest.mark.quick
def test_a_failing_cell_is_named_with_its_error(tmp_path):
    status, record, executed, log = run_locally(tmp_path, FAILING, [{}])
    assert status == 1
    assert record["state"] == "FAILED" and record["error"].startswith("cell 3 (z = y / 0): ZeroDivisionError"), record
    assert "dsportal: cell 3 (z = y / 0): ZeroDivisionError: division by zero" in log, log
    by_source = {cell.source: cell for cell in executed.cells}
    assert by_source["z = y / 0"].outputs[0]["ename"] == "ZeroDivisionError"  # the executed notebook shows where it stopped
    assert not by_source["print('never')"].get("outputs")


# -- alice's session, real Slurm ----------------------------------------------------------------------
def put_notebook(user, path: str, cells) -> None:
    folder = os.path.dirname(path)
    if folder:
        user.api("PUT", f"/user/{user.name}/api/contents/{folder}", json={"type": "directory"})
    response = user.api("PUT", f"/user/{user.name}/api/contents/{path}",
                        json={"type": "notebook", "format": "json", "content": notebook(cells)})
    assert response.status_code in (200, 201), response.text


def wait_finished(user, job_id: int, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = jobs_api(user, "GET", f"/{job_id}").json()["job"]
        if job["finished"]:
            return job
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s: {job}")


@pytest.fixture
def alice_cpu(alice):
    alice.spawn({"profile": "cpu"})
    return alice


def test_a_notebook_runs_as_a_job_its_grid_as_an_array_and_bob_sees_none_of_it(alice_cpu, bob):
    alice = alice_cpu
    put_notebook(alice, "nbjobs/train.ipynb", TRAIN)
    put_notebook(alice, "nbjobs/failing.ipynb", FAILING)

    # A text file named .ipynb is refused in words before anything reaches Slurm (it would fail in its job).
    alice.api("PUT", "/user/alice/api/contents/nbjobs/garbage.ipynb",
              json={"type": "file", "format": "text", "content": "these are my notes, not a notebook\n"})
    before = jobs_api(alice, "GET").json()["jobs"]
    response = jobs_api(alice, "POST", json={"notebook": "nbjobs/garbage.ipynb", "profile": "cpu"})
    assert response.status_code == 400, response.text
    assert response.json()["message"] == ("Your job request was refused: /home/alice/nbjobs/garbage.ipynb is not a "
                                          "Jupyter notebook: its content is not JSON (a file renamed to .ipynb?). "
                                          "Nothing was submitted."), response.text
    assert jobs_api(alice, "GET").json()["jobs"] == before
    # A path out of her home is said as it resolves, and as outside her home.
    response = jobs_api(alice, "POST", json={"notebook": "../../../etc/x.ipynb", "profile": "cpu"})
    assert response.status_code == 400, response.text
    assert response.json()["message"] == ("Your job request was refused: no such notebook: /etc/x.ipynb (outside your "
                                          "home /home/alice)"), response.text

    # One run, its parameters overridden; its log says which cell runs while the job runs.
    response = jobs_api(alice, "POST", json={"notebook": "nbjobs/train.ipynb", "profile": "cpu",
                                             "parameters": {"lr": 0.25, "label": "one"}})
    assert response.status_code == 201, response.text
    job = response.json()["job"]
    assert job["kind"] == "notebook" and job["runs"] == 1 and job["notebook"].endswith("/nbjobs/train.ipynb")
    lines = [m["line"] for m in stream(alice, job["job_id"]) if m["type"] == "line"]
    assert "dsportal: running cell 2 (import json), of 3 code cells" in lines and "score 0.8 one" in lines, lines
    job = wait_finished(alice, job["job_id"])
    assert job["state"] == "COMPLETED", job
    # The executed notebook, read-only, as the Jobs panel opens it in JupyterLab; the jobs' folder stays hidden
    # to the contents API (allow_hidden is off).
    opened = jobs_api(alice, "GET", f"/{job['job_id']}/files/output.ipynb")
    assert opened.status_code == 200 and opened.json()["writable"] is False, opened.text
    outputs = [o for cell in opened.json()["content"]["cells"] for o in cell.get("outputs", [])]
    assert {"output_type": "stream", "name": "stdout", "text": "score 0.8 one\n"} in outputs, outputs
    assert jobs_api(alice, "GET", f"/{job['job_id']}/files/input.ipynb").json()["content"]["cells"][0]["source"] \
        .startswith("lr = 0.1")  # the copy it ran, as submitted
    downloaded = jobs_api(alice, "GET", f"/{job['job_id']}/files/output.ipynb", params={"download": "1"})
    assert downloaded.headers["Content-Type"] == "application/x-ipynb+json", downloaded.headers
    assert json.loads(downloaded.text)["cells"] == opened.json()["content"]["cells"]
    for name in ("job.sbatch", "..%2Fjob.json", "output-x.ipynb"):
        assert jobs_api(alice, "GET", f"/{job['job_id']}/files/{name}").status_code == 404, name
    hidden = alice.api("GET", f"/user/alice/api/contents/.dsportal/jobs/{job['job_id']}/output.ipynb")
    assert hidden.status_code == 404, hidden.status_code

    # The same notebook with its kernel in a container image (Apptainer), the image's own Python.
    response = jobs_api(alice, "POST", json={"notebook": "nbjobs/train.ipynb", "profile": "cpu", "image": "debian-python",
                                             "parameters": {"lr": 1.0, "label": "in the image"}})
    assert response.status_code == 201, response.text
    contained = wait_finished(alice, response.json()["job"]["job_id"])
    assert contained["state"] == "COMPLETED" and contained["image"] == "debian-python", contained
    executed = jobs_api(alice, "GET", f"/{contained['job_id']}/files/output.ipynb").json()["content"]
    assert "score 0.5 in the image" in json.dumps(executed), executed

    # A 3 x 2 grid: one Slurm array, at most 2 running; its results table has six rows.
    response = jobs_api(alice, "POST", json={"notebook": "nbjobs/train.ipynb", "profile": "cpu", "max_running": 2,
                                             "grid": {"lr": [0.0, 0.25, 1.0], "seed": [1, 2]}})
    assert response.status_code == 201, response.text
    array = response.json()["job"]
    assert array["runs"] == 6 and "6 runs (a Slurm array, at most 2 at once)" in array["description"]
    array = wait_finished(alice, array["job_id"])
    assert array["state"] == "COMPLETED" and array["run_states"] == {str(n): "COMPLETED" for n in range(6)}, array
    table = jobs_api(alice, "GET", f"/{array['job_id']}/results").json()
    assert table["columns"] == ["run", "lr", "seed", "state", "score", "label", "output"], table
    assert [(r["lr"], r["seed"], r["score"]) for r in table["rows"]] == [
        (0.0, 1, 1.01), (0.0, 2, 1.02), (0.25, 1, 0.81), (0.25, 2, 0.82), (1.0, 1, 0.51), (1.0, 2, 0.52)], table
    assert {r["output"] for r in table["rows"]} == {f"output-{n}.ipynb" for n in range(6)}
    csv_answer = jobs_api(alice, "GET", f"/{array['job_id']}/results", params={"format": "csv"})
    assert csv_answer.headers["Content-Type"] == "text/csv; charset=utf-8", csv_answer.headers
    csv_text = csv_answer.text
    assert csv_text.splitlines()[0] == "run,lr,seed,state,score,label,output" and len(csv_text.splitlines()) == 7
    listed = {j["job_id"]: j for j in jobs_api(alice, "GET").json()["jobs"]}
    assert listed[array["job_id"]]["state"] == "COMPLETED"  # the list shows the array as one job

    # A failing cell is named, in the job's state and in its log; Slurm mails her that it failed.
    mailbox = mailbox_size()
    response = jobs_api(alice, "POST", json={"notebook": "nbjobs/failing.ipynb", "profile": "cpu", "mail": True})
    failed = wait_finished(alice, response.json()["job"]["job_id"])
    assert failed["state"] == "FAILED", failed
    assert failed["reason"].startswith("cell 3 (z = y / 0): ZeroDivisionError: division by zero"), failed
    deadline = time.monotonic() + MAIL_WAIT
    while not re.search(rf"Job_id={failed['job_id']}\s+Name=nb-failing\s+Failed", mail_since(mailbox)) \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert re.search(rf"Job_id={failed['job_id']}\s+Name=nb-failing\s+Failed", mail_since(mailbox)), mail_since(mailbox)

    # bob: refused every part of it, through the API and on disk.
    for path in ("", f"/{array['job_id']}", f"/{array['job_id']}/results", f"/{array['job_id']}/files/output-0.ipynb"):
        assert jobs_api(bob, "GET", path, owner="alice", allow_redirects=False).status_code in (302, 403)
    folder = listed[array["job_id"]]["folder"]
    peek = subprocess.run(["runuser", "-u", "bob", "--", "cat", f"{folder}/output-0.ipynb", f"{folder}/run-0.json",
                           f"{folder}/input.ipynb"], capture_output=True, text=True)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek


@pytest.mark.quick
def test_the_notebook_a_job_runs_is_judged_and_read_through_one_open_file(tmp_path):
    """A notebook in a folder someone else can write may be swapped between a check and a copy: a FIFO
    would hang the server's thread, /dev/zero fill her quota. One open file is judged and read."""
    from portal.core.rules import RequestError
    from portal.session.job.launcher import MAX_NOTEBOOK_BYTES, _read_notebook

    fine = tmp_path / "fine.ipynb"
    nbformat.write(notebook([("x = 1", [])]), str(fine))
    assert _read_notebook(str(fine)) == fine.read_bytes()
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)
    with pytest.raises(RequestError, match="is not a regular file"):
        _read_notebook(str(fifo))  # at once: nothing writes to it
    with pytest.raises(RequestError, match="is not a regular file"):
        _read_notebook("/dev/zero")
    big = tmp_path / "big.ipynb"
    big.write_bytes(b" " * (MAX_NOTEBOOK_BYTES + 1))
    with pytest.raises(RequestError, match="is over 50 MB: clear its outputs first"):
        _read_notebook(str(big))


@pytest.mark.quick
@pytest.mark.parametrize("content,expected", [
    (b"these are my notes\n", "its content is not JSON (a file renamed to .ipynb?)"),
    (b"\xff\xfe\x00garbage", "it is not text (a notebook is JSON in UTF-8)"),
    (b'["a", "list"]', "its JSON is not a notebook's"),
    (b'{"cells": []}', "its JSON is not a notebook's"),
    (b"", "its content is not JSON"),
])
def test_a_file_named_ipynb_that_is_no_notebook_is_refused_in_words_before_submitting(tmp_path, content, expected):
    from portal.core.rules import RequestError
    from portal.session.job.launcher import _read_notebook

    fake = tmp_path / "garbage.ipynb"
    fake.write_bytes(content)
    with pytest.raises(RequestError) as refused:
        _read_notebook(str(fake))
    assert str(refused.value).startswith(f"{fake} is not a Jupyter notebook: {expected}"), str(refused.value)
    assert str(refused.value).endswith("Nothing was submitted."), str(refused.value)


@pytest.mark.quick
def test_a_large_notebook_is_judged_as_json_only_and_a_large_non_notebook_still_refused(tmp_path):
    from portal.core.rules import RequestError
    from portal.session.job.launcher import FULLY_READ_BYTES, _read_notebook

    big = notebook([("x = 1", [])])
    big.metadata["padding"] = "x" * (FULLY_READ_BYTES + 1)
    path = tmp_path / "big.ipynb"
    nbformat.write(big, str(path))
    assert _read_notebook(str(path)) == path.read_bytes()
    path.write_text(json.dumps({"nbformat": 4, "padding": "x" * (FULLY_READ_BYTES + 1)}))
    with pytest.raises(RequestError, match="its JSON is not a notebook's \\(no list of cells\\)"):
        _read_notebook(str(path))


@pytest.mark.quick
def test_a_notebooks_path_is_said_as_it_resolves_and_outside_her_home_plainly(tmp_path, monkeypatch):
    from portal.core.rules import RequestError
    from portal.session.job import launcher as jobs

    home = tmp_path / "home" / "alice"
    (home / "work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(RequestError) as refused:
        jobs.plan({"notebook": "../../../etc/x.ipynb"}, _policy(), home / "work")
    assert str(refused.value) == f"no such notebook: {tmp_path}/etc/x.ipynb (outside your home {home})"
    with pytest.raises(RequestError) as refused:
        jobs.plan({"notebook": "./work/../missing.ipynb"}, _policy(), home)
    assert str(refused.value) == f"no such notebook: {home}/missing.ipynb"  # in her home: no more words
    packaged = tmp_path / "examples" / "train.ipynb"  # one she may read outside her home runs
    packaged.parent.mkdir()
    nbformat.write(notebook(TRAIN), str(packaged))
    assert jobs.plan({"notebook": str(packaged)}, _policy(), home).notebook == str(packaged)


@pytest.mark.quick
def test_a_large_grid_s_logs_are_followed_a_slice_at_a_time_and_every_line_arrives(tmp_path):
    """Opening the log of a grid of many runs must not read every run's log into memory at once."""
    from pathlib import Path

    from portal.session.job.launcher import LogFollower

    line = "x" * 99 + "\n"
    for task in range(3):
        Path(tmp_path / f"task-{task}.log").write_text(line * 30_000 + f"last of {task}")  # ~3 MB, no newline
    follower, seen, reads = LogFollower(folder=tmp_path), [], 0
    while True:
        events = follower.poll(final=True, budget=2**20)
        reads += 1
        assert sum(len(e["line"]) + 1 for e in events) <= 2**20 + 200  # one slice (and a carried part line)
        seen += events
        if not follower.behind:
            break
    assert reads >= 9
    for task in range(3):
        mine = [e["line"] for e in seen if e["rank"] == task]
        assert len(mine) == 30_001 and mine[-1] == f"last of {task}" and set(mine[:-1]) == {"x" * 99}


@pytest.mark.quick
def test_the_results_csv_holds_no_formula_a_spreadsheet_would_run():
    """A result can quote text another user wrote (a file name from a shared data set)."""
    import csv
    import io

    from portal.session.job.launcher import results_csv

    table = {"columns": ["run", "=cmd|' /C calc'!A0", "worst", "loss", "tags"],
             "rows": [{"run": 0, "=cmd|' /C calc'!A0": 1, "worst": "=HYPERLINK(\"http://x\")", "loss": -0.5,
                       "tags": ["@a"]},
                      {"run": 1, "worst": "+1", "loss": "-2", "tags": []}]}
    rows = list(csv.reader(io.StringIO(results_csv(table))))
    assert rows[0] == ["run", "'=cmd|' /C calc'!A0", "worst", "loss", "tags"]
    assert rows[1] == ["0", "1", "'=HYPERLINK(\"http://x\")", "-0.5", '["@a"]']
    assert rows[2] == ["1", "", "'+1", "'-2", "[]"]


@pytest.mark.quick
def test_results_json_cannot_hold_are_left_out_and_the_run_still_completes(tmp_path):
    cells = [("import json", []), ("print(json.dumps({'loss': float('nan')}))", ["results"])]
    status, record, executed, log = run_locally(tmp_path, cells, [{}])
    assert status == 0 and record["state"] == "COMPLETED" and record["results"] is None, (record, log)
    assert "dsportal: the cell tagged results gave what JSON cannot hold" in log, log


@pytest.mark.quick
@pytest.mark.parametrize("text,tasks", [("3", [3]), ("2-5%2", [2, 3, 4, 5]), ("[4-9%2]", [4, 5, 6, 7, 8, 9]),
                                        ("[1,4-5]", [1, 4, 5]), ("1-7:2", [1, 3, 5, 7]), ("x", []), ("", [])])
def test_slurm_s_array_task_ids_are_read_in_every_form(text, tasks):
    from portal.slurm.slurmparse import array_task_ids

    assert array_task_ids(text) == tasks
