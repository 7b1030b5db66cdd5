"""Logins against Active Directory: Samba's AD domain controller from Debian (samba-tool domain provision), on a
host of its own on the demo's node network (a network namespace on its bridge, 198.51.100.20), LDAPS with a CA
of its own, users in nested groups, a disabled account and one whose password must be changed. The portal logs
in as sites with AD do (docs/how-to/connect-to-your-directory.md): a search as its service account for the
sAMAccountName typed, then a bind as the DN found; groups through AD's LDAP_MATCHING_RULE_IN_CHAIN.

About 10 s: the domain is provisioned afresh (about 5 s), its users made with samba-tool, then samba serves
LDAP and CLDAP only."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from democluster import network
from portal.admin.check import check_ldap
from portal.core.settings import LdapSettings
from portal.hub.auth import PortalAuthenticator, configure_ldap
from spawner import mailaddress

pytestmark = pytest.mark.skipif(not shutil.which("samba-tool"), reason="needs Samba's AD DC (make deps)")

REALM, DOMAIN = "AD.DSPORTAL.TEST", "DSPTEST"
BASE = "DC=ad,DC=dsportal,DC=test"
USERS = f"CN=Users,{BASE}"
SERVICE = f"CN=dsportal,{USERS}"
ALLOWED = f"CN=datascience,{USERS}"
NESTED = "(member:1.2.840.113556.1.4.1941:={userdn})"
PASSWORDS = {"dsportal": "Svc-Pass-1234", "alice": "Alice-Pass-1234", "bob": "Bob-Pass-1234",
             "carol": "Carol-Pass-1234", "dave": "Dave-Pass-1234"}
NAMESPACE, LINK = "dsportal-adtest", "dsp-adtest"
ADDRESS = f"{network.PREFIX}.20"


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def provision(folder) -> str:
    """A fresh domain in ``folder``: its users and groups, TLS with a CA of its own; smb.conf's path."""
    conf = folder / "dc" / "etc" / "smb.conf"
    run("samba-tool", "domain", "provision", f"--targetdir={folder / 'dc'}", f"--realm={REALM}", f"--domain={DOMAIN}",
        "--server-role=dc", "--dns-backend=NONE", "--use-rfc2307", "--adminpass=Admin-Pass-1234", "--host-name=dc1",
        "--option=bind interfaces only=yes", "--option=interfaces=lo eth0")
    tool = ["samba-tool"]
    with_conf = [f"--configfile={conf}"]
    for name, password in PASSWORDS.items():
        extra = ["--mail-address=alice@ad.dsportal.test"] if name == "alice" else []
        extra += ["--must-change-at-next-login"] if name == "dave" else []
        run(*tool, "user", "add", name, password, *extra, *with_conf)
    run(*tool, "user", "disable", "carol", *with_conf)
    for group in ("datascience", "ml-lab", "outsiders"):
        run(*tool, "group", "add", group, *with_conf)
    run(*tool, "group", "addmembers", "datascience", "ml-lab", *with_conf)  # ml-lab is inside datascience
    run(*tool, "group", "addmembers", "ml-lab", "alice,carol,dave", *with_conf)
    run(*tool, "group", "addmembers", "outsiders", "bob", *with_conf)
    tls = folder / "tls"
    tls.mkdir()
    openssl = ["openssl", "req", "-newkey", "rsa:2048", "-nodes"]
    run(*openssl, "-x509", "-days", "2", "-subj", "/CN=dsportal test AD CA", "-keyout", str(tls / "ca.key"),
        "-out", str(tls / "ca.pem"))
    run(*openssl, "-subj", "/CN=dc1.ad.dsportal.test", "-keyout", str(tls / "key.pem"), "-out", str(tls / "dc.csr"))
    (tls / "ext").write_text(f"subjectAltName=DNS:dc1.ad.dsportal.test,IP:{ADDRESS}\n")
    run("openssl", "x509", "-req", "-in", str(tls / "dc.csr"), "-CA", str(tls / "ca.pem"), "-CAkey", str(tls / "ca.key"),
        "-CAcreateserial", "-days", "2", "-extfile", str(tls / "ext"), "-out", str(tls / "cert.pem"))
    (tls / "key.pem").chmod(0o600)
    text = conf.read_text()
    services = next(line for line in text.splitlines() if line.strip().startswith("server services"))
    conf.write_text(text.replace(services, "\tserver services = ldap, cldap\n\ttls enabled = yes\n"
                                 f"\ttls keyfile = {tls / 'key.pem'}\n\ttls certfile = {tls / 'cert.pem'}\n"
                                 f"\ttls cafile = {tls / 'ca.pem'}")
                    .replace("log file = /var/log/samba/log.%m", f"log file = {folder}/log.%m"))
    return str(conf)


def remove_host() -> None:
    subprocess.run(["ip", "link", "delete", LINK], capture_output=True)
    subprocess.run(["ip", "netns", "delete", NAMESPACE], capture_output=True)


@pytest.fixture(scope="module")
def ad(portal, tmp_path_factory):
    """The domain controller up on the node network: where it is, its CA, the service account's password file."""
    folder = tmp_path_factory.mktemp("ad")
    conf = provision(folder)
    remove_host()  # one an interrupted run left
    run("ip", "netns", "add", NAMESPACE)
    run("ip", "link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NAMESPACE)
    run("ip", "link", "set", LINK, "master", network.BRIDGE, "up")
    run("ip", "-n", NAMESPACE, "addr", "add", f"{ADDRESS}/24", "dev", "eth0")
    run("ip", "-n", NAMESPACE, "link", "set", "lo", "up")
    run("ip", "-n", NAMESPACE, "link", "set", "eth0", "up")
    samba = subprocess.Popen(["nsenter", f"--net=/run/netns/{NAMESPACE}", "samba", "--foreground", "--no-process-group",
                              "-s", conf], stdout=open(folder / "samba.out", "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((ADDRESS, 636), timeout=1).close()
                break
            except OSError:
                assert samba.poll() is None, (folder / "samba.out").read_text()[-2000:]
                assert time.monotonic() < deadline, "samba did not serve LDAPS within 60 s"
                time.sleep(0.5)
        password_file = folder / "search-password"
        password_file.write_text(PASSWORDS["dsportal"])
        password_file.chmod(0o600)
        yield SimpleNamespace(ca=folder / "tls" / "ca.pem", password_file=password_file)
    finally:
        os.killpg(samba.pid, signal.SIGTERM)
        try:
            samba.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(samba.pid, signal.SIGKILL)
        remove_host()


def settings(ad, **changes) -> LdapSettings:
    return LdapSettings(**{
        "server_address": ADDRESS, "server_port": 636, "tls_strategy": "on_connect", "ca_file": ad.ca,
        "search_base": USERS, "user_attribute": "sAMAccountName", "search_bind_dn": SERVICE,
        "search_bind_password_file": ad.password_file, "allowed_groups": [ALLOWED], "group_search_filter": NESTED,
        "connect_timeout": 3, "receive_timeout": 3, "login_timeout": 8, **changes})


def login(ldap: LdapSettings, username: str, password: str):
    c = Config()
    configure_ldap(c, SimpleNamespace(ldap=ldap))
    answer = asyncio.run(PortalAuthenticator(config=c).get_authenticated_user(
        None, {"username": username, "password": password}))
    return answer["name"] if isinstance(answer, dict) else answer


def test_a_member_through_a_nested_group_logs_in_as_her_account_name(ad):
    assert login(settings(ad), "alice", PASSWORDS["alice"]) == "alice"  # in ml-lab, which is in datascience
    # Without AD's in-chain rule only direct members count: alice is none.
    assert login(settings(ad, group_search_filter=""), "alice", PASSWORDS["alice"]) is None


def test_wrong_passwords_outsiders_disabled_and_expired_accounts_and_injections_are_refused(ad, caplog):
    ldap = settings(ad)
    caplog.set_level(logging.INFO)
    assert login(ldap, "alice", "Wrong-Pass-1234") is None
    assert login(ldap, "bob", PASSWORDS["bob"]) is None  # only in outsiders
    assert login(ldap, "carol", PASSWORDS["carol"]) is None  # in ml-lab, disabled
    assert login(ldap, "dave", PASSWORDS["dave"]) is None  # in ml-lab, must change his password first
    assert login(ldap, "nobody", "Any-Pass-1234") is None
    for name in ("*", "*)(sAMAccountName=*", "alice)(|(cn=*", "alice*", "Alice"):
        assert login(ldap, name, PASSWORDS["alice"]) is None
    said = caplog.text  # the admin reads why (the user only "Invalid username or password")
    assert f"LDAP refused the bind of CN=carol,{USERS}: account disabled (AD data 533)" in said, said[-3000:]
    assert f"LDAP refused the bind of CN=dave,{USERS}: password must be changed (AD data 773)" in said
    assert f"LDAP refused the bind of CN=alice,{USERS}: wrong password (AD data 52e)" in said


def test_ldaps_trusts_only_the_sites_ca(ad, tmp_path):
    other = tmp_path / "other-ca.pem"
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=another CA",
        "-keyout", str(tmp_path / "other.key"), "-out", str(other))
    with pytest.raises(web.HTTPError) as refused:  # no password goes to a server the CA did not sign
        login(settings(ad, ca_file=other), "alice", PASSWORDS["alice"])
    assert refused.value.status_code == 503


def test_her_mail_address_and_the_check_read_ad_as_the_service_account(ad):
    ldap = settings(ad)
    assert mailaddress.address_in_directory(ldap, "alice") == "alice@ad.dsportal.test"
    result = check_ldap(SimpleNamespace(ldap=ldap))
    assert result.ok and result.detail == (f"search under {USERS} as {SERVICE} to {ADDRESS}:636 works; "
                                           "1 allowed group(s) found"), result.detail
