"""Issue 51: more than notebooks. R, VS Code and git in a session, each inside its job as its user, as
the profile's ``tools`` say (portal/session/tool/offer.py, portal/session/tool/vscode.py); nothing listening on TCP
that a neighbour could reach, and bob refused from the login node, from his job on her node and through
his own server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from conftest import stop_and_wait
from democluster import network
from hubclient import SLURM_ENV, HubUser, active_jobs
from portal.core.settings import Profile
from portal.session.tool import offer as session_tools, vscode
from portal.session.tool.offer import Tools

# -------------------------------------------------------------------------------- quick: no cluster


def _profile(**fields) -> Profile:
    return Profile(name="p", partition="p", display_name="P", **fields)


@pytest.mark.quick
def test_a_profile_offers_all_four_by_default_and_refuses_an_unknown_tool():
    assert _profile().tools == ["terminal", "r", "vscode", "git"]
    assert _profile(tools=["r"]).tools == ["r"]
    with pytest.raises(ValueError, match="tools"):
        _profile(tools=["rstudio"])


@pytest.mark.quick
def test_the_hubs_word_is_read_and_a_server_it_did_not_start_offers_everything():
    from portal.core.sessionspec import SpecError

    var = "DSPORTAL_SESSION"
    assert Tools.from_env({}).offered == frozenset(session_tools.TOOLS)
    given = Tools.from_env({var: json.dumps({"tools": {"offered": ["r"], "code_server": "/x/cs"}})})
    assert given.offered == {"r"} and given.code_server == "/x/cs"
    for spec in ("{not json", json.dumps({"tools": {"offered": ["r", "nonsense"]}})):  # not the hub's: refused
        with pytest.raises(SpecError, match="DSPORTAL_SESSION is not a session spec of dsportal's hub"):
            Tools.from_env({var: spec})
    # A session of dsportal 0.3 (one variable a setting) still reads its own, after an upgrade in place.
    assert Tools.from_env({"DSPORTAL_TOOLS": json.dumps({"offered": ["git"]})}).offered == {"git"}


@pytest.mark.quick
def test_what_a_profile_leaves_out_is_switched_off_by_jupyters_own_settings(tmp_path):
    config = session_tools.write_config(tmp_path, Tools(frozenset({"r"})))
    server = json.loads((config / "jupyter_server_config.json").read_text())["ServerApp"]
    off = {"jupyter_server_ydoc": False, "jupyter_server_fileid": False}  # live co-editing: shareable sessions only
    contents = {"contents_manager_class": "portal.session.contents.ContentsManager"}  # a full home said in words
    assert server == {"terminals_enabled": False, "jpserver_extensions": {"jupyterlab_git": False, "nbdime": False, **off},
                      **contents}
    page = json.loads((config / "labconfig" / "page_config.json").read_text())
    assert page == {"disabledExtensions": {"@jupyterlab/git": True, "nbdime-jupyterlab": True,
                                           "@jupyter/collaboration-extension": True, "@jupyter/docprovider-extension": True}}
    everything = session_tools.write_config(tmp_path, Tools(frozenset(session_tools.TOOLS)))
    assert json.loads((everything / "jupyter_server_config.json").read_text()) == \
        {"ServerApp": {"terminals_enabled": True, "jpserver_extensions": off, **contents}}
    shared = session_tools.write_config(tmp_path, Tools(frozenset(session_tools.TOOLS)), shareable=True)
    assert json.loads((shared / "jupyter_server_config.json").read_text()) == {
        "ServerApp": {"terminals_enabled": True, "jpserver_extensions": dict.fromkeys(off, True), **contents}}
    assert json.loads((shared / "labconfig" / "page_config.json").read_text()) == {"disabledExtensions": {}}
    assert session_tools.sharing_groups({"DSPORTAL_SESSION": '{"sharing_groups": ["ml-lab"]}'}) == ["ml-lab"]
    assert session_tools.sharing_groups({"DSPORTAL_SESSION": "{}"}) == session_tools.sharing_groups({}) == []
    with pytest.raises(ValueError, match="sharing_groups"):  # a name no group has: not the hub's spec
        session_tools.sharing_groups({"DSPORTAL_SESSION": '{"sharing_groups": ["ml-lab", "Bad Name"]}'})


@pytest.mark.quick
def test_the_r_kernel_is_irkernels_with_her_library_and_the_admins_mirror(tmp_path):
    system = tmp_path / "system" / "kernels" / "ir"
    system.mkdir(parents=True)
    (system / "kernel.json").write_text(json.dumps({"argv": ["R", "--slave", "-e", "IRkernel::main()", "--args",
                                                             "{connection_file}"], "display_name": "R", "language": "R"}))
    (system / "logo-64x64.png").write_bytes(b"png")
    assert session_tools.system_r_kernel([str(tmp_path / "nothing"), str(tmp_path / "system")]) == system
    session = tmp_path / "session"
    line = session_tools.write_r_kernel(session, system, Tools(frozenset({"r"}), r_repository="file:///srv/cran"))
    assert line == "ir: R"
    spec = json.loads((session / "kernels" / "ir" / "kernel.json").read_text())
    assert spec["argv"][:4] == ["R", "--slave", "--no-restore", "-e"] and spec["argv"][-2:] == ["--args", "{connection_file}"]
    assert spec["argv"][4].endswith("IRkernel::main()") and "install.packages" in spec["argv"][4]
    home = os.path.expanduser("~")
    assert spec["env"] == {"DSPORTAL_R_REPOSITORY": "file:///srv/cran", "R_ENVIRON_USER": f"{home}/.Renviron",
                           "R_PROFILE_USER": f"{home}/.Rprofile"}
    assert (session / "kernels" / "ir" / "logo-64x64.png").read_bytes() == b"png"
    # Not IRkernel's (someone else's "ir"): left alone.
    (system / "kernel.json").write_text(json.dumps({"argv": ["python", "-m", "other"]}))
    assert session_tools.write_r_kernel(tmp_path / "other", system, Tools(frozenset({"r"}))) is None


@pytest.mark.quick
def test_an_image_with_r_gets_an_r_kernel_inside_it(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from portal.session.kernel.specs import r_kernel_spec

    image = SimpleNamespace(name="rimage", path=str(tmp_path), runtime="apptainer", runtime_binary=None, r=True)
    spec = r_kernel_spec(image, [], "/home/alice", "/tmp/rt", "0", Tools(frozenset({"r"}), r_repository="file:///cran"))
    assert spec["language"] == "R" and spec["display_name"] == "R in a container (rimage)"
    assert spec["argv"][-7:-1] == ["R", "--slave", "--no-restore", "-e", session_tools.R_START, "--args"]
    assert spec["env"]["APPTAINERENV_DSPORTAL_R_REPOSITORY"] == "file:///cran"
    assert spec["env"]["APPTAINERENV_R_PROFILE_USER"] == "/home/alice/.Rprofile"
    assert spec["env"]["APPTAINERENV_PYTHONSAFEPATH"] == "1"
    assert spec["env"]["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.quick
def test_a_demo_image_whose_packages_changed_is_built_again(tmp_path):
    from portal.core import images
    from portal.core.settings import Image

    image = Image(name="x", display_name="X", source="debootstrap:bookworm", path=tmp_path, packages=["b", "a"])
    assert images.outdated(image)  # built before the stamp, or not at all
    (tmp_path / images.PACKAGES_STAMP).write_text("a\nb\n")
    assert not images.outdated(image)
    assert images.outdated(image.model_copy(update={"packages": ["a", "b", "r-cran-irkernel"]}))


@pytest.mark.quick
def test_vs_code_listens_on_a_private_socket_without_its_own_port_proxy(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the session's TMPDIR
    binary = tmp_path / "code-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("DSPORTAL_SESSION", json.dumps({"tools": {"offered": ["vscode"], "code_server": str(binary)}}))
    offered = vscode.server()
    argv = offered["command"]
    assert argv[0] == str(binary) and argv[argv.index("--socket") + 1] == "{unix_socket}"
    assert offered["unix_socket"] is True and "--disable-proxy" in argv and argv[argv.index("--auth") + 1] == "none"
    assert "--disable-workspace-trust" not in argv  # a shared notebook's saved outputs run no script unasked
    config = argv[argv.index("--config") + 1]  # in a new folder of its own, never a name in a shared /tmp
    assert os.stat(os.path.dirname(config)).st_mode & 0o777 == 0o700 and os.path.basename(config) == "code-server.yaml"
    assert "--bind-addr" not in argv and offered["launcher_entry"]["title"] == "VS Code"
    monkeypatch.setenv("DSPORTAL_SESSION", json.dumps({"tools": {"offered": ["r"], "code_server": str(binary)}}))
    assert vscode.server()["launcher_entry"] == {"enabled": False}
    monkeypatch.setenv("DSPORTAL_SESSION", json.dumps({"tools": {"offered": ["vscode"],
                                                                 "code_server": str(tmp_path / "none")}}))
    left_out = vscode.server()
    assert left_out["launcher_entry"] == {"enabled": False} and "not installed" in left_out["command"][-1]


# ----------------------------------------------------------------------------- on the demo cluster

R_PACKAGE = r"""
src <- file.path(tempdir(), "hellodsportal"); dir.create(file.path(src, "R"), recursive = TRUE)
writeLines(c("Package: hellodsportal", "Version: 0.1", "Title: Hello", "Description: Hello.",
             "License: MIT", "Author: A", "Maintainer: A <a@example.org>"), file.path(src, "DESCRIPTION"))
writeLines("export(hello)", file.path(src, "NAMESPACE"))
writeLines("hello <- function() 42", file.path(src, "R", "hello.R"))
suppressMessages(install.packages(src, repos = NULL, type = "source", quiet = TRUE))
library(hellodsportal); cat("HELLO", hello(), "AT", find.package("hellodsportal"), "\n")
"""


def test_r_runs_in_her_job_and_installs_to_her_own_library(alice):
    alice.spawn({"profile": "cpu"})
    job = active_jobs("alice")[0]
    serving = _tcp_listeners_of("alice", job["nodes"])  # her Jupyter server's port, which the hub's proxy reaches
    specs = alice.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]
    for name in ("ir", "python3"):  # the launcher's tiles show their logos
        logo = alice.api("GET", specs[name]["resources"]["logo-64x64"])
        assert logo.status_code == 200 and logo.content[:4] == b"\x89PNG", (name, logo.status_code)
    seen = alice.run_code("cat(sum(1:10), Sys.getenv('SLURM_JOB_ID'), Sys.info()[['user']], Sys.info()[['nodename']])",
                          kernel="ir", timeout=120)
    assert seen.split() == ["55", str(job["job_id"]), "alice", job["nodes"]], seen
    installed = alice.run_code(R_PACKAGE, kernel="ir", timeout=180)
    assert "HELLO 42 AT /home/alice/R/" in installed, installed
    # A CRAN that cannot be reached (the demo's nodes have no internet): one sentence, no R warnings.
    with pytest.raises(AssertionError) as refused:
        alice.run_code('options(repos = c(CRAN = "http://127.0.0.1:9/cran")); install.packages("zoo")',
                       kernel="ir", timeout=120)
    assert "cannot reach http://127.0.0.1:9/cran from this node" in str(refused.value), refused.value
    # Its sockets: unix sockets in her session's private folder, no new TCP port of hers on the node.
    assert _tcp_listeners_of("alice", job["nodes"]) == serving


def page_config(user: HubUser, prefix: str) -> dict:
    """JupyterLab's page config as its page carries it (disabled extensions, terminals)."""
    lab = user.api("GET", f"{prefix}/lab").text
    return json.loads(re.search(r'id="jupyter-config-data" type="application/json">(.*?)</script>', lab, re.S).group(1))


def _tcp_listeners_of(user: str, node: str) -> set[str]:
    """Listening TCP sockets owned by ``user`` in the network namespace of ``node`` (the demo's nodes)."""
    uid = int(subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout)
    listing = subprocess.run(["ip", "netns", "exec", network.namespace(node), "cat", "/proc/net/tcp", "/proc/net/tcp6"],
                             capture_output=True, text=True, check=True).stdout
    return {fields[1] for line in listing.splitlines()[1:]
            if len(fields := line.split()) > 7 and fields[3] == "0A" and fields[7] == str(uid)}


def test_r_runs_inside_an_image_whose_catalog_entry_says_so(alice):
    alice.spawn({"profile": "cpu"})
    specs = alice.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]
    if "dsportal-debian-python-r" not in specs:
        pytest.skip("the demo's debian-python image is not built with R yet (dsportal images build debian-python)")
    seen = alice.run_code("cat(sum(1:10), nzchar(Sys.getenv('APPTAINER_CONTAINER')), Sys.info()[['user']], "
                          "Sys.getenv('SLURM_JOB_ID'))", kernel="dsportal-debian-python-r", timeout=180)
    assert seen.split() == ["55", "TRUE", "alice", str(active_jobs("alice")[0]["job_id"])], seen


PLANTED = {
    # R reads these from its working folder (the notebook's); a neighbour can leave them in a shared one.
    ".Rprofile": 'writeLines("rprofile", file.path(Sys.getenv("HOME"), "planted-ran"))\n',
    ".Renviron": "DSPORTAL_PLANTED=renviron\n",
    # and Python 3.11+ puts the working folder first on sys.path unless told not to
    "ipykernel_launcher.py": 'import os; open(os.path.expanduser("~/planted-ran"), "w").write("python")\n',
}


def _notebook(kernel: str, code: str) -> dict:
    return {"cells": [{"cell_type": "code", "source": code, "metadata": {}, "outputs": [], "execution_count": None}],
            "metadata": {"kernelspec": {"name": kernel, "display_name": kernel}}, "nbformat": 4, "nbformat_minor": 5}


def test_files_planted_in_a_notebooks_folder_do_not_run_in_her_kernels(alice):
    alice.spawn({"profile": "cpu"})
    folder, home = "planted-by-a-neighbour", "/home/alice"
    alice.run_in_terminal(f"rm -rf ~/{folder} ~/planted-ran && mkdir ~/{folder}")
    for name, text in PLANTED.items():  # (hidden files: the contents API refuses them; put there as a copy would)
        planted = f"{home}/{folder}/{name}"
        subprocess.run(["runuser", "-u", "alice", "--", "tee", planted], input=text, text=True, capture_output=True,
                       check=True)
    # an .RData whose .First would run as it is restored
    alice.run_code(f'.First <- function() writeLines("rdata", "{home}/planted-ran"); '
                   f'save(.First, file = "{home}/{folder}/.RData"); cat("saved")', kernel="ir")
    kernels = [("ir", 'cat(Sys.getenv("DSPORTAL_PLANTED"), "|", "ran")'),
               ("dsportal-debian-python", "import os; print(os.environ.get('DSPORTAL_PLANTED'), '|', 'ran')")]
    specs = alice.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]
    for kernel, code in kernels:
        if kernel not in specs:
            continue
        path = f"{folder}/{kernel}.ipynb"
        alice.api("PUT", f"/user/alice/api/contents/{path}",
                  json={"type": "notebook", "content": _notebook(kernel, code)}).raise_for_status()
        said = alice.run_notebook(path, timeout=180)
        assert said[0].split("|")[-1].strip() == "ran" and "renviron" not in said[0], (kernel, said)
        assert not os.path.exists(f"{home}/planted-ran"), (kernel, open(f"{home}/planted-ran").read())


def test_a_profile_without_tools_offers_none_of_them(portal, admin):
    """The class profile lists only the terminal and R: no git extension, no VS Code tile."""
    student = HubUser(portal, "student07").must_login("student07-demo")
    try:
        student.spawn({"profile": "class"})
        prefix = "/user/student07"
        assert student.api("GET", f"{prefix}/git/settings").status_code == 404
        assert student.api("GET", f"{prefix}/nbdime/difftool").status_code == 404  # nbdime: git's diffs only
        assert "ir" in student.api("GET", f"{prefix}/api/kernelspecs").json()["kernelspecs"]
        assert student.api("POST", f"{prefix}/api/terminals").status_code == 200
        assert {"@jupyterlab/git", "nbdime-jupyterlab"} <= set(page_config(student, prefix)["disabledExtensions"])
        opened = student.api("GET", f"{prefix}/vscode/", allow_redirects=False)
        assert opened.status_code >= 400, opened.status_code
    finally:
        stop_and_wait(admin, "student07")


def test_git_works_against_a_repository_in_her_home(alice):
    alice.spawn({"profile": "cpu"})
    alice.run_in_terminal("rm -rf ~/gitdemo && mkdir ~/gitdemo && cd ~/gitdemo && git init -q && "
                          "git config user.email alice@example.org && git config user.name Alice && "
                          "echo hi > a.txt && git add a.txt && git commit -qm 'first commit from alice'")
    log = alice.api("POST", "/user/alice/git/gitdemo/log", json={"history_count": 5})
    assert log.status_code == 200 and log.json()["commits"][0]["commit_msg"] == "first commit from alice", log.text
    # nbdime, which jupyterlab-git's notebook diffs use, is served where git is offered.
    diff = alice.api("POST", "/user/alice/nbdime/api/isgit", json={"path": "gitdemo/a.txt"})
    assert diff.status_code == 200 and diff.json()["is_git"] is True, diff.text


JOB_TMP = "/var/lib/dsportal-demo/jobtmp"  # the demo's job_container.conf BasePath (then node, node, job, .job)


def _code_server_socket(user: str) -> str | None:
    """The unix socket code-server of ``user`` listens on (as root, from the nodes' process table)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if b"--socket" in argv and any(b"code-server" in a for a in argv[:3]):
            if owner == int(subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout):
                return argv[argv.index(b"--socket") + 1].decode()
    return None


@pytest.mark.skipif(not os.access("/opt/dsportal/code-server/bin/code-server", os.X_OK), reason="code-server not installed")
def test_vs_code_is_hers_alone(alice, bob):
    alice.spawn({"profile": "cpu"})
    job = active_jobs("alice")[0]
    serving = _tcp_listeners_of("alice", job["nodes"])
    page = alice.api("GET", "/user/alice/vscode/")
    assert page.status_code == 200 and "code-server" in page.text.lower(), (page.status_code, page.text[:300])
    sock = None
    for _ in range(20):
        if sock := _code_server_socket("alice"):
            break
        time.sleep(0.5)
    assert sock and sock.startswith("/tmp/dsportal-alice-"), sock
    assert _tcp_listeners_of("alice", job["nodes"]) == serving, "code-server listens on TCP"
    # bob through her server, and through his own server's proxy: refused.
    assert bob.api("GET", "/user/alice/vscode/", allow_redirects=False).status_code in (302, 403)
    # bob's shell on the login node and bob's job on her node: the socket is in her job's own /tmp (Slurm's
    # job_container/tmpfs), not in theirs; its folder on the node's disk is root's and hers alone.
    # (22.05 mounts the job's folder itself on /tmp; 23.02 on, its _tmp beside _dev_shm)
    job_folder = f"{JOB_TMP}/{job['nodes']}/{job['nodes']}/{job['job_id']}/.{job['job_id']}"
    tmp = f"{job_folder}/_tmp" if os.path.isdir(f"{job_folder}/_tmp") else job_folder
    on_disk = f"{tmp}/{sock.removeprefix('/tmp/')}"
    assert os.path.exists(on_disk), on_disk
    env = {**os.environ, **SLURM_ENV}
    for path in (sock, on_disk):
        # (from its folder: the path on disk is longer than a unix socket's address may be)
        probe = (f"import os, socket; os.chdir(os.path.dirname({path!r})); s = socket.socket(socket.AF_UNIX); "
                 f"s.connect(os.path.basename({path!r})); print('CONNECTED')")
        tries = [subprocess.run(["runuser", "-u", "bob", "--", "python3", "-c", probe], capture_output=True, text=True),
                 subprocess.run(["runuser", "-u", "bob", "--", "srun", "--quiet", "-p", "cpu", "-w", job["nodes"], "-n1",
                                 "-t", "2", "python3", "-c", probe], capture_output=True, text=True, env=env, timeout=120)]
        for tried in tries:
            assert "CONNECTED" not in tried.stdout, (path, tried)
            assert "PermissionError" in tried.stderr or "FileNotFoundError" in tried.stderr, (path, tried.stderr)
    # The socket is code-server's (root reaches it on the node's disk).
    mine = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", "socket",
                           "http://localhost/healthz"], capture_output=True, text=True, cwd=os.path.dirname(on_disk))
    assert mine.stdout == "200", mine


# ------------------------------------------------------------------------------- in a real browser

@pytest.mark.skipif(not os.access("/opt/dsportal/code-server/bin/code-server", os.X_OK), reason="code-server not installed")
def test_r_vs_code_and_git_open_from_the_launcher(alice):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

    from test_browser import SHOTS, open_lab

    alice.spawn({"profile": "cpu"})
    job = active_jobs("alice")[0]
    alice.run_in_terminal("rm -rf ~/gitdemo ~/vscode-terminal.txt && mkdir ~/gitdemo && cd ~/gitdemo && git init -q && "
                          "git config user.email alice@example.org && git config user.name Alice && "
                          "echo hi > hello-from-alice.txt && git add . && git commit -qm 'first commit from alice'")
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser, page = open_lab(playwright)
        # R: its tile on the launcher opens a notebook whose kernel computes in her job.
        page.locator('.jp-LauncherCard[title="R"]').first.click()
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for(timeout=60_000)
        page.locator(".jp-StatusBar-TextItem", has_text="R | Idle").first.wait_for(timeout=90_000)
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
        page.keyboard.type("cat(sum(1:10))")  # (in her job: test_r_runs_in_her_job_and_installs_to_her_own_library)
        page.keyboard.press("Shift+Enter")
        output = page.locator(".jp-OutputArea-output", has_text="55")
        output.wait_for(timeout=90_000)
        assert output.inner_text().strip() == "55"
        page.screenshot(path=str(SHOTS / "r-kernel.png"))

        # git: the sidebar shows the repository of her home that the file browser is in, with its commit.
        page.goto(page.url.split("/lab")[0] + "/lab/tree/gitdemo?reset")
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        page.locator('li.lm-TabBar-tab[data-id="jp-git-sessions"]').click()
        page.get_by_text("first commit from alice").first.wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "git-history.png"))

        # VS Code: its tile opens it in a new tab, on her home; its terminal runs in her job.
        page.goto(page.url.split("/lab")[0] + "/lab?reset")
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        with page.context.expect_page(timeout=60_000) as opened:
            page.locator('.jp-LauncherCard', has_text='VS Code').first.click()
        code = opened.value
        code.wait_for_selector(".monaco-workbench", timeout=120_000)
        try:  # Workspace Trust asks about her own home: she trusts it
            code.get_by_role("button", name=re.compile("Yes, I trust the authors")).click(timeout=20_000)
        except PlaywrightTimeout:
            pass
        code.locator(".explorer-folders-view .monaco-list-row", has_text="gitdemo").first.wait_for(timeout=60_000)
        code.screenshot(path=str(SHOTS / "vscode.png"))
        code.keyboard.press("Control+Shift+Backquote")  # Terminal: Create New Terminal
        code.locator(".terminal-wrapper.active, .xterm").first.wait_for(timeout=60_000)
        code.wait_for_timeout(2000)
        code.keyboard.type("echo $SLURM_JOB_ID $(id -un) > ~/vscode-terminal.txt\n")
        deadline = time.monotonic() + 30
        written = ""
        while time.monotonic() < deadline and not written:
            written = open("/home/alice/vscode-terminal.txt").read() if os.path.exists("/home/alice/vscode-terminal.txt") else ""
            time.sleep(0.5)
        assert written.split() == [str(job["job_id"]), "alice"], written
        code.screenshot(path=str(SHOTS / "vscode-terminal.png"))
        browser.close()
