"""LDAP login: who gets in, who is refused, and what the login page tells them."""

import json
import pwd
import random
import re
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from requests.adapters import HTTPAdapter

from conftest import CONFIG, HUB, PASSWORDS
from hubclient import HubUser
from spawner.certs import user_records

REFUSAL = "Invalid username or password"


def test_right_password_logs_in(portal):
    response = HubUser(portal, "alice").login(PASSWORDS["alice"])
    assert response.status_code == 302
    assert "/login" not in response.headers["location"]


def test_a_login_binds_without_reading_the_servers_schema(portal):
    """The hub's LDAP connection for a login (hub/upstream.ldap_connection, as PortalAuthenticator
    makes it) against the real slapd: alice's bind and the allowed group's search answer, and none
    of the server's schema is read (ldap3's default read and parsed all of it on every login)."""
    import logging
    from types import SimpleNamespace

    from ldapauthenticator.ldapauthenticator import TlsStrategy

    from portal.core import settings
    from portal.upstream import hub as upstream

    ldap = settings.load(CONFIG).ldap
    hub_side = SimpleNamespace(server_address=ldap.server_address, server_port=ldap.server_port,
                               tls_strategy=TlsStrategy[ldap.tls_strategy], tls_kwargs=ldap.tls_kwargs(),
                               log=logging.getLogger("test"))
    dn = ldap.bind_dn_template[0].format(username="alice")
    conn = upstream.ldap_connection(hub_side, dn, PASSWORDS["alice"], 5, 5)
    assert conn is not None and conn.bound
    assert conn.server.schema is None and conn.server.info is None
    group = ldap.allowed_groups[0]
    assert conn.search(group, "(objectClass=*)", attributes=["member", "memberUid"])
    members = conn.entries[0].entry_attributes_as_dict
    assert dn in members.get("member", []) or "alice" in members.get("memberUid", []), members
    conn.unbind()
    assert upstream.ldap_connection(hub_side, dn, "wrong-password", 5, 5) is None


@pytest.mark.parametrize(
    "name, password",
    [
        ("alice", "wrong-password"),
        ("nosuchuser", "whatever"),
        ("alice", ""),
        ("alice", "   "),
        ("mallory", PASSWORDS["mallory"]),  # a real LDAP account, outside the allowed group
        ("alice)(uid=*", "x"),  # LDAP filter injection
        ("*", "x"),
    ],
    ids=["wrong-password", "unknown-user", "empty-password", "blank-password", "outside-group", "injection", "wildcard"],
)
def test_refused_with_a_message_on_the_login_page(portal, name, password):
    user = HubUser(portal, name)
    response = user.login(password)
    assert response.status_code == 403
    assert REFUSAL in response.text
    # and no session was handed out
    assert user.web.get(f"{portal}/hub/api/user").status_code == 403


# Issue 27: failed logins are throttled (ldap.throttle in config/portal.yaml: 5 free failures per
# account and address, then 5 s doubling up to 60 s; 20 per account from any address lock it for
# 30 s, except from addresses it logged in from before). A neighbour with a shell on the login
# node can connect from any loopback address (127.0.0.N): each is a client address of its own.


class FromAddress(HTTPAdapter):
    def __init__(self, address: str):
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, source_address=(self.address, 0), **kwargs)


def from_address(name: str, address: str) -> HubUser:
    user = HubUser(HUB, name)
    user.web.mount("http://", FromAddress(address))
    return user


def logins_counted(admin) -> dict[str, float]:
    # A hub page: served at the hub's own host (hub.subdomain_host, where set), which a token's
    # request must name itself (requests drops the token on a redirect to another host).
    pages = yaml.safe_load(CONFIG.read_text())["hub"].get("subdomain_host") or HUB
    text = requests.get(f"{pages}/hub/metrics", headers={"Authorization": f"token {admin.token}"}, timeout=30).text
    found = re.findall(r'^dsportal_logins_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    return {outcome: float(value) for outcome, value in found}


def test_a_guesser_waits_longer_after_each_failure_and_ldap_is_not_asked(portal, admin):
    guesser = from_address("alice", f"127.0.0.{random.randint(100, 250)}")
    for attempt in range(5):
        assert guesser.login(f"guess-{attempt}").status_code == 403
    before = logins_counted(admin)
    refused = guesser.login("guess-5")
    assert refused.status_code == 429, refused.status_code
    assert "Too many failed logins for alice; try again in 5 s." in refused.text
    # The right password from that address waits too (else guessing would only be slower to see).
    assert guesser.login(PASSWORDS["alice"]).status_code == 429
    after = logins_counted(admin)
    assert after.get("throttled", 0) - before.get("throttled", 0) == 2
    assert after.get("refused", 0) == before.get("refused", 0), "a throttled attempt reached LDAP"
    # alice, from her own address, is not kept out by it.
    assert HubUser(portal, "alice").login(PASSWORDS["alice"]).status_code == 302


def test_a_neighbour_cannot_lock_alice_out_of_her_usual_address(portal):
    assert HubUser(portal, "alice").login(PASSWORDS["alice"]).status_code == 302  # her usual address
    refused = None
    for attempt in range(25):  # each from an address of its own: the per-account limit must hold
        response = from_address("alice", f"127.0.1.{10 + attempt}").login("wrong")
        if response.status_code == 429:
            refused = response
            break
        assert response.status_code == 403
    assert refused is not None, "25 wrong passwords for alice from 25 addresses were all sent to LDAP"
    wait = int(re.search(r"try again in (\d+) s", refused.text).group(1))
    assert 0 < wait <= 30, refused.text  # a short lock, for addresses alice never used
    assert HubUser(portal, "alice").login(PASSWORDS["alice"]).status_code == 302
    assert HubUser(portal, "bob").login(PASSWORDS["bob"]).status_code == 302


# A session's certificate (its user can read it) opens the hub's own port, where no proxy appends
# the real address to X-Forwarded-For: a neighbour there could name alice's usual address in it,
# fail a few logins and so lock her out of it. Logins come through the proxy only.
FORGED_LOGINS = """
import glob, http.cookiejar, json, os, ssl, sys, urllib.parse, urllib.request
folder = "{folder}"
context = ssl.create_default_context(cafile=folder + "ca.crt") if os.path.exists(folder + "ca.crt") else ssl._create_unverified_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
context.load_cert_chain(folder + "session.crt", folder + "session.key")
jar = http.cookiejar.CookieJar()
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), urllib.request.HTTPCookieProcessor(jar))
forged = {{"X-Forwarded-For": "{address}", "X-Real-Ip": "{address}"}}
opener.open(urllib.request.Request("{hub}/hub/login", headers=forged), timeout=20).read()
xsrf = next(c.value for c in jar if c.name == "_xsrf")
codes = []
for attempt in range(7):
    body = urllib.parse.urlencode({{"username": "alice", "password": "wrong", "_xsrf": xsrf}}).encode()
    try:
        codes.append(opener.open(urllib.request.Request("{hub}/hub/login", data=body, headers=forged), timeout=20).status)
    except urllib.error.HTTPError as error:
        codes.append(error.code)
print(json.dumps(codes))
"""


def test_logins_from_a_sessions_certificate_are_refused_and_lock_nobody_out(portal, admin, bob):
    bob.spawn({"profile": "gpu", "gpus": 1})  # bob has a session certificate of his own now
    hub = yaml.safe_load(CONFIG.read_text())["hub"]["hub_bind_url"].replace("http://", "https://")
    # The folder of the certificate the hub issued him (other folders hold pairs of scratch CAs of other tests).
    store = Path(yaml.safe_load(CONFIG.read_text())["hub"]["data_dir"], "internal-ssl")
    issued = Path(user_records(str(store), "bob")["user-bob"]["files"]["cert"]).read_bytes()
    folder = next(f"{path.parent}/" for path in Path(pwd.getpwnam("bob").pw_dir, ".dsportal/certs").glob("*/session.crt")
                  if path.read_bytes() == issued)
    result = subprocess.run(["runuser", "-u", "bob", "--", "/opt/dsportal/env/bin/python", "-c",
                             FORGED_LOGINS.format(address="127.0.0.1", hub=hub, folder=folder)],
                            capture_output=True, text=True, timeout=120, cwd="/")
    print(f"bob's logins as alice at {hub} with his session certificate, X-Forwarded-For 127.0.0.1: "
          f"{result.stdout.strip()} {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [403] * 7
    # alice, from 127.0.0.1 through the proxy, is not held up by any of it.
    assert HubUser(portal, "alice").login(PASSWORDS["alice"]).status_code == 302
