"""A small client for driving the real hub the way a browser or script does."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import requests
import websocket

DEMO_SLURM_CONF = "/var/lib/dsportal-demo/slurm/slurm.conf"


class LoginRefused(AssertionError):
    pass


class HubUser:
    """One person's browser session on the hub (cookies + xsrf), plus an API token."""

    def __init__(self, base_url: str, name: str, token: str | None = None):
        self.base = base_url.rstrip("/")
        self.name = name
        self.web = requests.Session()
        # A new connection per request: a kept-alive one that sat idle can be closed by the proxy
        # (Node's 5 s keep-alive timeout) just as a request goes out on it, and a POST sent into
        # that closing socket comes back as 'Connection reset by peer' (seen once in CI).
        self.web.headers["Connection"] = "close"
        self._token = token  # else made on first use, from the logged-in browser session

    # -- login ----------------------------------------------------------------------
    def login(self, password: str, timeout: float | None = None) -> requests.Response:
        self.web.get(f"{self.base}/hub/login", timeout=timeout)
        return self.web.post(
            f"{self.base}/hub/login",
            data={"username": self.name, "password": password, "_xsrf": self.web.cookies.get("_xsrf")},
            allow_redirects=False, timeout=timeout,
        )

    def must_login(self, password: str) -> "HubUser":
        response = self.login(password)
        if response.status_code != 302:
            raise LoginRefused(f"{self.name} could not log in: {response.status_code}")
        return self

    @property
    def xsrf(self) -> dict:
        return {"X-XSRFToken": self.web.cookies.get("_xsrf", "")}

    @property
    def token(self) -> str:
        if self._token is None:
            response = self.web.post(f"{self.base}/hub/api/users/{self.name}/tokens", headers=self.xsrf,
                                     json={"note": "dsportal tests", "expires_in": 3600})
            response.raise_for_status()
            self._token = response.json()["token"]
        return self._token

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.base}{path}", headers=headers, timeout=60, **kwargs)

    # -- the server -----------------------------------------------------------------
    def model(self, user: str | None = None) -> dict:
        response = self.api("GET", f"/hub/api/users/{user or self.name}")
        response.raise_for_status()
        return response.json()

    def start_server(self, options: dict | None = None) -> requests.Response:
        return self.api("POST", f"/hub/api/users/{self.name}/server", json=options or {})

    def progress_events(self, timeout: float = 120) -> list[dict]:
        """The hub's progress stream for the spawn in flight, until ready or failed."""
        events = []
        with self.api("GET", f"/hub/api/users/{self.name}/server/progress", stream=True) as response:
            response.raise_for_status()
            deadline = time.monotonic() + timeout
            for line in response.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[5:])
                    events.append(event)
                    if event.get("ready") or event.get("failed"):
                        break
                if time.monotonic() > deadline:
                    break
        return events

    def wait_ready(self, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.model().get("servers", {}).get("")
            if server and server.get("ready"):
                return server
            if not server:
                raise AssertionError(f"{self.name}'s server is gone while starting: {self.model()}")
            time.sleep(1)
        raise AssertionError(f"{self.name}'s server not ready after {timeout} s")

    def spawn(self, options: dict | None = None, timeout: float = 120) -> dict:
        response = self.start_server(options)
        assert response.status_code in (201, 202), response.text
        return self.wait_ready(timeout)

    def stop_server(self, user: str | None = None) -> None:
        response = self.api("DELETE", f"/hub/api/users/{user or self.name}/server")
        assert response.status_code in (202, 204, 400), response.text
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            model = self.model(user)
            if not model.get("servers") and model.get("pending") is None:
                return
            time.sleep(0.5)
        raise AssertionError("server did not stop")

    # -- kernels ----------------------------------------------------------------------
    def _channels(self, kernel_id: str, timeout: float):
        url = f"{self.base.replace('http', 'ws', 1)}/user/{self.name}/api/kernels/{kernel_id}/channels"
        return websocket.create_connection(url, header=[f"Authorization: token {self.token}"], timeout=timeout)

    def _execute(self, ws, code: str, timeout: float) -> str:
        """Run one cell on an open kernel channel; its stdout, or AssertionError with the traceback."""
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.name,
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False},
        }))
        output = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(ws.recv())
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

    def run_code(self, code: str, kernel: str = "python3", timeout: float = 60, keep: bool = False) -> str:
        """Start a kernel in my server through the proxy, run code, return its stdout
        (``keep``: leave the kernel running, e.g. for what it started)."""
        prefix = f"/user/{self.name}/api/kernels"
        created = self.api("POST", prefix, json={"name": kernel})
        created.raise_for_status()
        kernel_id = created.json()["id"]
        ws = self._channels(kernel_id, timeout)
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
        url = f"{self.base.replace('http', 'ws', 1)}/user/{self.name}/terminals/websocket/{name}"
        ws = websocket.create_connection(url, header=[f"Authorization: token {self.token}"], timeout=timeout)
        marker = uuid.uuid4().hex[:12]
        try:
            ws.send(json.dumps(["stdin", f"{command}; echo END-{marker[:6]}''{marker[6:]}\r"]))
            output, deadline = "", time.monotonic() + timeout
            while time.monotonic() < deadline:
                message = json.loads(ws.recv())
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

def squeue_jobs() -> dict[int, dict]:
    """What Slurm itself says, independent of the portal's own parser."""
    out = subprocess.run(["squeue", "--json"], env={"SLURM_CONF": DEMO_SLURM_CONF, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    return {job["job_id"]: job for job in json.loads(out)["jobs"]}


def active_jobs(user: str) -> list[dict]:
    return [j for j in squeue_jobs().values()
            if j["user_name"] == user and j["job_state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]
