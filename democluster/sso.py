"""The demo's single sign-on: an OpenID Connect provider on the login node's loopback, http://127.0.0.1:556 (a port
below 1024: no user of the login node can listen there in its place)
(panva's oidc-provider from npm, config/oidc; democluster/oidc-provider.mjs), knowing the demo's people with their
demo passwords and their groups. The demo's hub logs in through LDAP; a portal.yaml whose `oidc` names this
provider signs in through it instead (docs/how-to/sign-in-with-openid-connect.md, "On the demo").

Its client, dsportal-demo, takes the demo hub's callback and that of the tests' second hub (tests/conftest.py);
its secret is STATE/sso/client-secret, owned by the hub's account as the hub's other secrets are.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from democluster.base import alive, directory, paths, say, secret_file, stop_pid, wait_for
from democluster.hub import private_log
from portal.core import settings as settings_module

PORT = 556
ISSUER = f"http://127.0.0.1:{PORT}"
CLIENT = "dsportal-demo"
# The demo's hub and the tests' second hub, by the addresses their pages have (hub.subdomain_host, or not).
HUBS = ["http://localhost:8000", "http://127.0.0.1:8000", "http://localhost:8010", "http://127.0.0.1:8010"]
MODULES = Path("/opt/dsportal/oidc/node_modules")
PROGRAM = Path(__file__).resolve().parent / "oidc-provider.mjs"


def secret_path() -> Path:
    return paths().root / "sso" / "client-secret"


def pidfile() -> Path:
    return paths().run / "oidc-provider.pid"


def ensure_sso(config_path: Path) -> None:
    """The provider running with the demo's people (made again when they or the secret changed)."""
    if not (MODULES / "oidc-provider").is_dir():
        say("single sign-on not started: oidc-provider is not installed (make deps)")
        return
    settings = settings_module.load(config_path)
    folder = secret_path().parent
    secret_file(secret_path(), Path(settings.hub.data_dir))
    os.chmod(folder, 0o711)  # the hub's account reaches its secret (0600, its own); provider.json stays root's alone
    data = directory()
    groups = {user["name"]: sorted(g["name"] for g in data["groups"] if user["name"] in g["members"])
              for user in data["users"]}
    people = [{"sub": f"demo-{user['name']}", "username": user["name"], "password": user["password"],
               "email": user.get("mail") or f"{user['name']}@{data['mail_domain']}", "groups": groups[user["name"]]}
              for user in data["users"]]
    config = {"issuer": ISSUER, "listen": {"host": "127.0.0.1", "port": PORT}, "tls": None,
              "clients": [{"client_id": CLIENT, "client_secret": secret_path().read_text().strip(),
                           "redirect_uris": [f"{hub}/hub/oauth_callback" for hub in HUBS],
                           "post_logout_redirect_uris": [f"{hub}/hub/login" for hub in HUBS]}], "users": people}
    text = json.dumps(config, indent=1)
    target = folder / "provider.json"
    changed = not target.exists() or target.read_text() != text
    if changed:
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)  # passwords
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
    if alive(pidfile()) and not changed:
        return
    stop_sso()
    with private_log(paths().log / "oidc-provider.log") as log:  # it names who signed in
        process = subprocess.Popen(["node", str(PROGRAM), str(target)], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "DSPORTAL_OIDC_MODULES": str(MODULES)})
    pidfile().write_text(str(process.pid))
    wait_for(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=1).close() or True, "the OpenID provider")
    say(f"single sign-on (OpenID Connect) for trying oidc: {ISSUER}")


def stop_sso() -> None:
    stop_pid(pidfile(), "the OpenID provider")


def sso_running() -> bool:
    return bool(alive(pidfile()))
