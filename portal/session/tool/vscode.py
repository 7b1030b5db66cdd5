"""VS Code in the browser: code-server, started from JupyterLab's launcher, inside the session's job.

jupyter-server-proxy starts it on first use (its ``jupyter_serverproxy_servers`` entry point, this
module's :func:`server`) and proxies ``/user/NAME/vscode/`` to it, behind the session's own login as
every page of her server is. code-server listens on a **unix socket** in a new folder (mode 700) of
the session's private TMPDIR, never on TCP, with its own login off (the socket is hers alone) and its
own port proxy off (``--disable-proxy``: it would forward to any port of the node, past
portal.session.tool.portguard). It opens her home; its terminals run in the job with the slice's cores,
memory and GPUs; it ends with the session's job.

A profile whose ``tools`` leave out ``vscode`` (portal.session.tool.offer), or a node without code-server,
shows no tile; the address answers why.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from portal.session.tool.offer import Tools

ICON = Path(__file__).with_name("vscode.svg")


def command(binary: str, home: str, config_dir: str) -> list[str]:
    # Workspace Trust stays on: VS Code runs scripts in a notebook's saved outputs, a folder's tasks
    # and its .vscode settings only where she trusts the folder (a neighbour's shared notebook would
    # otherwise run script on her origin).
    return [binary, "--socket", "{unix_socket}", "--socket-mode", "600", "--auth", "none",
            "--disable-proxy", "--disable-telemetry", "--disable-update-check",
            "--config", os.path.join(config_dir, "code-server.yaml"),
            "--user-data-dir", os.path.join(home, ".local", "share", "code-server"),
            "--extensions-dir", os.path.join(home, ".local", "share", "code-server", "extensions"),
            home]


def server() -> dict:
    """jupyter-server-proxy's settings for code-server in this session."""
    tools = Tools.from_env()
    home = os.path.expanduser("~")
    if not tools.offers("vscode"):
        reason = "VS Code is not offered on this profile: ask your admin (portal.yaml, the profile's tools)."
    elif not os.access(tools.code_server, os.X_OK):
        reason = f"VS Code is not installed on this node ({tools.code_server}): ask your admin."
    else:
        return {
            # Its config file in a new folder of its own (mode 700), never a name in a shared /tmp
            # that a neighbour could have made first: the file's keys are code-server's options.
            "command": command(tools.code_server, home, tempfile.mkdtemp(prefix="dsportal-code-server-")),
            "unix_socket": True,  # a new folder (mode 700) in TMPDIR, the session's private one
            "timeout": 60,
            "new_browser_tab": True,
            "launcher_entry": {"title": "VS Code", "icon_path": str(ICON), "category": "Notebook"},
        }
    return {"command": [sys.executable, "-c", f"import sys; sys.exit({reason!r})"], "unix_socket": True,
            "launcher_entry": {"enabled": False}}
