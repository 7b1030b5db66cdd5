"""A small client for driving the real hub the way a browser or script does."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid
from urllib.parse import urlparse

import requests
import websocket
from jupyterhub.utils import subdomain_hook_idna

from browsercookies import BrowserCookies
from democluster.base import CONFIGLESS, SLURM_RELEASE, slurm_conf_path, slurm_prefix

# The demo's Slurm as its login node sees it (make test SLURM=RELEASE: that release's commands, configless: no
# slurm.conf, sackd's copy), for the commands the tests run themselves, as root or as a user.
SLURM_BIN = str(slurm_prefix() / "bin")
DEMO_SLURM_CONF = None if CONFIGLESS else str(slurm_conf_path())
SLURM_ENV = {"PATH": f"{SLURM_BIN}:/usr/sbin:/usr/bin:/sbin:/bin" if SLURM_RELEASE else "/usr/sbin:/usr/bin:/sbin:/bin",
             **({"SLURM_CONF": DEMO_SLURM_CONF} if DEMO_SLURM_CONF else {})}


def slice_memory_limit(asked: int) -> int:
    """The memory limit Slurm puts on a slice's job (bytes): what it asked for, capped by Slurm at the node's memory.
    22.05 caps it at the memory the machine has; 24.11 on, at the node's RealMemory, which the demo declares beyond
    the machine's (slurmd's config_overrides): there a slice's limit is what it asked for."""
    if SLURM_RELEASE:
        return asked
    return min(asked, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 ** 20 * 2 ** 20)


def demo_slurm(**options):
    """The portal's own Slurm client on the demo's Slurm (as the hub's is)."""
    from portal.slurm.slurmclient import Slurm

    return Slurm(conf=DEMO_SLURM_CONF, bin_dir=SLURM_BIN, **options)


class LoginRefused(AssertionError):
    pass


# Where each hub serves users' servers, learnt from the server models it gives: hub URL -> None (on
# the hub's own origin) or (scheme, domain, ":port") when each user's server has its own origin
# (JupyterHub's subdomain_host: alice's at scheme://alice.domain:port).
_SERVER_ORIGINS: dict[str, tuple[str, str, str] | None] = {}


def _origin(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


class _Browser(requests.Session):
    """A browser session that opened the hub at base: like a browser, it is where the hub sent it
    (the hub's own host, hub_origin) and each user's server at that server's origin; base's URLs
    (the tests' {HUB}/hub/spawn, {HUB}/user/alice/lab) are read as those pages."""

    def __init__(self, user: HubUser):
        super().__init__()
        self.user = user
        self.cookies.set_policy(BrowserCookies())

    def request(self, method, url, *args, **kwargs):
        return super().request(method, self.user.url(url, web=True), *args, **kwargs)

    def prepare_request(self, request):
        """Cookies from this session's own jar, with its policy (requests copies them into a jar with
        the default policy for a request's first hop; redirects use this jar)."""
        prepared = super().prepare_request(request)
        prepared.headers.pop("Cookie", None)
        prepared.prepare_cookies(self.cookies)
        return prepared


class HubUser:
    """One person's browser session on the hub (cookies + xsrf), plus an API token."""

    def __init__(self, base_url: str, name: str, token: str | None = None):
        self.base = base_url.rstrip("/")
        self.hub_origin = self.base  # where the hub serves its pages: the login page says (login)
        self.name = name
        self.web = _Browser(self)
        # A new connection per request: a kept-alive one that sat idle can be closed by the proxy
        # (Node's 5 s keep-alive timeout) just as a request goes out on it, and a POST sent into
        # that closing socket comes back as 'Connection reset by peer' (seen once in CI).
        self.web.headers["Connection"] = "close"
        self._token = token  # else made on first use, from the logged-in browser session

    # -- login ----------------------------------------------------------------------
    def login(self, password: str, timeout: float | None = None) -> requests.Response:
        page = self.web.get(f"{self.base}/hub/login", timeout=timeout)
        self.hub_origin = _origin(page.url)  # the hub sends its pages to its own host (subdomain_host)
        return self.web.post(
            f"{self.hub_origin}/hub/login",
            data={"username": self.name, "password": password, "_xsrf": self._hub_xsrf()},
            allow_redirects=False, timeout=timeout,
        )

    def must_login(self, password: str) -> HubUser:
        response = self.login(password)
        if response.status_code != 302:
            raise LoginRefused(f"{self.name} could not log in: {response.status_code}")
        return self

    def _hub_xsrf(self) -> str:
        """The hub's _xsrf cookie (each user's server sets one of its own too)."""
        host = urlparse(self.hub_origin).hostname
        return next((c.value for c in self.web.cookies if c.name == "_xsrf" and c.path.startswith("/hub")
                     and c.domain.lstrip(".") in (host, f"{host}.local")), "")

    @property
    def xsrf(self) -> dict:
        return {"X-XSRFToken": self._hub_xsrf()}

    # -- where things are ---------------------------------------------------------------
    def url(self, path: str, web: bool = False) -> str:
        """The URL of a path (or of a URL at base): /user/NAME/... at NAME's server's origin (its own
        when the hub gives each user one), the hub's at base, or for the browser (web) at the hub's own host."""
        if path.startswith(self.base + "/"):
            path = path[len(self.base):]
        elif not path.startswith("/"):
            return path
        parts = path.split("/", 3)
        if len(parts) > 2 and parts[1] == "user" and parts[2]:
            return self.server_origin(parts[2].split("?")[0]) + path
        if len(parts) > 2 and parts[1] == "services" and parts[2]:
            return self.service_origin(parts[2]) + path
        return (self.hub_origin if web else self.base) + path

    def server_origin(self, name: str) -> str:
        """Where NAME's server answers: its own origin (JupyterHub's subdomain_host), else the hub's."""
        if self.base not in _SERVER_ORIGINS and self._token is not None:
            self.model()  # my server's model says where servers are, if mine runs
        layout = _SERVER_ORIGINS.get(self.base)
        if layout is None:
            return self.base
        scheme, domain, port = layout
        return f"{scheme}://{subdomain_hook_idna(name, domain, 'user')}{port}"

    def service_origin(self, name: str) -> str:
        """Where the hub's service NAME answers: its own origin where the hub gives users theirs (the
        hub's pages are then at a host of their own: the login page said), else the hub's."""
        hub, base = urlparse(self.hub_origin), urlparse(self.base)
        if hub.hostname == base.hostname:
            return self.base
        return f"{hub.scheme}://{subdomain_hook_idna(name, hub.hostname, 'service')}{f':{hub.port}' if hub.port else ''}"

    def _learn_server_origins(self, model: dict) -> None:
        for server in model.get("servers", {}).values():
            url = urlparse(server.get("url", ""))
            if url.hostname and url.hostname.startswith(subdomain_hook_idna(model["name"], "", "user")):
                domain = url.hostname[len(subdomain_hook_idna(model["name"], "", "user")):]
                _SERVER_ORIGINS[self.base] = (url.scheme, domain, f":{url.port}" if url.port else "")
            elif server.get("url"):
                _SERVER_ORIGINS[self.base] = None

    @property
    def token(self) -> str:
        if self._token is None:
            response = self.web.post(f"{self.hub_origin}/hub/api/users/{self.name}/tokens", headers=self.xsrf,
                                     json={"note": "dsportal tests", "expires_in": 3600})
            response.raise_for_status()
            self._token = response.json()["token"]
        return self._token

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, self.url(path), headers=headers, timeout=60, **kwargs)

    # -- the server -----------------------------------------------------------------
    def model(self, user: str | None = None, tries: int = 4) -> dict:
        """The user's model; a busy hub's 429 is retried after the Retry-After it asks for, as its sentence says."""
        for _ in range(tries):
            response = self.api("GET", f"/hub/api/users/{user or self.name}")
            if response.status_code != 429:
                break
            time.sleep(min(float(response.headers.get("Retry-After", 5)), 30))
        response.raise_for_status()
        model = response.json()
        self._learn_server_origins(model)
        return model

    def server_api(self, server: str = "", user: str | None = None) -> str:
        """The hub's API path of one of a user's sessions: the default one, or a named one."""
        return f"/hub/api/users/{user or self.name}/" + (f"servers/{server}" if server else "server")

    def server_prefix(self, server: str = "") -> str:
        """Where a session of mine serves: /user/NAME/ or, for a named one, /user/NAME/SERVER/."""
        return f"/user/{self.name}" + (f"/{server}" if server else "")

    def start_server(self, options: dict | None = None, server: str = "") -> requests.Response:
        return self.api("POST", self.server_api(server), json=options or {})

    def progress_events(self, timeout: float = 120, until=lambda event: False) -> list[dict]:
        """The hub's progress stream for the spawn in flight, until ready, failed or ``until(event)``."""
        events = []
        with self.api("GET", f"/hub/api/users/{self.name}/server/progress", stream=True) as response:
            response.raise_for_status()
            deadline = time.monotonic() + timeout
            for line in response.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[5:])
                    events.append(event)
                    if event.get("ready") or event.get("failed") or until(event):
                        break
                if time.monotonic() > deadline:
                    break
        return events

    def wait_ready(self, timeout: float = 120, server: str = "") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.model().get("servers", {}).get(server)
            if found and found.get("ready"):
                return found
            if not found:
                raise AssertionError(f"{self.name}'s server {server!r} is gone while starting: {self.model()}")
            time.sleep(1)
        raise AssertionError(f"{self.name}'s server {server!r} not ready after {timeout} s")

    def spawn(self, options: dict | None = None, timeout: float = 120, server: str = "") -> dict:
        response = self.start_server(options, server)
        assert response.status_code in (201, 202), response.text
        return self.wait_ready(timeout, server)

    def stop_server(self, user: str | None = None, server: str | None = None) -> None:
        """Stop one session of the user (``server``: '' the default one, a name a named one), or with
        ``server`` None all of them, named ones included, and wait until the hub has none running."""
        names = [server] if server is not None else sorted(set(self.model(user).get("servers", {})) | {""})
        for name in names:
            response = self.api("DELETE", self.server_api(name, user))
            assert response.status_code in (202, 204, 400, 404), response.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            model = self.model(user)
            running = set(model.get("servers", {}))
            if not running & set(names) and (model.get("pending") is None or server not in (None, "")):
                return
            time.sleep(0.5)
        raise AssertionError(f"server(s) {names} of {user or self.name} did not stop")

    # -- kernels ----------------------------------------------------------------------
    def _channels(self, kernel_id: str, timeout: float, server: str = ""):
        url = self.url(f"{self.server_prefix(server)}/api/kernels/{kernel_id}/channels").replace("http", "ws", 1)
        return websocket.create_connection(url, header=[f"Authorization: token {self.token}"], timeout=timeout)

    def _ask(self, ws, code: str) -> str:
        """Send one cell to an open kernel channel without waiting for it; its message id."""
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.name,
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False},
        }))
        return msg_id

    def _execute(self, ws, code: str, timeout: float) -> str:
        """Run one cell on an open kernel channel; its stdout, or AssertionError with the traceback."""
        msg_id = self._ask(ws, code)
        output = []
        deadline = time.monotonic() + timeout
        while (raw := receive(ws, deadline)) is not None:
            message = json.loads(raw)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if kind == "stream":
                output.append(message["content"]["text"])
            elif kind == "error":
                raise AssertionError("kernel error: " + "\n".join(message["content"]["traceback"]))
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                return "".join(output)
        raise AssertionError("kernel did not finish in time")

    def run_code(self, code: str, kernel: str = "python3", timeout: float = 60, keep: bool = False,
                 server: str = "") -> str:
        """Start a kernel in my server (``server``: a named session) through the proxy, run code,
        return its stdout (``keep``: leave the kernel running, e.g. for what it started)."""
        prefix = f"{self.server_prefix(server)}/api/kernels"
        created = self.api("POST", prefix, json={"name": kernel})
        created.raise_for_status()
        kernel_id = created.json()["id"]
        ws = self._channels(kernel_id, timeout, server)
        try:
            return self._execute(ws, code, timeout)
        finally:
            ws.close()
            if not keep:
                self.api("DELETE", f"{prefix}/{kernel_id}")

    def run_in_terminal(self, command: str, timeout: float = 30) -> str:
        """Type a command into a JupyterLab terminal of my server; what the terminal printed
        until the command's end marker."""
        created = self.api("POST", f"/user/{self.name}/api/terminals")
        created.raise_for_status()
        name = created.json()["name"]
        url = self.url(f"/user/{self.name}/terminals/websocket/{name}").replace("http", "ws", 1)
        ws = websocket.create_connection(url, header=[f"Authorization: token {self.token}"], timeout=timeout)
        marker = uuid.uuid4().hex[:12]
        try:
            ws.send(json.dumps(["stdin", f"{command}; echo END-{marker[:6]}''{marker[6:]}\r"]))
            output, deadline = "", time.monotonic() + timeout
            while (raw := receive(ws, deadline)) is not None:
                message = json.loads(raw)
                if message[0] == "stdout":
                    output += message[1]
                    if f"END-{marker}" in output:
                        return output.split(f"END-{marker}")[0]
            raise AssertionError(f"terminal did not finish: {output[-500:]}")
        finally:
            ws.close()
            self.api("DELETE", f"/user/{self.name}/api/terminals/{name}")

    def run_notebook(self, path: str, timeout: float = 600) -> list[str]:
        """Open a notebook of my server as JupyterLab does (a session: its kernel starts in the
        notebook's folder) and run its code cells in order; the stdout of each."""
        notebook = self.api("GET", f"/user/{self.name}/api/contents/{path}")
        notebook.raise_for_status()
        session = self.api("POST", f"/user/{self.name}/api/sessions",
                           json={"path": path, "type": "notebook", "name": path.rsplit("/", 1)[-1],
                                 "kernel": {"name": notebook.json()["content"]["metadata"]["kernelspec"]["name"]}})
        session.raise_for_status()
        ws = self._channels(session.json()["kernel"]["id"], timeout)
        try:
            return [self._execute(ws, "".join(cell["source"]), timeout)
                    for cell in notebook.json()["content"]["cells"] if cell["cell_type"] == "code"]
        finally:
            ws.close()
            self.api("DELETE", f"/user/{self.name}/api/sessions/{session.json()['id']}")


def receive(ws, deadline: float) -> str | None:
    """A websocket's next message, or None once ``deadline`` (time.monotonic()) has passed.

    websocket-client answers the server's pings inside recv(), so a socket timeout longer than the
    server's ping interval (Jupyter's is 30 s) never fires: a loop on recv() alone waits forever for
    a message that does not come. Here each wait is at most 5 s and the deadline is checked between."""
    while (left := deadline - time.monotonic()) > 0:
        ws.settimeout(min(left, 5.0))
        try:
            return ws.recv()
        except websocket.WebSocketTimeoutException:
            continue
    return None


def squeue_jobs() -> dict[int, dict]:
    """What Slurm itself says, independent of the portal's own parser."""
    out = subprocess.run(["squeue", "--json", "--states=all"], env=SLURM_ENV,
                         capture_output=True, text=True, check=True).stdout
    return {job["job_id"]: as_in_22_05(job) for job in json.loads(out)["jobs"]}


def scontrol_in_22_05(fields: dict[str, str]) -> dict[str, str]:
    """scontrol show job's fields in 22.05's words, whichever release said them: from 23.02 on a job's TRES are
    ReqTRES and AllocTRES (22.05: TRES, the allocated ones once it runs), its TresPerNode gres/gpu:2 (gres:gpu:2)."""
    fields = dict(fields)
    if "TRES" not in fields and ("AllocTRES" in fields or "ReqTRES" in fields):
        fields["TRES"] = fields.get("AllocTRES") or fields.get("ReqTRES", "")
    if "TresPerNode" in fields:
        fields["TresPerNode"] = re.sub(r"(?<![^,])gres/", "gres:", fields["TresPerNode"])
    return fields


def as_in_22_05(job: dict) -> dict:
    """A job of squeue --json in 22.05's words, whichever release said it: from 23.02 on, its state is a list of
    the state and its flags (["RUNNING"]), and numbers are {"set": ..., "infinite": ..., "number": ...}."""
    plain = {}
    for key, value in job.items():
        if isinstance(value, dict) and {"set", "number"} <= set(value):
            value = value["number"] if value["set"] and not value.get("infinite") else None
        elif key == "job_state" and isinstance(value, list):
            value = value[0] if value else ""
        plain[key] = value
    return plain


def active_jobs(user: str) -> list[dict]:
    return [j for j in squeue_jobs().values()
            if j["user_name"] == user and j["job_state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
