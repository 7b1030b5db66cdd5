"""Each user's server on its own web origin (http://alice.localhost:8000/user/alice/ on the demo), in a
real browser (Debian chromium via Playwright): a page alice's server serves, opened in bob's browser,
cannot use bob's login to read his files, start his kernels or get a token for him, and as her guest he
never reaches the services she proxies; alice's
~/.jupyter config does not change what her server serves; the portal still opens at the URL
README prints, http://127.0.0.1:8000, and leads on into JupyterLab."""

from __future__ import annotations

import errno
import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import requests
from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

from conftest import HUB, PASSWORDS
from test_browser import ARGS, CHROMIUM

HUB_HOST = "http://localhost:8000"  # config/portal.yaml: hub.subdomain_host


def log_in_at_the_printed_url(page, user: str) -> None:
    page.goto(HUB)
    page.fill("#username_input", user)
    page.fill("#password_input", PASSWORDS[user])
    page.click("#login_submit")
    page.wait_for_url(f"http://{user}.localhost:8000/user/{user}/**", timeout=60_000)


SQUAT = ("import socket\ns = socket.socket(socket.AF_INET6)\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "try:\n    s.bind(('{address}', 8000)); s.listen(); print('LISTENING')\nexcept OSError as e:\n    print(e.errno)")


def test_nobody_listens_where_browsers_look_first_for_localhost_names(portal):
    """Browsers try ::1 before 127.0.0.1 for localhost and *.localhost: a user of the login node who
    listened on [::1]:8000 would be sent everybody's logins. The hub holds that address."""
    for address in ("::1", "::"):
        tried = subprocess.run(["runuser", "-u", "mallory", "--", "/usr/bin/python3", "-c", SQUAT.format(address=address)],
                               capture_output=True, text=True, timeout=30)
        assert tried.stdout.strip() == str(errno.EADDRINUSE), (address, tried.stdout, tried.stderr)


def test_the_printed_url_leads_to_the_login_and_on_into_jupyterlab_on_the_users_own_origin(alice):
    alice.spawn({"profile": "cpu"})
    # Hub pages opened at 127.0.0.1 are sent to the hub's own host; the hub API answers there as well.
    sent = requests.get(f"{HUB}/hub/login", allow_redirects=False)
    assert sent.status_code == 302 and sent.headers["Location"] == f"{HUB_HOST}/hub/login", sent.headers
    assert requests.get(f"{HUB}/hub/api/", timeout=10).json()["version"]
    assert alice.api("GET", "/hub/api/users/alice").json()["servers"][""]["url"] == "http://alice.localhost:8000/user/alice/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_context().new_page()
        page.goto(HUB)
        assert page.url.startswith(f"{HUB_HOST}/hub/login"), page.url
        log_in_at_the_printed_url(page, "alice")
        page.wait_for_function("window.dsportalLab && window.dsportalLab.loaded", timeout=90_000)
        assert page.evaluate("location.origin") == "http://alice.localhost:8000"
        browser.close()


# What alice's own web server (in her session, reached through her server's /proxy/PORT/) serves:
# a page whose script tries bob's files, kernels and tokens with whatever bob's browser sends, and
# which records the cookies each request to it came with.
ALICE_SERVES = r'''
import http.server, os, socket, subprocess, sys, textwrap
folder = os.path.expanduser("~/origins-test")
os.makedirs(folder, exist_ok=True)
open(os.path.join(folder, "page.html"), "w").write({page!r})
open(os.path.join(folder, "serve.py"), "w").write(textwrap.dedent("""
    import http.server, os, sys
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            with open("cookies-seen.txt", "a") as seen:
                seen.write((self.headers.get("Cookie") or "") + "\\n")
            super().do_GET()
    os.chdir(sys.argv[2])
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
subprocess.Popen([sys.executable, os.path.join(folder, "serve.py"), str(port), folder],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print(port)
'''

ATTACK_PAGE = """<!doctype html><title>alice's page</title><script>
// Jupyter and JupyterHub want the _xsrf cookie's value in a header with cookie-authenticated API
// calls: the page sends the one it can read (its own origin's) with every call.
// (A sandboxed page, with no origin of its own, may not read cookies at all.)
let cookies = "";
try { cookies = document.cookie; } catch (error) { cookies = ""; }
const xsrf = (cookies.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || "";
async function attempt(url, options) {
  options = Object.assign({credentials: "include"}, options || {});
  if (options.mode !== "no-cors") options.headers = Object.assign({"X-XSRFToken": xsrf}, options.headers || {});
  try {
    const response = await fetch(url, options);
    return {status: response.status, type: response.type, body: (await response.text()).slice(0, 2000)};
  } catch (error) { return {error: String(error)}; }
}
const post = (body) => ({method: "POST", body: body, headers: {"Content-Type": "text/plain"}});
const noCors = (body) => Object.assign(post(body), {mode: "no-cors"});
(async () => {
  const bob = "http://bob.localhost:8000/user/bob", hub = "http://localhost:8000/hub/api/users/bob/tokens";
  const token = JSON.stringify({note: "minted by alice's page"}), kernel = JSON.stringify({name: "python3"});
  window.results = {
    alicesOwnFiles: await attempt("/user/alice/api/contents/origins-test"),
    bobsFiles: await attempt(bob + "/api/contents"),
    bobsFilesOnThisHost: await attempt("/user/bob/api/contents"),
    bobsFilesAtTheHubsAddress: await attempt("http://127.0.0.1:8000/user/bob/api/contents"),
    bobsKernel: await attempt(bob + "/api/kernels", post(kernel)),
    bobsKernelBlind: await attempt(bob + "/api/kernels", noCors(kernel)),
    bobsKernelOnThisHost: await attempt("/user/bob/api/kernels", post(kernel)),
    bobsToken: await attempt(hub, post(token)),
    bobsTokenBlind: await attempt(hub, noCors(token)),
    bobsTokenAtTheHubsAddress: await attempt("http://127.0.0.1:8000/hub/api/users/bob/tokens", noCors(token)),
    bobsTokenOnThisHost: await attempt("/hub/api/users/bob/tokens", post(token)),
  };
})();
</script>"""


def refused(result: dict) -> bool:
    """A browser's answer to the page that carries nothing of bob's: a network/CORS error, an opaque
    (no-cors) response, or a status that is not success."""
    return "error" in result or result["type"] == "opaque" or not 200 <= result["status"] < 300


def test_a_page_of_alices_server_in_bobs_browser_cannot_use_bobs_login(alice, bob, admin):
    alice.spawn({"profile": "cpu", "shared": True})  # a session she may share (bob is in her sharing group)
    bob.spawn({"profile": "cpu"})
    secret = f"bob-secret-{uuid.uuid4().hex[:8]}"
    bob.api("PUT", f"/user/bob/api/contents/{secret}.txt",
            json={"type": "file", "format": "text", "content": secret}).raise_for_status()
    kernels_before = bob.api("GET", "/user/bob/api/kernels").json()
    tokens_before = {t["id"] for t in bob.api("GET", "/hub/api/users/bob/tokens").json()["api_tokens"]}
    port = int(alice.run_code(ALICE_SERVES.format(page=ATTACK_PAGE), keep=True).strip())
    # alice's server is shared with bob (here through the admin), so bob's browser opens pages at her origin.
    shared = admin.api("POST", "/hub/api/shares/alice/", json={"user": "bob"})
    assert shared.status_code == 200, shared.text
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_context().new_page()
            log_in_at_the_printed_url(page, "bob")  # bob's own JupyterLab: his server's cookie too
            answer = page.goto(f"http://alice.localhost:8000/user/alice/proxy/{port}/page.html")
            # The hub asks bob whether alice's server may know who he is (it is not his server).
            assert page.url.startswith(f"{HUB_HOST}/hub/api/oauth2/authorize"), page.url
            page.get_by_role("button", name="Authorize").click()
            page.wait_for_timeout(2000)  # back at her server, which refuses him the page (Chrome's error page)
            # A guest never reaches the owner's own services (portal/session/sharing.py): her proxied
            # page is refused, and her service never sees bob's request.
            answer = page.context.request.get(f"http://alice.localhost:8000/user/alice/proxy/{port}/page.html",
                                              max_redirects=0)  # with bob's cookies for her origin
            assert answer.status == 403, (answer.status, answer.text()[:300])
            # Her page as a file of her session (jupyter_server serves it sandboxed) runs in bob's browser.
            page.goto("http://alice.localhost:8000/user/alice/files/origins-test/page.html")
            try:
                page.wait_for_function("window.results !== undefined", timeout=60_000)
            except PlaywrightTimeout:
                raise AssertionError(f"no results at {page.url}: {page.content()[:3000]}") from None
            results = page.evaluate("window.results")
            browser.close()
    finally:
        admin.api("DELETE", "/hub/api/shares/alice/")

    # The page's script ran in bob's browser, and got nothing of bob's: every attempt refused, his file
    # never seen (nor alice's own through bob's access: the sandbox gives the page no origin's cookies).
    for name, result in results.items():
        assert refused(result), (name, result)
        assert secret not in json.dumps(result), name
    assert bob.api("GET", "/user/bob/api/kernels").json() == kernels_before
    tokens_after = bob.api("GET", "/hub/api/users/bob/tokens").json()["api_tokens"]
    assert not [t for t in tokens_after if t["id"] not in tokens_before and "alice" in (t.get("note") or "")]
    # Nor did alice's service receive anything of bob's: no request reached it.
    seen = Path("/home/alice/origins-test/cookies-seen.txt")
    assert not seen.exists() or not seen.read_text().strip(), seen.read_text()
    shutil.rmtree("/home/alice/origins-test", ignore_errors=True)


USER_CONFIG = {
    # an unauthenticated page: the server's static files include a folder of hers
    ".jupyter/jupyter_server_config.py": "c.ServerApp.extra_static_paths = ['/home/alice/pub']\n",
    ".jupyter/jupyter_server_config.json": json.dumps({"ServerApp": {"extra_static_paths": ["/home/alice/pub"]}}),
    ".local/etc/jupyter/jupyter_server_config.json": json.dumps({"ServerApp": {"extra_static_paths": ["/home/alice/pub"]}}),
    # lab config: JupyterLab's page config, here turning dsportal's extension off
    ".jupyter/labconfig/page_config.json": json.dumps({"disabledExtensions": {"dsportal-lab": True}}),
    ".local/etc/jupyter/labconfig/page_config.json": json.dumps({"disabledExtensions": {"dsportal-lab": True}}),
    "pub/planted.html": "<script>/* served to anybody */</script>PLANTED",
}


def plant(home: Path) -> list[Path]:
    planted = []
    for relative, text in USER_CONFIG.items():
        path = home / relative
        if path.exists():
            raise AssertionError(f"{path} exists already: not overwriting alice's own file")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        planted.append(path)
    for path in planted:
        for part in [path, *path.parents]:
            if part == home:
                break
            shutil.chown(part, "alice", "alice")
    return planted


def test_alices_jupyter_config_does_not_change_what_her_server_serves(alice):
    home = Path("/home/alice")
    planted = plant(home)
    try:
        alice.spawn({"profile": "cpu"})
        assert alice.run_code("import os; print(os.environ.get('JUPYTERHUB_DISABLE_USER_CONFIG'))").strip() == "1"
        static = alice.url("/user/alice/static/planted.html")
        assert "PLANTED" not in requests.get(static, timeout=30).text
        assert "PLANTED" not in alice.api("GET", "/user/alice/static/planted.html").text
        lab = alice.api("GET", "/user/alice/lab").text
        config = json.loads(re.search(r'<script id="jupyter-config-data"[^>]*>(.*?)</script>', lab, re.S).group(1))
        assert "dsportal-lab" not in json.dumps(config.get("disabledExtensions", {})), config.get("disabledExtensions")
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
        shutil.rmtree(home / "pub", ignore_errors=True)
