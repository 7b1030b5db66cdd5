"""Issue 6: instructor template notebooks in every session.

Real parts: the sources are the installed repo notebooks and carol's course folder (owned by
her Unix account); sessions are real Slurm jobs whose Jupyter server publishes ~/templates;
notebooks run through the session's own kernels; carol edits her template from her own session.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import CONFIG, DSPORTAL, REPO

SHIPPED = ["digits-keras.ipynb", "digits-pytorch.ipynb", "getting-started.ipynb", "multinode-horovod.ipynb",
           "tensorboard-logging.ipynb"]
COURSE = Path(yaml.safe_load(CONFIG.read_text())["templates"]["sources"][1]["path"])
WELCOME = "templates/intro-dl/week1-welcome.ipynb"


def home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def forget_templates(user: str) -> None:
    """As if the user never had a session with templates: no folder, no copies, no ledger."""
    view = home(user) / "templates"
    if view.is_dir() and not view.is_symlink():
        os.chmod(view, 0o755)
        shutil.rmtree(view)
    shutil.rmtree(home(user) / "notebooks", ignore_errors=True)
    (home(user) / ".dsportal" / "template-copies.json").unlink(missing_ok=True)


def contents(user, path: str, **params):
    return user.api("GET", f"/user/{user.name}/api/contents/{path}", params=params)


def save(user, path: str, notebook: dict):
    return user.api("PUT", f"/user/{user.name}/api/contents/{path}",
                    json={"type": "notebook", "format": "json", "content": notebook})


def open_template(user, path: str, fresh: bool = False):
    return user.api("POST", f"/user/{user.name}/dsportal/api/templates/open", json={"path": path, "fresh": fresh})


def text_of(notebook: dict) -> str:
    return "\n".join("".join(cell["source"]) for cell in notebook["cells"])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def course_v1(portal):
    """carol's course folder holds the seed version of her template, owned by her."""
    seed = REPO / "config/demo/courses/intro-dl/week1-welcome.ipynb"
    target = COURSE / seed.name
    shutil.copyfile(seed, target)
    entry = pwd.getpwnam("carol")
    os.chown(target, entry.pw_uid, entry.pw_gid)
    os.chmod(target, 0o644)
    return target


def test_fresh_session_shows_every_template_source_read_only(alice):
    forget_templates("alice")
    alice.spawn({"profile": "cpu"})

    listing = contents(alice, "templates")
    assert listing.status_code == 200, listing.text
    names = sorted(item["name"] for item in listing.json()["content"])
    assert names == ["README.md", "dsportal", "intro-dl"], names
    assert listing.json()["writable"] is False
    shipped = sorted(i["name"] for i in contents(alice, "templates/dsportal").json()["content"])
    assert [n for n in shipped if n.endswith(".ipynb")] == SHIPPED, shipped
    course = [i["name"] for i in contents(alice, "templates/intro-dl").json()["content"]]
    assert course == ["week1-welcome.ipynb"], course

    template = contents(alice, "templates/dsportal/digits-pytorch.ipynb")
    assert template.status_code == 200 and template.json()["writable"] is False
    installed = Path("/opt/dsportal/env/share/dsportal/notebooks/digits-pytorch.ipynb")
    before = digest(installed)
    tampered = template.json()["content"]
    tampered["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "alice was here"})
    assert save(alice, "templates/dsportal/digits-pytorch.ipynb", tampered).status_code >= 400
    assert save(alice, "templates/mine.ipynb", tampered).status_code >= 400
    assert digest(installed) == before
    assert not (home("alice") / "templates" / "mine.ipynb").exists()

    api = alice.api("GET", "/user/alice/dsportal/api/templates").json()
    assert [s["name"] for s in api["sources"]] == ["dsportal", "intro-dl"]
    assert all(s["available"] for s in api["sources"])
    # What a path outside the templates gets: a clear refusal, no copy.
    for bad, status in (("templates/dsportal/../../.bashrc", 400), ("notebooks/x.ipynb", 400),
                        ("templates/nosuch/x.ipynb", 400), ("templates/dsportal/missing.ipynb", 404)):
        response = open_template(alice, bad)
        assert response.status_code == status and response.json()["message"], (bad, response.text)


def test_digits_notebook_reaches_095_in_the_session_kernel(alice):
    forget_templates("alice")
    alice.spawn({"profile": "gpu", "gpus": 1})
    opened = open_template(alice, "templates/dsportal/digits-pytorch.ipynb")
    assert opened.status_code == 201, opened.text
    copy = opened.json()["path"]
    assert copy == "notebooks/dsportal/digits-pytorch.ipynb" and opened.json()["created"] is True
    assert contents(alice, copy).json()["writable"] is True

    outputs = alice.run_notebook(copy, timeout=600)
    print("".join(outputs))
    found = re.search(r"test accuracy: ([0-9.]+)", "".join(outputs))
    assert found, outputs
    assert float(found.group(1)) >= 0.95
    assert "training on" in outputs[1]  # the cell after the one tagged parameters (which prints nothing)
    # The kernel ran in the copy's folder, inside alice's Slurm job.
    assert (home("alice") / "notebooks/dsportal/digits-cnn.pt").stat().st_uid == pwd.getpwnam("alice").pw_uid


def test_instructor_update_reaches_bob_and_leaves_his_copy_alone(bob, carol, admin, course_v1):
    forget_templates("bob")
    # bob's first session: opening the template gives him his copy, which he edits.
    bob.spawn({"profile": "cpu"})
    opened = open_template(bob, WELCOME)
    assert opened.status_code == 201, opened.text
    copy = opened.json()["path"]
    assert copy == "notebooks/intro-dl/week1-welcome.ipynb"
    mine = contents(bob, copy).json()["content"]
    mine["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "bob's notes: gradient is 3x^2"})
    assert save(bob, copy, mine).status_code == 200
    bobs_copy = home("bob") / copy
    edited = digest(bobs_copy)
    # bob may not change the template itself.
    template = contents(bob, WELCOME).json()
    assert template["writable"] is False
    assert save(bob, WELCOME, mine).status_code >= 400
    admin.stop_server("bob")

    # carol, the course's owner, edits the template in place from her session.
    carol.spawn({"profile": "cpu"})
    own = open_template(carol, WELCOME)
    assert own.status_code == 200 and own.json()["own_template"] is True and own.json()["path"] == WELCOME
    v1 = contents(carol, WELCOME).json()
    assert v1["writable"] is True
    v2 = v1["content"]
    v2["cells"][0]["source"] = "".join(v2["cells"][0]["source"]).replace("Version 1.", "Version 2.")
    v2["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                        "source": "print('new in version 2')"})
    assert save(carol, WELCOME, v2).status_code == 200
    assert "Version 2." in course_v1.read_text()
    assert course_v1.stat().st_uid == pwd.getpwnam("carol").pw_uid
    admin.stop_server("carol")

    # bob's next session shows the new version; his copy is as he left it.
    bob.spawn({"profile": "cpu"})
    assert "Version 2." in text_of(contents(bob, WELCOME).json()["content"])
    kept = text_of(contents(bob, copy).json()["content"])
    assert "bob's notes" in kept and "Version 1." in kept and "Version 2." not in kept
    assert digest(bobs_copy) == edited
    again = open_template(bob, WELCOME)
    assert again.status_code == 200, again.text
    assert again.json() | {} == {"path": copy, "template": WELCOME, "created": False, "own_template": False,
                                 "template_updated": True}
    assert digest(bobs_copy) == edited
    fresh = open_template(bob, WELCOME, fresh=True)
    assert fresh.status_code == 201 and fresh.json()["path"] == "notebooks/intro-dl/week1-welcome-2.ipynb"
    assert "Version 2." in text_of(contents(bob, fresh.json()["path"]).json()["content"])
    listed = bob.api("GET", "/user/bob/dsportal/api/templates").json()
    entry = next(f for s in listed["sources"] for f in s["files"] if f["path"] == WELCOME)
    assert entry == {"path": WELCOME, "copy": copy, "template_updated": True}


def test_templates_check_runs_every_template_as_a_user(portal):
    result = subprocess.run([DSPORTAL, "--config", str(CONFIG), "templates", "check", "--user", "alice"],
                            capture_output=True, text=True, timeout=1200)
    print(result.stdout, result.stderr)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    for name in [f"dsportal/{n}" for n in SHIPPED] + ["intro-dl/week1-welcome.ipynb"]:
        assert any(line.split()[:2] == ["PASS", name] for line in lines), name
    assert lines[-1].startswith("templates check: 6/6 passed in ")


def test_templates_check_without_arguments_runs_each_source_as_a_user_who_may_open_it(portal):
    """Root's own kernel has no job launch policy: each source runs as its owner or a portal user."""
    result = subprocess.run([DSPORTAL, "--config", str(CONFIG), "templates", "check"],
                            capture_output=True, text=True, timeout=1200)
    print(result.stdout, result.stderr)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert "  dsportal         as alice (a member of datascience)" in lines
    assert "  intro-dl         as carol (its owner)" in lines
    assert any(line.split()[:2] == ["PASS", "dsportal/multinode-horovod.ipynb"] for line in lines)
    assert lines[-1].startswith("templates check: 6/6 passed in ") and "failed" not in lines[-1]


def notebook_of(*sources: str) -> dict:
    """A notebook with a heading and one code cell per source."""
    code = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}
            for source in sources]
    return {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# A template"}, *code],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def check_sources(tmp_path, sources: list[dict]) -> subprocess.CompletedProcess:
    """`dsportal templates check` with the demo's portal.yaml, its template sources replaced."""
    config = yaml.safe_load(CONFIG.read_text())
    config["templates"]["sources"] = sources
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([DSPORTAL, "--config", str(path), "templates", "check"],
                            capture_output=True, text=True, timeout=300)
    print(result.stdout, result.stderr)
    return result


def take_log(lines: list[str]) -> str:
    """The text of the log a failed check names (kept only on failure), removed."""
    log = Path(next(line for line in lines if "kernels' messages and tracebacks: " in line).split(": ", 1)[1])
    text = log.read_text()
    log.unlink()
    return text


@pytest.fixture
def shared_folder():
    """A folder every account may read, as template sources are: the check runs them as a portal user."""
    folder = Path(tempfile.mkdtemp(prefix="dsportal-test-templates-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_templates_check_reports_a_failing_notebook(portal, shared_folder, tmp_path):
    folder = shared_folder / "broken-course"
    folder.mkdir()
    (folder / "ok.ipynb").write_text(json.dumps(notebook_of("print('fine')")))
    (folder / "broken.ipynb").write_text(json.dumps(notebook_of("1 / 0")))
    result = check_sources(tmp_path, [{"name": "broken-course", "path": str(folder)},
                                      {"name": "gone", "path": str(tmp_path / "gone")}])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert "  broken-course    as alice (a member of datascience)" in lines
    assert any(line.split()[:2] == ["PASS", "broken-course/ok.ipynb"] for line in lines)
    failed = next(line for line in lines if line.split()[:2] == ["FAIL", "broken-course/broken.ipynb"])
    assert "cell 1 (1 / 0): ZeroDivisionError: division by zero" in failed
    assert any("FAIL  gone:" in line and "is not a folder" in line for line in lines)
    assert lines[-1].startswith("templates check: 1/2 passed in ")
    assert "ZeroDivisionError" in take_log(lines)


def test_templates_check_names_the_failing_cell_and_logs_its_traceback(tmp_path):
    """Runs as the source's owner, the account running the tests: no demo cluster needed."""
    folder = tmp_path / "course"
    folder.mkdir()
    (folder / "week2.ipynb").write_text(json.dumps(notebook_of("x = 41", "x += 1\nraise ValueError(f'boom {x}')")))
    me = pwd.getpwuid(os.getuid()).pw_name
    result = check_sources(tmp_path, [{"name": "course", "path": str(folder), "owner": me}])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f"  course           as {me} (its owner)" in lines
    failed = next(line for line in lines if line.split()[:2] == ["FAIL", "course/week2.ipynb"])
    assert failed.endswith("cell 2 (x += 1): ValueError: boom 42"), failed
    text = take_log(lines)
    assert f"==== {folder / 'week2.ipynb'} (as {me}) ====" in text
    assert "Traceback (most recent call last)" in text and "raise ValueError(f'boom {x}')" in text


@pytest.mark.quick
def test_check_user_is_the_owner_else_the_first_member_who_may_open_the_source(monkeypatch):
    """Whom `dsportal templates check` (root, no --user) runs a source as; directory lookups faked."""
    from portal.admin import templatecheck
    from portal.core.settings import Settings

    directory = {"datascience": ["carol", "bob", "alice"], "intro-dl": ["carol", "bob"],
                 "instructors": ["carol"], "latecomers": ["aaron", "carol"]}  # aaron may not log in
    monkeypatch.setattr(templatecheck, "group_members", lambda group: sorted(directory.get(group, [])))
    monkeypatch.setattr(templatecheck, "unix_groups",
                        lambda user: {group for group, members in directory.items() if user in members})
    config = yaml.safe_load(CONFIG.read_text())

    def chosen(source: dict, edit=None):
        edited = json.loads(json.dumps(config))
        if edit:
            edit(edited)
        settings = Settings.model_validate(edited)
        return templatecheck.check_user(settings, settings.templates.sources[0].model_copy(update=source))

    me = pwd.getpwuid(os.getuid()).pw_name
    assert chosen({"owner": me}) == (me, "its owner")
    assert chosen({}) == ("alice", "a member of datascience")  # who may log in (ldap.allowed_groups)
    assert chosen({"groups": ["intro-dl"]}) == ("bob", "a member of intro-dl")  # who sees the source
    assert chosen({"groups": ["latecomers"]}) == ("carol", "a member of latecomers")
    # A default profile for some groups only: its members (instructors comes first in portal.yaml).
    assert chosen({}, lambda config: config["session"].update(default_profile="staff")) == (
        "carol", "a member of instructors")
    for source, edit in (({"owner": "no-such-account-dsportal"}, None), ({"groups": ["nobody-here"]}, None),
                         ({}, lambda config: config["ldap"].update(allowed_groups=[]))):
        with pytest.raises(templatecheck.NoCheckUser, match="pass --user NAME"):
            chosen(source, edit)


@pytest.mark.quick
def test_publishing_never_deletes_what_the_user_had(tmp_path):
    """The templates folder is (re)made at every session start: a file of the user's in the way
    is renamed, the user's own entries stay, links of sources no longer offered go."""
    from portal.core.templatesources import Source, Spec
    from portal.session.nbtemplates import publish

    course = tmp_path / "course"
    course.mkdir()
    (course / "a.ipynb").write_text("{}")
    root = tmp_path / "home"
    root.mkdir()
    (root / "templates").write_text("my own file called templates")
    spec = Spec(sources=[Source("course", str(course)), Source("elsewhere", str(tmp_path / "not-mounted"))])
    view = publish(root, spec)
    moved = [p for p in root.iterdir() if p.name.startswith("templates.moved-")]
    assert len(moved) == 1 and moved[0].read_text() == "my own file called templates"
    assert sorted(p.name for p in view.iterdir()) == ["README.md", "course"]  # the unmounted one is left out
    assert (view / "course" / "a.ipynb").exists() and view.stat().st_mode & 0o777 == 0o555

    os.chmod(view, 0o755)
    (view / "notes.txt").write_text("mine")
    os.chmod(view, 0o555)
    publish(root, Spec(sources=[]))
    assert sorted(p.name for p in view.iterdir()) == ["README.md", "notes.txt"]
    assert (view / "notes.txt").read_text() == "mine" and course.joinpath("a.ipynb").exists()
