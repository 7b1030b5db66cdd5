"""A user's session certificate names its user, and is made once and used again while it fits
(spawner/certs.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from certipy import Certipy
from cryptography import x509

from spawner.certs import session_pair, user_host_name

pytestmark = pytest.mark.quick

PROXY_JS = Path(__file__).resolve().parent.parent / "portal/hub/proxy.js"

NODES = ["DNS:node1", "IP:198.51.100.11", "DNS:node2", "IP:198.51.100.12"]


def _store(tmp_path):
    Certipy(store_dir=str(tmp_path)).create_ca("notebooks-ca")
    return str(tmp_path)


def _pair(store, names):
    paths = session_pair(store, "alice", names, "bundle.crt")
    return open(paths["certfile"]).read(), open(paths["keyfile"]).read()


def test_the_same_certificate_serves_the_next_start_while_it_fits(tmp_path):
    store = _store(tmp_path)
    first = _pair(store, NODES)
    assert _pair(store, NODES) == first  # the next start: the same key and certificate
    # Another set of nodes (a node added to the cluster): a new pair that names them.
    other = _pair(store, NODES[:2])
    assert other != first and other[1] != first[1]
    assert _pair(store, NODES[:2]) == other


def test_a_new_notebooks_ca_means_a_new_certificate(tmp_path):
    store = _store(tmp_path)
    first = _pair(store, NODES)
    Certipy(store_dir=store).create_ca("notebooks-ca", overwrite=True)  # the hub's CA made anew
    assert _pair(store, NODES) != first


def _dns_names(cert_pem: str) -> list[str]:
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


def test_a_certificate_names_its_user_and_one_made_before_that_is_made_anew(tmp_path):
    store = _store(tmp_path)
    # alice's certificate as the hub made it before certificates named their user: it still fits
    # everything else (same CA, same nodes, valid for years), so it was used again at each start.
    old = Certipy(store_dir=store).create_signed_pair("user-alice", "notebooks-ca",
                                                      alt_names=["DNS:localhost", "IP:127.0.0.1", *NODES])
    old_pair = open(old["files"]["cert"]).read(), open(old["files"]["key"]).read()
    cert, key = _pair(store, NODES)
    assert (cert, key) != old_pair and key != old_pair[1]  # made anew, with a new key
    assert "alice.users.dsportal.invalid" in _dns_names(cert) and "node1" in _dns_names(cert)
    assert _pair(store, NODES) == (cert, key)  # and from then on used again while it fits


def test_the_proxy_reads_user_names_in_certificates_as_the_hub_writes_them():
    names = ["alice", "bob", "first_last", "a", "x" * 63, "x" * 64, "ab--c", "xx--1", "Alice", "j.doe",
             "-x", "x-", "ünï", "a b", "o'neil"]
    script = ("const {userHostName} = require(process.argv[1]);"
              "console.log(JSON.stringify(JSON.parse(process.argv[2]).map(userHostName)))")
    from_node = subprocess.run(["node", "-e", script, str(PROXY_JS), json.dumps(names)],
                               capture_output=True, text=True, check=True).stdout
    assert json.loads(from_node) == [user_host_name(name) for name in names]
    assert len({user_host_name(name) for name in names}) == len(names)
    assert user_host_name("alice") == "alice.users.dsportal.invalid"


def test_keys_are_p256_and_every_party_takes_them(tmp_path):
    """The session's key and the user's own CA and client keys are EC (P-256: quick to make, where
    Certipy's RSA keys made a class's start cost the hub's CPU dearly); the chains verify, and
    Python's ssl loads them as a session's server and its kernels do."""
    import ssl

    from cryptography.hazmat.primitives.asymmetric import ec

    from spawner.certs import _local_client

    store = _store(tmp_path)
    paths = session_pair(store, "alice", NODES, "bundle.crt")
    local_ca, client_key, client_cert, notebooks_ca = _local_client(store, "alice")
    for key_file, cert_file, ca_file in ((paths["keyfile"], paths["certfile"], notebooks_ca),
                                         (client_key, client_cert, local_ca)):
        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
        verified = subprocess.run(["openssl", "verify", "-CAfile", str(ca_file), str(cert_file)],
                                  capture_output=True, text=True)
        assert verified.returncode == 0, verified.stderr
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert_file), str(key_file))
    ca = x509.load_pem_x509_certificate(Path(local_ca).read_bytes())
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)


def test_the_store_keeps_every_record_when_written_once_per_start(tmp_path):
    """Certipy's store is written once when the lock is let go (not after each step): every user's
    records are in it, a deleted named session's record leaves it, and it is never left half-written
    (written beside it, then moved)."""
    from spawner.certs import _local_client, forget_session, local_record_names

    store = _store(tmp_path)
    for user in ("alice", "bob", "carol"):
        session_pair(store, user, NODES, "bundle.crt")
        _local_client(store, user)
    session_pair(store, "bob", NODES, "bundle.crt", server="train")
    records = json.loads((tmp_path / "certipy.json").read_text())
    for user in ("alice", "bob", "carol"):
        assert {f"user-{user}", *local_record_names(user)} <= set(records)
    assert records["notebooks-ca"]["signees"].keys() >= {"user-alice", "user-bob", "user-carol"}
    assert len(records) == 1 + 3 * 3 + 1
    forget_session(store, "bob", "train")
    assert len(json.loads((tmp_path / "certipy.json").read_text())) == 1 + 3 * 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".certipy.json")]  # no leftover temporaries
    # Certipy itself (as JupyterHub uses it) still reads the store.
    assert Certipy(store_dir=store).store.get_record("user-carol")["parent_ca"] == "notebooks-ca"


def test_a_user_named_after_anothers_records_gets_her_own(tmp_path):
    """A user called ``alice-local-ca`` (or ``-local-client``) starting a session leaves alice's own CA
    and client pair as they were: her records are named by a hash, not ``user-alice-local-ca``."""
    from spawner.certs import _local_client

    store = _store(tmp_path)
    session_pair(store, "alice", NODES, "bundle.crt")
    before = [Path(p).read_bytes() for p in _local_client(store, "alice")[:3]]
    for other in ("alice-local-ca", "alice-local-client"):
        session_pair(store, other, NODES, "bundle.crt")
        _local_client(store, other)
    after = _local_client(store, "alice")
    assert [Path(p).read_bytes() for p in after[:3]] == before
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(after[0]), str(after[2])], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
