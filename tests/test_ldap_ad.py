"""Logins against Active Directory: Samba's AD domain controller from Debian (democluster/samba_ad.py: samba-tool
domain provision, on a host of its own on the demo's node network, LDAPS with a CA of its own), users in nested
groups, a disabled account, an expired one and one whose password must be changed. The portal logs in as sites
with AD do (docs/how-to/connect-to-your-directory.md): a search as its service account for the sAMAccountName
typed, then a bind as the DN found; groups through AD's LDAP_MATCHING_RULE_IN_CHAIN.

About 10 s: the domain is provisioned afresh (about 5 s), its users made with samba-tool, then samba serves
LDAP and CLDAP only."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from democluster import samba_ad
from democluster.samba_ad import ADDRESS, NESTED, SERVICE, USERS
from portal.admin.check import check_ldap
from portal.core.settings import LdapSettings, SlurmSettings
from portal.hub.auth import PortalAuthenticator, configure_ldap
from spawner import mailaddress

pytestmark = pytest.mark.skipif(not shutil.which("samba-tool"), reason="needs Samba's AD DC (make deps)")

ALLOWED = f"CN=datascience,{USERS}"
PASSWORDS = {"dsportal": "Svc-Pass-1234", "alice": "Alice-Pass-1234", "bob": "Bob-Pass-1234",
             "carol": "Carol-Pass-1234", "dave": "Dave-Pass-1234", "erin": "Erin-Pass-1234"}
GROUPS = {"datascience": ["ml-lab"],  # ml-lab is inside datascience
          "ml-lab": ["alice", "carol", "dave", "erin"], "outsiders": ["bob"]}


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def ad(portal, tmp_path_factory):
    """The domain controller up on the node network: where it is, its CA, the service account's password file."""
    with samba_ad.domain_controller(tmp_path_factory.mktemp("ad"), PASSWORDS, GROUPS, mail=("alice",),
                                    must_change=("dave",), disabled=("carol",), expired=("erin",)) as dc:
        yield dc


def settings(ad, **changes) -> LdapSettings:
    return LdapSettings(**{
        "server_address": ADDRESS, "server_port": 636, "tls_strategy": "on_connect", "ca_file": ad.ca,
        "search_base": USERS, "user_attribute": "sAMAccountName", "search_bind_dn": SERVICE,
        "search_bind_password_file": ad.password_file, "allowed_groups": [ALLOWED], "group_search_filter": NESTED,
        "connect_timeout": 3, "receive_timeout": 3, "login_timeout": 8, **changes})


def login(ldap: LdapSettings, username: str, password: str):
    c = Config()
    configure_ldap(c, SimpleNamespace(ldap=ldap, slurm=SlurmSettings()))
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
    assert login(ldap, "erin", PASSWORDS["erin"]) is None  # in ml-lab, her account expired
    assert login(ldap, "nobody", "Any-Pass-1234") is None
    for name in ("*", "*)(sAMAccountName=*", "alice)(|(cn=*", "alice*", "Alice"):
        assert login(ldap, name, PASSWORDS["alice"]) is None
    said = caplog.text  # the admin reads why (the user only "Invalid username or password")
    assert f"LDAP refused the bind of CN=carol,{USERS}: account disabled (AD data 533)" in said, said[-3000:]
    assert f"LDAP refused the bind of CN=dave,{USERS}: password must be changed (AD data 773)" in said
    assert f"LDAP refused the bind of CN=alice,{USERS}: wrong password (AD data 52e)" in said
    assert f"LDAP refused the bind of CN=erin,{USERS}: account expired (AD data 701)" in said


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
