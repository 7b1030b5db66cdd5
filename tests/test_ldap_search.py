"""Logins that search for the user's entry as a service account (ldap.search_base, search_bind_dn, its password
in a file), as Active Directory and FreeIPA sites log in, and failover to a second server (ldap.failover_servers).

Against a real slapd of the test's own (Debian's, as the demo's), on a free loopback port, whose directory lets
nobody search anonymously: users' entries sit where no bind DN template can guess them (ou=staff), only the
service account reads them, and members read the groups. The portal's own code does the rest: the hub's
authenticator as portal/hub/auth.py configures it, the e-mail look-up of the spawner, and `dsportal check`."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from democluster.people import ssha
from hubclient import free_port
from portal.admin.check import check_ldap
from portal.core.settings import LdapSettings, SettingsError, SlurmSettings
from portal.hub.auth import MISCONFIGURED, PortalAuthenticator, configure_ldap
from spawner import mailaddress

BASE = "dc=site,dc=test"
SERVICE = f"cn=dsportal,ou=services,{BASE}"
GROUP = f"cn=datascience,ou=groups,{BASE}"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", SERVICE: "service-secret", "portalsvc": "svc-in-staff",
             "\uff44\uff41\uff56\uff45": "look-alike"}  # the last: "dave" in full-width letters

pytestmark = pytest.mark.skipif(not shutil.which("slapd", path="/usr/sbin:/usr/bin"), reason="needs slapd (make deps)")

CONFIG = f"""dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: {{state}}/slapd.pid
olcLogLevel: none

dn: cn=module{{{{0}}}},cn=config
objectClass: olcModuleList
cn: module{{{{0}}}}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file:///etc/ldap/schema/core.ldif
include: file:///etc/ldap/schema/cosine.ldif
include: file:///etc/ldap/schema/nis.ldif
include: file:///etc/ldap/schema/inetorgperson.ldif

dn: olcDatabase={{{{-1}}}}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {{{{-1}}}}frontend

dn: olcDatabase={{{{0}}}}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {{{{0}}}}config
olcAccess: {{{{0}}}}to * by * none

dn: olcDatabase={{{{1}}}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{{{1}}}}mdb
olcSuffix: {BASE}
olcDbDirectory: {{state}}/data
olcAccess: {{{{0}}}}to attrs=userPassword by self write by anonymous auth by * none
olcAccess: {{{{1}}}}to dn.subtree="ou=groups,{BASE}" by users read by * none
olcAccess: {{{{2}}}}to * by dn.exact="{SERVICE}" read by dn.exact="uid=portalsvc,ou=staff,{BASE}" read by self read by * none
"""


def directory() -> str:
    entries = [f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\no: site\ndc: site"]
    for unit in ("staff", "services", "groups"):
        entries.append(f"dn: ou={unit},{BASE}\nobjectClass: organizationalUnit\nou: {unit}")
    # a second service account, among the users (as on many AD sites), may read them too
    entries.append(f"dn: {SERVICE}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
                   f"cn: dsportal\nuserPassword: {ssha(PASSWORDS[SERVICE])}")
    for uid, name in ((2001, "alice"), (2002, "bob"), (2003, "portalsvc"), (2004, "\uff44\uff41\uff56\uff45")):
        entries.append(f"dn: uid={name},ou=staff,{BASE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
                       f"uid: {name}\ncn: {name.title()} Example\nsn: Example\nuidNumber: {uid}\ngidNumber: {uid}\n"
                       f"homeDirectory: /home/{name}\nmail: {name}@site.test\nuserPassword: {ssha(PASSWORDS[name])}")
    entries.append(f"dn: {GROUP}\nobjectClass: groupOfNames\ncn: datascience\nmember: uid=alice,ou=staff,{BASE}\n"
                   f"member: uid=portalsvc,ou=staff,{BASE}\nmember: uid=\uff44\uff41\uff56\uff45,ou=staff,{BASE}")
    return "\n\n".join(entries) + "\n"


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    """A slapd of its own on a free loopback port: its port; stopped at the end."""
    state = tmp_path_factory.mktemp("slapd")
    (state / "slapd.d").mkdir()
    (state / "data").mkdir()
    (state / "config.ldif").write_text(CONFIG.format(state=state))
    (state / "directory.ldif").write_text(directory())
    for number, ldif in ((0, "config.ldif"), (1, "directory.ldif")):
        subprocess.run(["slapadd", "-n", str(number), "-F", str(state / "slapd.d"), "-l", str(state / ldif)],
                       check=True, capture_output=True)
    port = free_port()
    subprocess.run(["/usr/sbin/slapd", "-h", f"ldap://127.0.0.1:{port}/", "-F", str(state / "slapd.d")], check=True)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "slapd did not start"
            time.sleep(0.2)
    yield port
    pid = int((state / "slapd.pid").read_text())
    os.kill(pid, 15)


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "ldap-search-password"
    path.write_text(PASSWORDS[SERVICE] + "\n")
    path.chmod(0o600)
    return path


def search_settings(port: int, password_file, **changes) -> LdapSettings:
    return LdapSettings(**{
        "server_address": "127.0.0.1", "server_port": port, "tls_strategy": "insecure",
        "search_base": f"ou=staff,{BASE}", "user_attribute": "uid", "search_bind_dn": SERVICE,
        "search_bind_password_file": password_file, "allowed_groups": [GROUP], "connect_timeout": 3,
        "receive_timeout": 3, "login_timeout": 8, **changes})


def authenticator(ldap: LdapSettings) -> PortalAuthenticator:
    c = Config()
    configure_ldap(c, SimpleNamespace(ldap=ldap, slurm=SlurmSettings()))
    return PortalAuthenticator(config=c)


def login(ldap: LdapSettings, username: str, password: str):
    """JupyterHub's whole check of a login (Authenticator.get_authenticated_user: authenticate, then the
    allowed groups), as the login page asks it."""
    return asyncio.run(authenticator(ldap).get_authenticated_user(None, {"username": username, "password": password}))


def name_of(answer) -> str | None:
    return answer["name"] if isinstance(answer, dict) else answer


def test_a_login_finds_her_entry_as_the_service_account_and_binds_as_it(slapd, password_file):
    ldap = search_settings(slapd, password_file)
    assert name_of(login(ldap, "alice", PASSWORDS["alice"])) == "alice"
    assert login(ldap, "alice", "wrong") is None
    assert login(ldap, "bob", PASSWORDS["bob"]) is None  # not in the allowed group
    assert login(ldap, "nobody", "x") is None
    # Filter injection: refused before LDAP is asked (account names are Unix names), never matching alice.
    for name in ("*", "*)(uid=*", "alice)(|(uid=*", "alice*"):
        assert login(ldap, name, PASSWORDS["alice"]) is None
    # The directory lets nobody search anonymously: the bind DN template way finds nothing here.
    direct = LdapSettings(server_address="127.0.0.1", server_port=slapd, tls_strategy="insecure",
                          bind_dn_template=[f"uid={{username}},ou=people,{BASE}"], allowed_groups=[GROUP])
    assert login(direct, "alice", PASSWORDS["alice"]) is None


def test_a_refused_service_account_is_said_to_be_the_portals_fault_not_hers(slapd, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    wrong.chmod(0o600)
    with pytest.raises(web.HTTPError) as refused:
        login(search_settings(slapd, wrong), "alice", PASSWORDS["alice"])
    assert refused.value.status_code == 503 and refused.value.log_message == MISCONFIGURED
    result = check_ldap(SimpleNamespace(ldap=search_settings(slapd, wrong)))
    assert not result.ok and f"bind as {SERVICE} to 127.0.0.1:{slapd} refused" in result.detail, result.detail


def test_the_password_file_must_be_the_hub_accounts_alone(slapd, password_file):
    password_file.chmod(0o644)
    with pytest.raises(SettingsError, match=r"may be read by other accounts \(mode 0644\)"):
        authenticator(search_settings(slapd, password_file))
    with pytest.raises(ValueError, match="search_bind_dn needs search_bind_password_file"):
        LdapSettings(search_base=BASE, search_bind_dn=SERVICE)
    with pytest.raises(ValueError, match="set bind_dn_template .* or search_base"):
        LdapSettings()


def test_a_login_fails_over_to_the_next_server_when_the_first_does_not_answer(slapd, password_file):
    closed = free_port()  # nothing listens there: refused at once
    ldap = search_settings(slapd, password_file, server_port=closed, failover_servers=[f"127.0.0.1:{slapd}"])
    started = time.monotonic()
    assert name_of(login(ldap, "alice", PASSWORDS["alice"])) == "alice"
    assert time.monotonic() - started < 5
    assert mailaddress.address_in_directory(ldap, "alice") == "alice@site.test"
    result = check_ldap(SimpleNamespace(ldap=ldap))
    assert result.ok and f"127.0.0.1:{closed}, 127.0.0.1:{slapd}" in result.detail, result.detail


def test_her_mail_address_and_the_check_use_the_service_account(slapd, password_file):
    ldap = search_settings(slapd, password_file)
    assert mailaddress.address_in_directory(ldap, "alice") == "alice@site.test"
    assert mailaddress.address_in_directory(ldap, "nobody") is None
    result = check_ldap(SimpleNamespace(ldap=ldap))
    assert result.ok and result.detail == (f"search under ou=staff,{BASE} as {SERVICE} to 127.0.0.1:{slapd} works; "
                                           "1 allowed group(s) found"), result.detail


def test_the_search_account_among_the_users_and_look_alike_names_log_nobody_in(slapd, tmp_path):
    """The service account's own name typed at the login page is refused as a wrong password is (counted by the
    throttle, never the 'portal's own account' 503 that would tell a guesser whether the guess was right); an
    entry whose name only matches the one typed (full-width letters, which OpenLDAP's uid matching folds) is
    not the account typed: her sessions would run as that name."""
    password_file = tmp_path / "svc"
    password_file.write_text(PASSWORDS["portalsvc"])
    password_file.chmod(0o600)
    ldap = search_settings(slapd, password_file, search_bind_dn=f"uid=portalsvc,ou=staff,{BASE}")
    assert name_of(login(ldap, "alice", PASSWORDS["alice"])) == "alice"
    assert login(ldap, "portalsvc", "a guess") is None  # a wrong guess: no 503 that tells it apart
    assert login(ldap, "portalsvc", PASSWORDS["portalsvc"]) is None  # nor does the right one log in
    assert login(ldap, "dave", PASSWORDS["\uff44\uff41\uff56\uff45"]) is None


def test_no_referral_is_followed_and_failover_servers_are_parsed():
    from portal.core import ldapconnect
    from portal.hub.auth import ldap_server

    server = ldapconnect.new_server("127.0.0.1", 389, False, {}, 3)
    assert server.allowed_referral_hosts == []
    assert ldap_server("[2001:db8::5]:636", 389) == ("2001:db8::5", 636)
    assert ldap_server("[2001:db8::5]", 389) == ("2001:db8::5", 389)
    assert ldap_server("ldap2.example.org:3269", 389) == ("ldap2.example.org", 3269)
    ldap = LdapSettings(search_base=BASE, failover_servers=["[2001:db8::5]:636", "b.example.org", "c:3269"])
    assert ldap.servers()[1:] == [("2001:db8::5", 636), ("b.example.org", 389), ("c", 3269)]
    with pytest.raises(ValueError, match="not both"):
        LdapSettings(search_base=BASE, bind_dn_template=["uid={username},ou=x"])
    with pytest.raises(ValueError, match="is not host, host:port"):
        LdapSettings(search_base=BASE, failover_servers=["ldap://x"])
