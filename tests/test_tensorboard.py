"""Issue 5: TensorBoard for any log folder, through jupyter-server-proxy, reachable by its owner only.

Real parts: alice's kernel writes scalar events with torch.utils.tensorboard inside her Slurm
job; a real TensorBoard serves them on a unix socket in her session's private folder; the hub's
proxy and the session's jupyter-server-proxy handler bring it to her browser only.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import requests

WRITE_EVENTS = """
import os
from torch.utils.tensorboard import SummaryWriter
for run, scale in (("run1", 1.0), ("run2", 2.0)):
    writer = SummaryWriter(os.path.expanduser(f"~/tb-test/{run}"))
    for step in range(5):
        writer.add_scalar("loss", scale / (step + 1), step)
    writer.close()
print("written")
"""


def tensorboard_processes(user: str) -> list[str]:
    out = subprocess.run(["pgrep", "-u", user, "-af", "portal.session.tool.tensorboards"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "--socket" in line]


def scalars(user, url: str, run: str, tag: str = "loss", expect: int = 5, timeout: float = 60) -> list:
    """TensorBoard's scalars data API, waiting for it to have loaded the events."""
    deadline = time.monotonic() + timeout
    while True:
        response = user.api("GET", f"{url}data/plugin/scalars/scalars", params={"run": run, "tag": tag})
        if response.status_code == 200 and len(response.json()) >= expect:
            return response.json()
        if time.monotonic() > deadline:
            raise AssertionError(f"no scalars from {url}: {response.status_code} {response.text[:300]}")
        time.sleep(1)


def test_tensorboard_for_a_folder_is_its_owners_only(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 1})
    subprocess.run(["rm", "-rf", "/home/alice/tb-test"], check=True)
    assert "written" in alice.run_code(WRITE_EVENTS, timeout=120)

    api = "/user/alice/dsportal/api/tensorboards"
    response = alice.api("POST", api, json={"logdir": "tb-test"})
    assert response.status_code == 201, response.text
    board = response.json()["tensorboard"]
    assert board["url"].startswith("/user/alice/dsportal/tensorboard/tb-test-") and board["url"].endswith("/")
    # The same folder gives the same board (a stable URL); another folder gets its own.
    assert alice.api("POST", api, json={"logdir": "~/tb-test"}).json()["tensorboard"]["url"] == board["url"]
    other = alice.api("POST", api, json={"logdir": "tb-test/run2"}).json()["tensorboard"]
    assert other["url"] != board["url"]
    assert len(tensorboard_processes("alice")) == 2

    # The values written by the kernel come back from TensorBoard's own data API.
    runs = alice.api("GET", f"{board['url']}data/runs").json()
    assert sorted(runs) == ["run1", "run2"], runs
    values = scalars(alice, board["url"], "run1")
    assert [(step, round(value, 4)) for _, step, value in values] == [(s, round(1.0 / (s + 1), 4)) for s in range(5)]
    assert [round(v, 4) for _, _, v in scalars(alice, other["url"], ".")] == [round(2.0 / (s + 1), 4) for s in range(5)]
    page = alice.api("GET", board["url"])
    assert page.status_code == 200 and "tensorboard" in page.text.lower()

    # Nobody else: bob's token, bob's browser session, an anonymous client; no TCP port to bypass it.
    for url in (board["url"], f"{board['url']}data/plugin/scalars/scalars?run=run1&tag=loss"):
        assert bob.api("GET", url, allow_redirects=False).status_code == 403
        assert bob.web.get(f"{bob.base}{url}", allow_redirects=False).status_code in (302, 403)
        assert requests.get(f"{alice.base}{url}", allow_redirects=False, timeout=30).status_code in (302, 403)
    assert bob.api("POST", api, json={"logdir": "/home/alice/tb-test"}).status_code == 403
    listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    pids = {line.split()[1] for line in tensorboard_processes("alice")}
    assert not any(f"pid={pid}," in listening for pid in pids), "a TensorBoard listens on a TCP port"

    # Bad folders get a message, nothing starts.
    for logdir, expected in (("no-such-folder", "no such folder"), ("", "logdir must be")):
        response = alice.api("POST", api, json={"logdir": logdir})
        assert response.status_code == 400 and expected in response.json()["message"], response.text

    # The file browser's "Open TensorBoard" link: starts (or reuses) and redirects.
    opened = alice.api("GET", "/user/alice/dsportal/tensorboard-open", params={"logdir": "tb-test"},
                       allow_redirects=False)
    assert opened.status_code == 302 and opened.headers["Location"].endswith(board["url"])

    # Closing one stops its process; stopping the session leaves none behind.
    name = other["url"].rstrip("/").rsplit("/", 1)[1]
    assert alice.api("DELETE", f"{api}/{name}").status_code == 204
    assert alice.api("GET", other["url"]).status_code == 404
    assert len(tensorboard_processes("alice")) == 1
    alice.stop_server()
    deadline = time.monotonic() + 30
    while tensorboard_processes("alice") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tensorboard_processes("alice") == []


def test_notebook_tensorboard_magic_opens_the_private_tensorboard(alice, bob):
    """%load_ext tensorboard + %tensorboard in a session: the session's own unix-socket TensorBoard,
    not a TCP port of the node that every other user could open."""
    alice.spawn({"profile": "cpu"})
    subprocess.run(["rm", "-rf", "/home/alice/tb-test"], check=True)
    assert "written" in alice.run_code(WRITE_EVENTS, timeout=120)
    alice.run_code("%load_ext tensorboard\n%tensorboard --logdir ~/tb-test\n", timeout=120)
    boards = alice.api("GET", "/user/alice/dsportal/api/tensorboards").json()["tensorboards"]
    assert [b["logdir"] for b in boards] == ["/home/alice/tb-test"], boards
    url = boards[0]["url"]
    assert url.startswith("/user/alice/dsportal/tensorboard/tb-test-"), url
    assert [round(v, 4) for _, _, v in scalars(alice, url, "run1")] == [round(1.0 / (s + 1), 4) for s in range(5)]
    listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    assert not any(f"pid={b['pid']}," in listening for b in boards), "%tensorboard listens on a TCP port"
    assert bob.api("GET", f"{url}data/runs", allow_redirects=False).status_code == 403


def test_jupyterlab_loads_the_dsportal_extension(alice):
    """The extension JupyterLab serves is the one its builder made from labextension/src."""
    import re

    alice.spawn({"profile": "cpu"})
    page = alice.api("GET", "/user/alice/lab")
    assert page.status_code == 200
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                  page.text, re.S).group(1))
    found = [e for e in config["federated_extensions"] if e["name"] == "dsportal-lab"]
    assert len(found) == 1 and found[0]["extension"] == "./extension", config["federated_extensions"]
    assert re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", found[0]["load"]), found
    script = alice.api("GET", f"/user/alice/lab/extensions/dsportal-lab/{found[0]['load']}")
    assert script.status_code == 200 and "dsportal-lab" in script.text
    installed = json.loads(Path("/opt/dsportal/env/share/jupyter/labextensions/dsportal-lab/package.json").read_text())
    assert installed["jupyterlab"]["_build"]["load"] == found[0]["load"]
    chunks = " ".join(p.read_text() for p in Path("/opt/dsportal/env/share/jupyter/labextensions/dsportal-lab/static").glob("*.js"))
    for text in ("Open TensorBoard", "Multi-node jobs", "dsportal-SliceStatus", "Keep my session"):
        assert text in chunks, text
