"""An Active Directory domain controller for the tests and the bench: Samba's from Debian (samba-tool domain
provision), on a host of its own on the demo's node network (a network namespace on its bridge, 198.51.100.20),
LDAPS with a CA of its own. tests/test_ldap_ad.py signs people in against it; bench/ad_logins.py a class of them.

    with samba_ad.domain_controller(folder, users, groups) as dc:   # dc.address, dc.ca, dc.password_file
        ...

``users``: {name: password}; ``groups``: {group: [members, groups inside it]}. Provisioning takes about 5 s, each
samba-tool user about 1 s; many users (a class) go in as one LDIF over LDAPS (add_users), a second or two.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from democluster import network

REALM, DOMAIN = "AD.DSPORTAL.TEST", "DSPTEST"
BASE = "DC=ad,DC=dsportal,DC=test"
USERS = f"CN=Users,{BASE}"
SERVICE = f"CN=dsportal,{USERS}"  # the portal's service account: its password is users["dsportal"]
ADMIN_PASSWORD = "Admin-Pass-1234"
NESTED = "(member:1.2.840.113556.1.4.1941:={userdn})"  # AD's LDAP_MATCHING_RULE_IN_CHAIN: groups inside groups
NAMESPACE, LINK = "dsportal-adtest", "dsp-adtest"
ADDRESS = f"{network.PREFIX}.20"
MAIL_DOMAIN = "ad.dsportal.test"


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def provision(folder: Path, users: dict[str, str], groups: dict[str, list[str]], *, mail: tuple[str, ...] = (),
              must_change: tuple[str, ...] = (), disabled: tuple[str, ...] = (), expired: tuple[str, ...] = ()) -> Path:
    """A fresh domain in ``folder``: its users and groups, TLS with a CA of its own; smb.conf's path."""
    conf = folder / "dc" / "etc" / "smb.conf"
    run("samba-tool", "domain", "provision", f"--targetdir={folder / 'dc'}", f"--realm={REALM}", f"--domain={DOMAIN}",
        "--server-role=dc", "--dns-backend=NONE", "--use-rfc2307", f"--adminpass={ADMIN_PASSWORD}", "--host-name=dc1",
        "--option=bind interfaces only=yes", "--option=interfaces=lo eth0")
    with_conf = f"--configfile={conf}"
    for name, password in users.items():
        extra = [f"--mail-address={name}@{MAIL_DOMAIN}"] if name in mail else []
        extra += ["--must-change-at-next-login"] if name in must_change else []
        run("samba-tool", "user", "add", name, password, *extra, with_conf)
    for name in disabled:
        run("samba-tool", "user", "disable", name, with_conf)
    for name in expired:  # the account's own expiry (accountExpires) passed: AD's "account expired" (data 701)
        run("samba-tool", "user", "setexpiry", name, "--days=0", with_conf)
    for group in groups:
        run("samba-tool", "group", "add", group, with_conf)
    for group, members in groups.items():
        if members:
            run("samba-tool", "group", "addmembers", group, ",".join(members), with_conf)
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
    return conf


def remove_host() -> None:
    subprocess.run(["ip", "link", "delete", LINK], capture_output=True)
    subprocess.run(["ip", "netns", "delete", NAMESPACE], capture_output=True)


@contextlib.contextmanager
def domain_controller(folder: Path, users: dict[str, str], groups: dict[str, list[str]], **accounts):
    """The domain controller serving LDAPS on the node network while the block runs (the demo's bridge must be up):
    its address, its CA, and a file (0600) with the service account's password."""
    conf = provision(folder, users, groups, **accounts)
    remove_host()  # one an interrupted run left
    run("ip", "netns", "add", NAMESPACE)
    run("ip", "link", "add", LINK, "type", "veth", "peer", "name", "eth0", "netns", NAMESPACE)
    run("ip", "link", "set", LINK, "master", network.BRIDGE, "up")
    run("ip", "-n", NAMESPACE, "addr", "add", f"{ADDRESS}/24", "dev", "eth0")
    run("ip", "-n", NAMESPACE, "link", "set", "lo", "up")
    run("ip", "-n", NAMESPACE, "link", "set", "eth0", "up")
    samba = subprocess.Popen(["nsenter", f"--net=/run/netns/{NAMESPACE}", "samba", "--foreground", "--no-process-group",
                              "-s", str(conf)], stdout=open(folder / "samba.out", "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((ADDRESS, 636), timeout=1).close()
                break
            except OSError:
                if samba.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("samba did not serve LDAPS within 60 s:\n"
                                       + (folder / "samba.out").read_text()[-2000:]) from None
                time.sleep(0.5)
        password_file = folder / "search-password"
        password_file.write_text(users["dsportal"])
        password_file.chmod(0o600)
        yield SimpleNamespace(address=ADDRESS, ca=folder / "tls" / "ca.pem", password_file=password_file, conf=conf)
    finally:
        os.killpg(samba.pid, signal.SIGTERM)
        try:
            samba.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(samba.pid, signal.SIGKILL)
        remove_host()


def add_users(dc, names: list[str], password: str, group: str) -> None:
    """Many users at once, members of ``group``, as the domain's Administrator over LDAPS (samba-tool takes
    about a second a user): a class."""
    import ldap3  # the portal's environment has it; only this needs it

    server = ldap3.Server(dc.address, 636, use_ssl=True,
                          tls=ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=str(dc.ca)))
    with ldap3.Connection(server, f"CN=Administrator,{USERS}", ADMIN_PASSWORD, auto_bind=True) as connection:
        quoted = f'"{password}"'.encode("utf-16-le")
        for name in names:
            dn = f"CN={name},{USERS}"
            if not connection.add(dn, ["top", "person", "organizationalPerson", "user"],
                                  {"sAMAccountName": name, "userPrincipalName": f"{name}@{MAIL_DOMAIN}",
                                   "unicodePwd": quoted, "userAccountControl": 512}):
                raise RuntimeError(f"adding {name}: {connection.result}")
        group_dn = f"CN={group},{USERS}"
        if not connection.modify(group_dn, {"member": [(ldap3.MODIFY_ADD, [f"CN={n},{USERS}" for n in names])]}):
            raise RuntimeError(f"adding {len(names)} members to {group}: {connection.result}")
