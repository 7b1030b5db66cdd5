"""The hub reads the system's CAs from OpenSSL's hashed folder, not its bundle (portal/hub/trust.py): the same
authorities trusted, and nothing changed where the folder would trust fewer or the site chose its own."""

from __future__ import annotations

import datetime
import os
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from portal.hub import trust

pytestmark = pytest.mark.quick

PATHS = ssl.get_default_verify_paths()


def _certificate(name: str, key, issuer=None, issuer_key=None, ca: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer.subject if issuer else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(thing) -> bytes:
    if isinstance(thing, x509.Certificate):
        return thing.public_bytes(serialization.Encoding.PEM)
    return thing.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@pytest.fixture
def site(tmp_path):
    """A system's CAs as Debian keeps them: a bundle of one CA and a folder with it under its hash; and a
    server's key and certificate from that CA."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("a site's root CA", ca_key, ca=True)
    folder = tmp_path / "certs"
    folder.mkdir()
    (folder / "site-root.pem").write_bytes(_pem(ca))
    (tmp_path / "bundle.crt").write_bytes(_pem(ca))
    subject_hash = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(folder / "site-root.pem")],
                                  capture_output=True, text=True, check=True).stdout.strip()
    (folder / f"{subject_hash}.0").symlink_to("site-root.pem")
    (tmp_path / "server.key").write_bytes(_pem(server_key))
    (tmp_path / "server.crt").write_bytes(_pem(_certificate("localhost", server_key, ca, ca_key)))
    return tmp_path


CLIENT = textwrap.dedent("""
    import socket, ssl, sys, threading
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(sys.argv[1], sys.argv[2])
    listener = socket.create_server(("127.0.0.1", 0))
    def serve():
        connection, _ = listener.accept()
        try:
            server.wrap_socket(connection, server_side=True).close()
        except (ssl.SSLError, OSError):
            connection.close()
    threading.Thread(target=serve, daemon=True).start()
    client = ssl.create_default_context()  # the system's CAs, as the hub's contexts load them
    with socket.create_connection(listener.getsockname()) as raw:
        try:
            client.wrap_socket(raw, server_hostname="localhost").close()
            print("verified")
        except ssl.SSLCertVerificationError as error:
            print("refused:", error.verify_message)
""")


def _connect(site: Path, environ: dict) -> str:
    """A TLS client with the system's default CAs, in a Python with ``environ``, to a server whose
    certificate the site's CA signed: what it says."""
    return subprocess.run([sys.executable, "-c", CLIENT, str(site / "server.crt"), str(site / "server.key")],
                          env=environ, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_the_hashed_folder_trusts_what_the_bundle_trusts(site):
    environ = {"PATH": os.environ["PATH"]}
    said = trust.use_hashed_folder(environ, bundle=str(site / "bundle.crt"), folder=str(site / "certs"))
    assert environ == {"PATH": os.environ["PATH"], PATHS.openssl_cafile_env: "/dev/null",
                       PATHS.openssl_capath_env: str(site / "certs")}
    assert "each read when a chain needs it" in said
    assert _connect(site, environ) == "verified"
    # The folder alone does it: without it, nothing is trusted.
    assert _connect(site, {**environ, PATHS.openssl_capath_env: str(site)}).startswith("refused")


def test_a_folder_that_would_trust_fewer_keeps_the_bundle(site):
    (site / "certs" / next(p.name for p in (site / "certs").iterdir() if p.is_symlink())).unlink()
    environ: dict = {}
    said = trust.use_hashed_folder(environ, bundle=str(site / "bundle.crt"), folder=str(site / "certs"))
    assert environ == {} and "bundle.crt (1 certificates" in said


def test_the_sites_own_choice_is_kept(site):
    environ = {PATHS.openssl_cafile_env: "/etc/site/ca.pem"}
    trust.use_hashed_folder(environ, bundle=str(site / "bundle.crt"), folder=str(site / "certs"))
    assert environ == {PATHS.openssl_cafile_env: "/etc/site/ca.pem"}


def test_this_systems_folder_holds_its_bundle():
    """Debian's ca-certificates keeps both: the hub here reads the folder."""
    environ: dict = {}
    trust.use_hashed_folder(environ)
    assert environ.get(PATHS.openssl_cafile_env) == "/dev/null"
    assert trust.hashed_certificates(environ[PATHS.openssl_capath_env]) >= trust.bundle_certificates(PATHS.openssl_cafile) > 100
