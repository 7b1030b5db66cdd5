"""With TLS, LDAP's certificate is checked (ldap3 checks none by default): a server whose certificate
no trusted CA signed, or that names another host, gets no password. A real TLS listener on loopback
with a certificate made here; the portal's own connection code (portal.core.ldapconnect, the TLS
arguments the hub's login uses)."""

import socket
import ssl
import subprocess
import threading

import pytest
from ldap3.core.exceptions import LDAPSessionTerminatedByServerError, LDAPSocketOpenError

from portal.core import ldapconnect
from portal.core.settings import LdapSettings
from portal.hub.auth import configure_ldap

pytestmark = pytest.mark.quick


def make_certificate(folder, name: str):
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return key, cert


def tls_listener(key, cert) -> int:
    """A TLS server on a free loopback port that finishes handshakes (and says nothing LDAP)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(20)

    def serve():
        for _ in range(4):  # bounded: one connection per check below
            try:
                connection, _ = listener.accept()
                with context.wrap_socket(connection, server_side=True) as wrapped:
                    wrapped.settimeout(3)
                    try:
                        wrapped.recv(1)
                    except OSError:
                        pass
            except OSError:
                continue
    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def settings(port: int, ca_file=None, host: str = "localhost") -> LdapSettings:
    return LdapSettings(server_address=host, server_port=port, tls_strategy="on_connect", ca_file=ca_file,
                        bind_dn_template=["uid={username},ou=people,dc=x"], connect_timeout=5, receive_timeout=3)


def test_an_untrusted_or_misnamed_ldap_certificate_is_refused_before_any_password(tmp_path):
    key, cert = make_certificate(tmp_path, "localhost")
    port = tls_listener(key, cert)
    with pytest.raises(LDAPSocketOpenError, match="(?i)certificate verify failed|unable to open socket"):
        ldapconnect.open_connection(settings(port))  # the system's CAs never signed it: an impostor
    # Its own CA named: past TLS (the listener, which speaks no LDAP, then hangs up on the first request).
    connection = ldapconnect.open_connection(settings(port, ca_file=cert))
    assert not connection.closed
    with pytest.raises(LDAPSessionTerminatedByServerError):
        connection.bind()
    # Trusted, but for another name: refused too.
    other_key, other_cert = make_certificate(tmp_path, "ldap.example.org")
    other_port = tls_listener(other_key, other_cert)
    with pytest.raises(LDAPSocketOpenError):
        ldapconnect.open_connection(settings(other_port, ca_file=other_cert, host="localhost"))


def test_the_hubs_login_requires_the_certificate():
    class Config(dict):
        def __getattr__(self, name):
            return self.setdefault(name, type("Section", (), {})())

    from conftest import CONFIG
    from portal.core import settings as settings_module

    portal_settings = settings_module.load(CONFIG)
    config = Config()
    configure_ldap(config, portal_settings)
    assert config.LDAPAuthenticator.tls_kwargs["validate"] == ssl.CERT_REQUIRED
