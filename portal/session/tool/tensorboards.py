"""TensorBoard for any log folder of a session, through jupyter-server-proxy, for its owner only.

Each folder gets its own TensorBoard process, started inside the session's job as the user. It
listens on a **unix socket** in the session's private folder (mode 700), never on a TCP port,
so nobody else on the node can reach it; the session's Jupyter server proxies it with
jupyter-server-proxy's ``ProxyHandler`` at a stable URL:

    /user/NAME/dsportal/tensorboard/<name>/      name = folder slug + short hash of its path

REST (under the session's base URL):
  GET    dsportal/api/tensorboards            the running ones
  POST   dsportal/api/tensorboards            {"logdir": "runs/exp1"} -> start (or reuse) one
  DELETE dsportal/api/tensorboards/<name>     stop it
  GET    dsportal/tensorboard-open?logdir=... start (or reuse) and redirect to it (file browser's
                                              "Open TensorBoard", links)

All are stopped with the session's server (and Slurm ends the job's processes anyway).
``%load_ext tensorboard`` / ``%tensorboard`` inside notebooks go through jupyter-server-proxy's
``/proxy/<port>/`` instead (``TENSORBOARD_PROXY_URL`` is set by the session job).
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from portal.session.api import MessageAPIHandler
from portal.upstream import session as upstream
from portal.upstream.patchcheck import stands_aside

START_TIMEOUT = 60.0


@dataclass
class Board:
    name: str
    logdir: str
    socket: str
    process: subprocess.Popen
    started: float
    url: str

    def as_dict(self) -> dict:
        return {"name": self.name, "logdir": self.logdir, "url": self.url, "started": self.started,
                "running": self.process.poll() is None, "pid": self.process.pid}


class TensorBoards:
    """The session's TensorBoard processes, one per log folder."""

    def __init__(self, root: str, base_url: str, runtime_dir: str):
        self.root = Path(root).resolve()
        self.base_url = base_url
        self.folder = Path(runtime_dir) / "tensorboard"
        self.boards: dict[str, Board] = {}

    def resolve(self, logdir) -> Path:
        if not isinstance(logdir, str) or not logdir.strip() or "\0" in logdir:
            raise ValueError("logdir must be a folder name")
        path = Path(os.path.expanduser(logdir.strip()))
        path = (path if path.is_absolute() else self.root / path).resolve()
        if not path.is_dir():
            raise ValueError(f"no such folder: {path}")
        if not os.access(path, os.R_OK | os.X_OK):
            raise ValueError(f"folder {path} is not readable")
        return path

    @staticmethod
    def name_for(path: Path) -> str:
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", path.name).strip("-")[:32] or "root"
        return f"{slug}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"

    def url_for(self, name: str) -> str:
        return url_path_join(self.base_url, f"dsportal/tensorboard/{name}/")

    async def open(self, logdir) -> Board:
        if stands_aside("tensorboard-info-file"):  # its board process would fail on a TCP port it never gets
            raise ValueError("TensorBoards are off in this session: the installed TensorBoard is a release this "
                             "portal has not been checked against yet. Ask your admin to update dsportal; "
                             "TensorBoard's own `tensorboard --logdir ...` in a terminal still works.")
        path = self.resolve(logdir)
        name = self.name_for(path)
        board = self.boards.get(name)
        if board and board.process.poll() is None:
            return board
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.folder, 0o700)
        sock = self.folder / f"{name}.sock"
        sock.unlink(missing_ok=True)
        log = open(self.folder / f"{name}.log", "ab")
        prefix = self.url_for(name).rstrip("/")
        process = subprocess.Popen(
            [sys.executable, "-m", "portal.session.tool.tensorboards", "--logdir", str(path), "--socket", str(sock),
             "--path-prefix", prefix],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        board = Board(name=name, logdir=str(path), socket=str(sock), process=process, started=time.time(),
                      url=self.url_for(name))
        self.boards[name] = board
        deadline = time.monotonic() + START_TIMEOUT
        while not sock.exists():
            if process.poll() is not None:
                tail = (self.folder / f"{name}.log").read_text(errors="replace")[-800:]
                raise RuntimeError(f"TensorBoard for {path} exited at start: {tail}")
            if time.monotonic() > deadline:
                self.stop(name)
                raise RuntimeError(f"TensorBoard for {path} did not start within {START_TIMEOUT:.0f} s")
            await asyncio.sleep(0.2)
        return board

    def stop(self, name: str) -> bool:
        board = self.boards.pop(name, None)
        if board is None:
            return False
        if board.process.poll() is None:
            try:
                os.killpg(board.process.pid, signal.SIGTERM)
                board.process.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(board.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        Path(board.socket).unlink(missing_ok=True)
        return True

    def stop_all(self) -> None:
        for name in list(self.boards):
            self.stop(name)


def _boards(handler) -> TensorBoards:
    return handler.settings["dsportal_tensorboards"]


class BoardsHandler(MessageAPIHandler):
    @web.authenticated
    def get(self):
        boards = _boards(self)
        self.finish(json.dumps({"tensorboards": [b.as_dict() for b in boards.boards.values()]}))

    @web.authenticated
    async def post(self):
        try:
            body = json.loads(self.request.body or b"{}")
            board = await _boards(self).open(body.get("logdir") if isinstance(body, dict) else None)
        except ValueError as error:
            raise web.HTTPError(400, f"Cannot open TensorBoard: {error}") from None
        except RuntimeError as error:
            raise web.HTTPError(500, str(error)) from None
        self.set_status(201)
        self.finish(json.dumps({"tensorboard": board.as_dict()}))


class BoardHandler(MessageAPIHandler):
    @web.authenticated
    def delete(self, name):
        if not _boards(self).stop(name):
            raise web.HTTPError(404, f"no TensorBoard named {name}")
        self.set_status(204)
        self.finish()


class OpenHandler(JupyterHandler):
    @web.authenticated
    async def get(self):
        try:
            board = await _boards(self).open(self.get_argument("logdir", ""))
        except ValueError as error:
            raise web.HTTPError(400, f"Cannot open TensorBoard: {error}") from None
        self.redirect(board.url)


def _board_socket(handler, name) -> tuple[str, str]:
    board = _boards(handler).boards.get(name)
    if board is None or board.process.poll() is not None:
        raise web.HTTPError(404, f"TensorBoard {name} is not running: open it again from its folder")
    return board.socket, f"dsportal/tensorboard/{name}"


BoardProxyHandler = upstream.unix_socket_proxy_handler(
    "BoardProxyHandler",
    """jupyter-server-proxy's handler (its auth, header handling and streaming), pointed at the
    board's unix socket; TensorBoard serves under its --path_prefix, so paths pass unchanged.""",
    _board_socket)


def setup(server_app) -> list[tuple]:
    """Start the session's TensorBoard registry; its routes, below the base URL."""
    base = server_app.web_app.settings["base_url"]
    runtime_dir = os.environ.get("JUPYTER_RUNTIME_DIR") or server_app.runtime_dir
    boards = TensorBoards(server_app.root_dir, base, runtime_dir)
    server_app.web_app.settings["dsportal_tensorboards"] = boards
    atexit.register(boards.stop_all)
    return [
        ("dsportal/api/tensorboards", BoardsHandler),
        (r"dsportal/api/tensorboards/([A-Za-z0-9_-]+)", BoardHandler),
        ("dsportal/tensorboard-open", OpenHandler),
        (r"dsportal/tensorboard/([A-Za-z0-9_-]+)(/.*|)", BoardProxyHandler, {"absolute_url": True}),
    ]


# ------------------------------------------------------------------ the TensorBoard process
def serve(logdir: str, sock: str, path_prefix: str) -> None:
    """TensorBoard's own app, served on a unix socket instead of a TCP port."""
    from werkzeug.serving import ThreadedWSGIServer

    class UnixSocketServer(ThreadedWSGIServer):
        def __init__(self, wsgi_app, flags):
            old = os.umask(0o077)
            try:
                super().__init__(f"unix://{sock}", 0, wsgi_app)
            finally:
                os.umask(old)

        def get_url(self):
            return f"unix:{sock}"

        def print_serving_message(self):
            print(f"TensorBoard for {logdir} serving on {sock} under {path_prefix}", flush=True)

    board = upstream.tensorboard_without_info_file()(server_class=UnixSocketServer)
    board.configure(argv=[None, "--logdir", logdir, "--path_prefix", path_prefix, "--reload_interval", "2"])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    board.main()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="TensorBoard on a unix socket (started by the session).")
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--path-prefix", required=True)
    args = parser.parse_args()
    serve(args.logdir, args.socket, args.path_prefix)
