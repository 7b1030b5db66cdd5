"""Sharing a session on purpose (portal.yaml sharing; portal/hub/sharing.py, portal/session/sharing.py):
alice shares her session `train` with bob, a member of her team (ml-lab). bob works in it as her guest:
her files and kernels, as her, in her job; not her jobs, TensorBoards, proxies, other sessions or
tokens. carol, never invited, gets nothing. alice takes it back and bob is out at once, websockets
included; a share taken back through the hub's API ends within the session's recheck."""

from __future__ import annotations

import time

import pytest
import websocket

from conftest import CONFIG as REPO_CONFIG
from hubclient import HubUser, receive
from portal.core.settings import SettingsError, load
from portal.hub import sharing as hub_sharing
from spawner.partitionspawner import SHARING_SCOPES

TRAIN = "train"
SHARING = f"/user/alice/{TRAIN}/dsportal/api/sharing"


def guest_kernel(guest: HubUser, prefix: str):
    """A kernel of the session at ``prefix``, as ``guest``: (kernel id, its channels websocket)."""
    created = guest.api("POST", f"{prefix}/api/kernels", json={"name": "python3"})
    assert created.status_code == 201, created.text
    kernel = created.json()["id"]
    url = guest.url(f"{prefix}/api/kernels/{kernel}/channels").replace("http", "ws", 1)
    return kernel, websocket.create_connection(url, header=[f"Authorization: token {guest.token}"], timeout=30)


def closed_within(ws, seconds: float) -> bool:
    """The server closed the websocket within ``seconds`` (messages before that are skipped)."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if receive(ws, deadline) is None and not ws.connected:
                return True
    except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
        return True
    return not ws.connected


@pytest.mark.quick
def test_the_hub_lets_members_share_within_their_groups_only(tmp_path):
    roles = hub_sharing.roles(["ml-lab"])
    assert roles == [{"name": "dsportal-share-in-ml-lab", "description": roles[0]["description"],
                      "scopes": ["shares!user", "read:users:name!group=ml-lab", "read:groups:name!group=ml-lab"],
                      "groups": ["ml-lab"]}]

    assert SHARING_SCOPES == ("shares!server", "read:users:name", "read:groups:name")
    text = (REPO_CONFIG.read_text() + "\n").replace("sharing:\n  groups: [ml-lab, intro-dl]", "sharing:\n  groups: [Not A Group]")
    bad = tmp_path / "portal.yaml"
    bad.write_text(text)
    with pytest.raises(SettingsError, match="is not a Unix group name"):
        load(bad)


@pytest.fixture
def train(alice):
    alice.spawn({"profile": "cpu", "shared": True}, server=TRAIN)  # started shareable (the form's checkbox)
    yield alice
    alice.api("PATCH", f"/hub/api/shares/alice/{TRAIN}", json={"user": "bob"})
    alice.stop_server(server=TRAIN)


@pytest.mark.timeout(600)
def test_a_guest_gets_the_shared_session_only_and_is_out_at_once_when_it_is_taken_back(train, bob, carol):
    alice = train
    prefix = f"/user/alice/{TRAIN}"
    job = int(alice.run_code("import os; print(os.environ['SLURM_JOB_ID'])", server=TRAIN))
    # Before any share: bob and carol are strangers to it.
    for stranger in (bob, carol):
        assert stranger.api("GET", f"{prefix}/api/contents").status_code == 403

    # Only within the admin's groups: carol is not in ml-lab (alice's one sharing group), in words;
    # the hub refuses it too, asked directly with alice's own token.
    refused = alice.api("POST", SHARING, json={"user": "carol"})
    assert refused.status_code == 403 and "only with members of ml-lab" in refused.json()["message"], refused.text
    direct = alice.api("POST", f"/hub/api/shares/alice/{TRAIN}", json={"user": "carol"})
    assert direct.status_code == 403, direct.text
    # Oversized or odd names are refused in words, nothing stored.
    for body in ({"user": "b" * 65_536}, {"user": ["bob"]}, {"user": "bob", "group": "ml-lab"}, "bob"):
        answer = alice.api("POST", SHARING, json=body)
        assert answer.status_code == 400 and answer.json()["message"], (body if isinstance(body, str) else list(body), answer.text)
    # bob cannot share alice's session with himself, at the hub or through the session.
    assert bob.api("POST", f"/hub/api/shares/alice/{TRAIN}", json={"user": "bob"}).status_code in (403, 404)

    shared = alice.api("POST", SHARING, json={"user": "bob"})
    assert shared.status_code == 200 and "Shared with bob" in shared.json()["message"], shared.text
    listing = alice.api("GET", SHARING).json()
    assert listing["shareable"] and listing["groups"] == ["ml-lab"]
    assert [s["user"] for s in listing["shares"]] == ["bob"]
    mine = bob.api("GET", "/hub/api/users/bob/shared").json()["items"]
    assert [(s["server"]["user"]["name"], s["server"]["name"]) for s in mine] == [("alice", TRAIN)]

    # bob works in it: her files; code runs as alice, in her train job.
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 200
    kernel, ws = guest_kernel(bob, prefix)
    out = bob._execute(ws, "import getpass, os\nprint(getpass.getuser(), os.environ['SLURM_JOB_ID'])", 60).split()
    assert out[0] == "alice" and int(out[1]) == job, (out, job)
    # ... but not what stays hers, each refused in words.
    for path in ("dsportal/api/jobs", "dsportal/api/slice", "dsportal/api/sharing", "proxy/8888/",
                 "dsportal/api/walltime/saved", "dsportal/api/tensorboards", "dsportal/tensorboard/tb-x/"):
        answer = bob.api("GET", f"{prefix}/{path}")
        assert answer.status_code == 403, (path, answer.status_code, answer.text[:200])
        if "proxy/" not in path and "tensorboard/" not in path:  # jupyter-server-proxy's errors have no body
            assert "as a guest in this session" in answer.text, (path, answer.text[:300])
    assert bob.api("POST", SHARING, json={"user": "bob"}).status_code == 403
    assert bob.api("GET", "/hub/api/users/alice/tokens").status_code in (403, 404)
    assert bob.api("GET", "/user/alice/api/contents", allow_redirects=False).status_code != 200  # her default session
    # carol, never invited, still gets nothing.
    assert carol.api("GET", f"{prefix}/api/contents").status_code == 403
    assert carol.api("GET", "/hub/api/users/carol/shared").json()["items"] == []

    # The owner reads who is connected and what the guest did.
    listing = alice.api("GET", SHARING).json()
    assert listing["connected"] == ["bob"], listing
    assert any(" bob connected to a kernel" in line for line in listing["visits"]), listing["visits"]

    # Taken back: his open websocket is closed at once, and his next request refused.
    taken = alice.api("DELETE", f"{SHARING}?user=bob")
    assert taken.status_code == 200 and "bob no longer has access" in taken.json()["message"], taken.text
    assert closed_within(ws, 10), "bob's kernel websocket stayed open after alice took the share back"
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 403
    assert bob.api("GET", f"{prefix}/api/kernels/{kernel}").status_code == 403
    assert alice.api("GET", SHARING).json()["shares"] == []
    assert bob.api("GET", "/hub/api/users/bob/shared").json()["items"] == []

    # A group (ml-lab): bob is in through it; taken back, he is out again.
    assert alice.api("POST", SHARING, json={"group": "ml-lab"}).status_code == 200
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 200
    assert alice.api("DELETE", f"{SHARING}?group=ml-lab").status_code == 200
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 403
    assert alice.api("POST", SHARING, json={"group": "intro-dl"}).status_code == 403  # not one of alice's groups

    # Shared again, then taken back through the hub's API (not the panel): out within the recheck.
    assert alice.api("POST", SHARING, json={"user": "bob"}).status_code == 200
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 200
    assert alice.api("PATCH", f"/hub/api/shares/alice/{TRAIN}", json={"user": "bob"}).status_code == 200
    deadline = time.monotonic() + 30
    while bob.api("GET", f"{prefix}/api/contents").status_code == 200:
        assert time.monotonic() < deadline, "bob still reached the session 30 s after the hub took his share back"
        time.sleep(1)
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 403

    # Shared again through the hub's API (as the docs offer it beside the panel), after a take-back there
    # and after one in the panel: bob is in within the session's recheck either way, not after the 5
    # minutes the session's cache of the hub's "no" would keep him out.
    for taken_back_in in ("the hub's API", "the Share panel"):
        if taken_back_in == "the Share panel":
            assert alice.api("DELETE", f"{SHARING}?user=bob").status_code == 200
            assert bob.api("GET", f"{prefix}/api/contents").status_code == 403
        shared = alice.api("POST", f"/hub/api/shares/alice/{TRAIN}", json={"user": "bob"})
        assert shared.status_code == 200, shared.text
        assert [s["user"] for s in alice.api("GET", SHARING).json()["shares"]] == ["bob"]
        started, deadline = time.monotonic(), time.monotonic() + 30
        while bob.api("GET", f"{prefix}/api/contents").status_code != 200:
            assert time.monotonic() < deadline, f"bob still refused 30 s after a share at the hub ({taken_back_in})"
            time.sleep(0.5)
        print(f"re-shared at the hub after a take-back in {taken_back_in}: bob in after "
              f"{time.monotonic() - started:.1f} s")


@pytest.mark.quick
def test_a_pages_session_lists_are_computed_only_when_a_template_reads_them():
    """JupyterHub calls each template variable's function for every page it renders (the token page, the
    spawn form): her sessions, why ended ones ended, and those shared with her are computed the first time
    a template reads them, once."""
    from portal.hub.sessions import later

    calls = []

    def compute(user):
        calls.append(user)
        return {"train": "your session job 7 reached its time limit"}

    value = later(compute)("alice")
    assert calls == []  # a page that does not show them
    assert value and value.get("train").startswith("your session") and dict(value.items())["train"]
    assert value["train"] and len(value) == 1 and list(value) == ["train"]
    assert calls == ["alice"]


@pytest.mark.quick
def test_a_session_not_started_shareable_is_not_listed_as_shared_with_anyone():
    """A share of a session that would refuse its guest (made before it was started again without the box
    ticked) is not on the guest's home page."""
    from types import SimpleNamespace

    from portal.hub.sessions import shared_with

    class Owner:  # JupyterHub's users: keys of its UserDict
        name = "alice"

    owner = Owner()
    users = {owner: SimpleNamespace(server_url=lambda name: f"/user/alice/{name}/")}

    def share(name: str, options):
        return SimpleNamespace(user=SimpleNamespace(name="bob"), spawner=SimpleNamespace(
            user=owner, name=name, server=object(), user_options=options))

    bob = SimpleNamespace(name="bob", settings={"users": users}, orm_user=SimpleNamespace(all_shared_with_me=[
        share("train", {"profile": "cpu", "shared": True}), share("", {"profile": "cpu"}), share("old", None)]))
    assert [(r.owner, r.name) for r in shared_with(bob)] == [("alice", "train")]
    assert hub_sharing.not_shareable("alice", "") == (
        "alice's default session was not started shareable, so nobody could open it through a share: start it "
        "with \"Let me share this session with a colleague\" ticked, then share it.")


def test_only_a_session_started_shareable_by_a_member_of_the_groups_is_shareable(admin, alice, bob):
    """alice's sessions are shareable only when she asks at the start; dave is in no sharing group: he
    cannot ask, and his sessions cannot be shared, and say so."""
    # The form offers the box to members of a sharing group only.
    assert 'name="shared"' in alice.web.get(f"{alice.base}/hub/spawn").text
    assert 'name="shared"' not in admin.web.get(f"{admin.base}/hub/spawn").text
    alice.spawn({"profile": "cpu"})  # not asked: no co-editing, no Share panel, no guests
    assert alice.api("GET", "/user/alice/dsportal/api/sharing?brief=1").json() == {"shareable": False}
    refused = alice.api("POST", "/user/alice/dsportal/api/sharing", json={"user": "bob"})
    assert refused.status_code == 400 and "cannot be shared" in refused.json()["message"]
    # The hub's own share API refuses it too, in words (a share or a share code), and bob is shown nothing.
    for api in ("shares", "share-codes"):
        refused = alice.api("POST", f"/hub/api/{api}/alice/", json={"user": "bob"} if api == "shares" else {})
        assert refused.status_code == 400, (api, refused.text)
        assert refused.json()["message"] == hub_sharing.not_shareable("alice", ""), refused.text
    assert bob.api("GET", "/hub/api/users/bob/shared").json()["items"] == []
    assert "dsportal-shared-with-me" not in bob.web.get(f"{bob.base}/hub/home").text
    # ... and bob, who may not share her sessions, learns nothing of which are shareable.
    assert bob.api("POST", "/hub/api/shares/alice/", json={"user": "bob"}).status_code in (403, 404)
    alice.stop_server()
    for wrong in ("yes", 1, None):
        answer = alice.start_server({"profile": "cpu", "shared": wrong}, server="wrong")
        assert answer.status_code == 400 and "shared must be true or false" in answer.text, answer.text
    dave = admin
    answer = dave.start_server({"profile": "cpu", "shared": True})
    assert answer.status_code == 400 and "you may not share sessions" in answer.text, answer.text
    try:
        dave.spawn({"profile": "cpu"})
        answer = dave.api("GET", "/user/dave/dsportal/api/sharing").json()
        assert answer["shareable"] is False and "cannot be shared" in answer["message"]
        refused = dave.api("POST", "/user/dave/dsportal/api/sharing", json={"user": "bob"})
        assert refused.status_code == 400 and "cannot be shared" in refused.json()["message"]
    finally:
        dave.stop_server()


NOTEBOOK = {"cells": [{"cell_type": "code", "execution_count": None, "id": "shared-cell", "metadata": {},
                       "outputs": [], "source": ""}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def _authorize_if_asked(page) -> None:
    """JupyterHub asks a guest once to let the owner's session know who she is (its OAuth page)."""
    button = page.locator("form button[type=submit]", has_text="Authorize")
    try:
        button.wait_for(timeout=5_000)
    except Exception:  # noqa: BLE001 - not asked
        return
    button.click()


@pytest.mark.timeout(600)
def test_in_two_browsers_alice_shares_train_with_bob_they_edit_live_and_she_takes_it_back(train, bob, carol):
    from playwright.sync_api import sync_playwright

    from test_browser import ARGS, CHROMIUM, HUB, SHOTS, log_in

    alice = train
    prefix = f"/user/alice/{TRAIN}"
    job = alice.run_code("import os; print(os.environ['SLURM_JOB_ID'], end='')", server=TRAIN)
    saved = alice.api("PUT", f"{prefix}/api/contents/shared.ipynb", json={"type": "notebook", "content": NOTEBOOK})
    assert saved.status_code in (200, 201), saved.text
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        # Two people, two browser profiles (cookies of their own).
        a = chromium.new_context(viewport={"width": 1400, "height": 900}).new_page()
        b = chromium.new_context(viewport={"width": 1400, "height": 900}).new_page()
        c = chromium.new_context(viewport={"width": 1400, "height": 900}).new_page()
        log_in(a, "alice", to_session=False)
        a.goto(f"{HUB}{prefix}/lab/tree/shared.ipynb?reset")
        a.wait_for_function("window.dsportalLab && window.dsportalLab.shareable === true", timeout=90_000)
        a.locator("#dsportal-share-button").click()
        panel = a.locator(".dsportal-Sharing")
        panel.locator("input[name=user]").fill("bob")
        panel.locator("button[type=submit]").click()
        panel.locator(".dsportal-Sharing-ok", has_text="Shared with bob").wait_for(timeout=30_000)
        panel.locator(".dsportal-Sharing-share[data-user=bob]").wait_for(timeout=30_000)
        a.screenshot(path=str(SHOTS / "sharing-panel.png"))

        # bob finds it on his home page and opens it at alice's address.
        log_in(b, "bob", to_session=False)
        b.goto(f"{HUB}/hub/home")
        row = b.locator("#dsportal-shared-with-me tr[data-owner=alice]")
        row.wait_for(timeout=30_000)
        assert f"alice's session {TRAIN}" in row.inner_text()
        row.locator(".dsportal-open-shared").click()
        _authorize_if_asked(b)
        b.wait_for_url(f"**{prefix}/lab**", timeout=60_000)
        b.goto(f"{b.url.split(prefix)[0]}{prefix}/lab/tree/shared.ipynb?reset")
        b.locator(".dsportal-GuestBanner", has_text="alice's session: you (bob) are a guest").wait_for(timeout=90_000)

        # Both type into the one cell; each sees the other's text appear.
        editor_a = a.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor_b = b.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor_a.wait_for(timeout=60_000)
        editor_b.wait_for(timeout=60_000)
        editor_a.click()
        a.keyboard.type("import getpass, os  # alice was here\n")
        b.wait_for_function("[...document.querySelectorAll('.jp-Cell .cm-content')].some(e => e.textContent.includes('alice was here'))",
                            timeout=30_000)
        editor_b.click()
        b.keyboard.press("Control+End")
        b.keyboard.type("print(getpass.getuser(), os.environ['SLURM_JOB_ID'])  # bob too")
        a.wait_for_function("[...document.querySelectorAll('.jp-Cell .cm-content')].some(e => e.textContent.includes('bob too'))",
                            timeout=30_000)
        # Each sees the other's cursor, with the other's name (jupyter-collaboration's awareness).
        for page, other in ((a, "bob"), (b, "alice")):
            page.locator(".jp-CollaboratorHeader", has_text=other).wait_for(state="attached", timeout=30_000)
            page.locator(".jp-Notebook .jp-remote-cursor").first.wait_for(state="attached", timeout=30_000)
        # bob runs the cell: it runs in alice's job, as alice.
        b.keyboard.press("Control+Enter")
        b.locator(".jp-OutputArea-output", has_text=f"alice {job}").wait_for(timeout=90_000)
        a.locator(".jp-OutputArea-output", has_text=f"alice {job}").wait_for(timeout=30_000)
        a.screenshot(path=str(SHOTS / "sharing-alice.png"))
        b.screenshot(path=str(SHOTS / "sharing-bob.png"))
        visits = alice.api("GET", SHARING).json()
        assert visits["connected"] == ["bob"], visits

        # carol, never invited: the address gives her nothing.
        log_in(c, "carol", to_session=False)
        c.goto(f"{HUB}{prefix}/lab/tree/shared.ipynb")
        _authorize_if_asked(c)
        c.wait_for_load_state()
        said = c.inner_text("body")
        assert "No access to resources" in said or "is not allowed" in said, said[:500]  # the hub's 404, or the session's 403
        assert c.locator(".jp-Notebook").count() == 0
        c.goto(f"{HUB}/hub/home")
        assert c.locator("#dsportal-shared-with-me").count() == 0

        # alice takes it back: bob's next keystroke reaches nobody, his next request is refused.
        panel.locator(".dsportal-Sharing-share[data-user=bob] .dsportal-Sharing-takeBack").click()
        panel.locator(".dsportal-Sharing-ok", has_text="bob no longer has access").wait_for(timeout=30_000)
        # bob's JupyterLab loses the session at once, and the top bar says why.
        b.locator(".dsportal-GuestBanner.dsportal-mod-takenBack",
                  has_text="alice has taken back your access to this session").wait_for(timeout=30_000)
        b.screenshot(path=str(SHOTS / "sharing-taken-back-dialog.png"))
        b.keyboard.press("Escape")
        b.wait_for_timeout(500)
        while b.locator(".jp-Dialog").count():
            b.locator(".jp-Dialog button").last.click()
            b.wait_for_timeout(500)
        editor_b.click()
        b.keyboard.press("Control+End")
        b.keyboard.type("  # after she took it back")
        a.wait_for_timeout(5000)
        assert "after she took it back" not in a.locator(".jp-Notebook").first.inner_text()
        refused = b.evaluate(f"fetch('{prefix}/api/contents/shared.ipynb').then(r => r.status)")
        assert refused == 403, refused
        b.screenshot(path=str(SHOTS / "sharing-taken-back.png"))
        chromium.close()
    assert bob.api("GET", f"{prefix}/api/contents").status_code == 403
