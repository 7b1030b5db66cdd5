"""Issue 27, item 5: a freed port does not become someone else's route.

When bob's session ends, alice can bind his port on that node before the hub drops his route.
Her own session certificate (which she can read in ~/.dsportal/certs) is signed by the same CA
and names the same nodes, so before, the proxy handed her bob's requests, cookies and token
included. Now a session's certificate names its user, and the proxy (portal/hub/proxy.js) and the
hub's checks (portal/hub/routeowner.py) talk to a user's route only if the certificate is that
user's: bob gets a 502 with a message, and alice's listener receives no request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import pwd
import socket
import ssl
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import jupyterhub.user
import pytest
import requests
from certipy import Certipy
from cryptography import x509
from jupyterhub.objects import Server

from conftest import CONFIG
from hubclient import active_jobs
from portal.core import settings
from portal.hub.routeowner import check_sessions_by_their_certificate
from spawner.certs import session_pair, user_host_name

HUB_SETTINGS = settings.load(CONFIG).hub
INTERNAL_SSL = Path(HUB_SETTINGS.data_dir) / "internal-ssl"

# Runs in alice's kernel, as alice, on her node: a TLS listener with HER session certificate that
# writes down every connection and every byte of request it gets, and answers any request.
ALICE_LISTENS = """
import json, socket, ssl, threading
from pathlib import Path
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain({folder!r} + "/session.crt", {folder!r} + "/session.key")
log = Path({log!r})
server = socket.create_server(("0.0.0.0", 0))

def record(**event):
    with log.open("a") as file:
        file.write(json.dumps(event) + "\\n")

def answer(connection):
    record(accepted=True)
    try:
        with context.wrap_socket(connection, server_side=True) as tls:
            tls.settimeout(10)
            request = tls.recv(65536)
            record(request=request.decode("latin-1"))
            if request:
                tls.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 6\\r\\nConnection: close\\r\\n\\r\\ndecoy\\n")
    except (OSError, ValueError) as error:
        record(error=repr(error))

def serve():
    while True:
        connection, _ = server.accept()
        threading.Thread(target=answer, args=(connection,), daemon=True).start()

threading.Thread(target=serve, daemon=True).start()
print(server.getsockname()[1])
"""


def cert_folder(user: str) -> Path:
    """Where spawner/certs.py delivers the demo hub's certificates in the user's home."""
    hub = hashlib.sha256(str(INTERNAL_SSL.resolve()).encode()).hexdigest()[:8]
    return Path(pwd.getpwnam(user).pw_dir) / ".dsportal/certs" / hub


class ProxyAPI:
    """configurable-http-proxy's REST API, as the hub calls it (its token and client certificate)."""

    def __init__(self):
        pid = (Path(HUB_SETTINGS.data_dir) / "proxy.pid").read_text().strip()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        token = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"CONFIGPROXY_AUTH_TOKEN="))
        self.url = urlparse(HUB_SETTINGS.proxy_api_url)._replace(scheme="https").geturl() + "/api/routes"
        # per request: a session's verify= loses to $REQUESTS_CA_BUNDLE
        self.tls = {"cert": (str(INTERNAL_SSL / "hub-internal/hub-internal.crt"),
                             str(INTERNAL_SSL / "hub-internal/hub-internal.key")),
                    "verify": str(INTERNAL_SSL / "hub-ca_trust.crt")}
        self.headers = {"Authorization": f"token {token.decode()}"}

    def route_of(self, user: str) -> tuple[str, dict]:
        routes = requests.get(self.url, headers=self.headers, timeout=10, **self.tls).json()
        return next((spec, data) for spec, data in routes.items() if data.get("user") == user)

    def point(self, spec: str, data: dict, target: str) -> None:
        """The route at ``spec`` (its data as the hub gave it) now leads to ``target``."""
        route = {key: value for key, value in data.items() if key not in ("target", "last_activity")}
        response = requests.post(self.url + spec, headers=self.headers, json={**route, "target": target},
                                 timeout=10, **self.tls)
        assert response.status_code == 201, response.text


def listener_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_route_reaches_its_own_users_session_only(alice, bob):
    alice.spawn({"profile": "gpu", "gpus": 1})
    bob.spawn({"profile": "gpu", "gpus": 1})
    # Each session's certificate names its user, and only that user.
    for user, other in (("alice", "bob"), ("bob", "alice")):
        cert = x509.load_pem_x509_certificate((cert_folder(user) / "session.crt").read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        assert user_host_name(user) in names and user_host_name(other) not in names, names

    # alice, in her own session, listens on her node with her own session certificate.
    node = active_jobs("alice")[0]["nodes"]
    log = Path(pwd.getpwnam("alice").pw_dir) / f"route-identity-{uuid.uuid4().hex[:8]}.log"
    port = int(alice.run_code(ALICE_LISTENS.format(folder=str(cert_folder("alice")), log=str(log)), keep=True))
    decoy = f"https://{node}:{port}"
    proxy = ProxyAPI()
    try:
        # Control: on alice's own route the proxy does reach her listener (and delivers).
        alice_spec, alice_route = proxy.route_of("alice")
        proxy.point(alice_spec, alice_route, decoy)
        try:
            mine = alice.api("GET", "/user/alice/api/status")
        finally:
            proxy.point(alice_spec, alice_route, alice_route["target"])
        print(f"alice's route -> her listener {decoy}: {mine.status_code} {mine.text!r}")
        assert (mine.status_code, mine.text) == (200, "decoy\n")
        assert any("/user/alice/" in event.get("request", "") for event in listener_log(log))
        before = len(listener_log(log))

        # bob's route now leads to alice's listener, as a stale route does once his port is hers.
        bob_spec, bob_route = proxy.route_of("bob")
        proxy.point(bob_spec, bob_route, decoy)
        try:
            with_token = bob.api("GET", "/user/bob/api/status")
            with_cookies = bob.web.get(bob.url("/user/bob/api/contents"), timeout=60)
        finally:
            proxy.point(bob_spec, bob_route, bob_route["target"])
        events = listener_log(log)[before:]
        print(f"bob through the proxy: {with_token.status_code} {with_token.text[:90]!r} / "
              f"{with_cookies.status_code}; alice's listener saw {events}")
        for response in (with_token, with_cookies):
            assert response.status_code == 502 and "not the one this route belongs to" in response.text
            assert "decoy" not in response.text
        # The proxy did connect (TLS), and refused before writing any request: no path, no token, no cookie.
        assert any(event.get("accepted") for event in events), events
        assert not any(event.get("request") for event in events), events
    finally:
        log.unlink(missing_ok=True)

    # bob's own session, on its own route, still answers through the proxy, websockets too.
    assert bob.api("GET", "/user/bob/api/status").status_code == 200
    assert bob.run_code("print(6 * 7)").strip() == "42"


# ---- the hub's own check that a session is up (JupyterHub's User._wait_up), on local listeners

class _Listener:
    """A TLS server on the loopback with one user's session certificate; what it was sent."""

    def __init__(self, certfile: str, keyfile: str):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certfile, keyfile)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            connection, _ = self.server.accept()
            try:
                with self.context.wrap_socket(connection, server_side=True) as tls:
                    tls.settimeout(5)
                    request = tls.recv(65536)
                    self.requests.append(request)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except (OSError, ValueError):
                pass


class _Stand:
    """What User._wait_up uses of a user (this) and of her spawner (``spawner``: server ``server``)."""

    def __init__(self, name: str, store: str, hub_pair: dict, port: int, server: str = ""):
        self.name = name
        self.log = logging.getLogger("dsportal.tests")
        self.settings = {"internal_ssl_key": hub_pair["keyfile"], "internal_ssl_cert": hub_pair["certfile"],
                         "internal_ssl_ca": hub_pair["cafile"]}
        prefix = f"/user/{name}/" + (f"{server}/" if server else "")
        self.spawner = SimpleNamespace(name=server, internal_certs_location=store, http_timeout=3,
                                       server=Server(proto="https", ip="127.0.0.1", port=port, base_url=prefix))
        self.stopped = False

    async def stop(self, _server_name):
        self.stopped = True


@pytest.fixture
def sessions_store(tmp_path):
    """A hub's store: notebooks-ca, alice's and bob's session certificates, the hub's own pair."""
    store = Certipy(store_dir=str(tmp_path))
    store.create_ca("notebooks-ca")
    hub = store.create_signed_pair("hub", "notebooks-ca", alt_names=["DNS:localhost"])["files"]
    pairs = {user: session_pair(str(tmp_path), user, [], hub["ca"]) for user in ("alice", "bob")}
    pairs["bob/train"] = session_pair(str(tmp_path), "bob", [], hub["ca"], "train")  # a named session of his
    return str(tmp_path), {"keyfile": hub["key"], "certfile": hub["cert"], "cafile": hub["ca"]}, pairs


def test_the_hub_takes_only_the_users_own_session_for_up(sessions_store):
    check_sessions_by_their_certificate()
    store, hub_pair, pairs = sessions_store
    alice_listens = _Listener(pairs["alice"]["certfile"], pairs["alice"]["keyfile"])
    bob_listens = _Listener(pairs["bob"]["certfile"], pairs["bob"]["keyfile"])

    train_listens = _Listener(pairs["bob/train"]["certfile"], pairs["bob/train"]["keyfile"])

    async def wait_up(user, port, server=""):
        stand = _Stand(user, store, hub_pair, port, server)
        try:
            await jupyterhub.user.User._wait_up(stand, stand.spawner)
            return "up"
        except TimeoutError:
            return "stopped" if stand.stopped else "timeout"

    async def all_of_them():
        return (await wait_up("bob", bob_listens.port), await wait_up("bob", alice_listens.port),
                await wait_up("bob", train_listens.port, "train"), await wait_up("bob", bob_listens.port, "train"))

    # bob's session at his address: up. alice's server at bob's address: never up, and the hub's
    # request never reaches her (the handshake fails first); the hub stops bob's server. Each of his
    # sessions is pinned to its own certificate: his named session is up at its own server only.
    at_his, at_hers, train_at_train, train_at_default = asyncio.run(all_of_them())
    assert at_his == "up" and b"GET /user/bob/api" in bob_listens.requests[0]
    assert at_hers == "stopped"
    assert not any(alice_listens.requests), alice_listens.requests
    assert train_at_train == "up" and b"GET /user/bob/train/api" in train_listens.requests[0]
    assert train_at_default == "stopped" and len(bob_listens.requests) == 1
