"""A user's session certificate names its user, and is made once and used again while it fits
(spawner/certs.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from certipy import Certipy
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from spawner.certs import record_name, session_pair, user_host_name

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


def test_each_user_has_a_store_of_her_own_and_a_start_leaves_the_hubs_alone(tmp_path):
    """A start reads and writes its user's own records only (spawner/certs.py user_store_dir): the hub's
    store, which JupyterHub keeps, is the same bytes after three users' starts. Each store is written once
    when the lock is let go, never left half-written (written beside it, then moved), and Certipy itself
    (as JupyterHub uses it) still reads it."""
    from spawner.certs import _local_client, forget_session, local_record_names, user_records, user_store_dir

    store = _store(tmp_path)
    hubs = (tmp_path / "certipy.json").read_bytes()
    for user in ("alice", "bob", "carol"):
        session_pair(store, user, NODES, "bundle.crt")
        _local_client(store, user)
    session_pair(store, "bob", NODES, "bundle.crt", server="train")
    assert (tmp_path / "certipy.json").read_bytes() == hubs
    for user in ("alice", "bob", "carol"):
        records = user_records(store, user)
        assert set(records) == {"notebooks-ca", f"user-{user}", *local_record_names(user)} | (
            {record_name("bob", "train")} if user == "bob" else set())
        assert records["notebooks-ca"]["signees"].keys() == {f"user-{user}"} | (
            {record_name("bob", "train")} if user == "bob" else set())
        assert Path(records[f"user-{user}"]["files"]["key"]).is_relative_to(user_store_dir(store, user))
        assert not [p for p in Path(user_store_dir(store, user)).iterdir() if p.name.startswith(".certipy.json")]
        assert oct(Path(user_store_dir(store, user)).stat().st_mode & 0o777) == "0o700"
    forget_session(store, "bob", "train")
    assert record_name("bob", "train") not in user_records(store, "bob")
    assert Certipy(store_dir=user_store_dir(store, "carol")).store.get_record("user-carol")["parent_ca"] == "notebooks-ca"


def test_a_session_made_before_users_had_stores_is_still_known(tmp_path):
    """A session started before the upgrade presents the certificate in the hub's store: the hub's checks
    find it there until her next start makes one in her own, and deleting that named session removes it."""
    from spawner.certs import forget_session, issued_certificate, user_records

    store = _store(tmp_path)
    before = Certipy(store_dir=store)
    old = before.create_signed_pair("user-alice", "notebooks-ca", alt_names=["DNS:localhost", *NODES])
    before.create_signed_pair(record_name("alice", "train"), "notebooks-ca", alt_names=["DNS:localhost"])
    assert issued_certificate(store, "alice") == x509.load_pem_x509_certificate(
        Path(old["files"]["cert"]).read_bytes()).public_bytes(Encoding.DER)
    assert issued_certificate(store, "bob") is None
    _pair(store, NODES)  # her next start: a pair of her own store's, which the checks then pin
    assert issued_certificate(store, "alice") == x509.load_pem_x509_certificate(
        Path(user_records(store, "alice")["user-alice"]["files"]["cert"]).read_bytes()).public_bytes(Encoding.DER)
    session_pair(store, "alice", NODES, "bundle.crt", server="train")  # train started again since: in both
    forget_session(store, "alice", "train")
    assert record_name("alice", "train") not in json.loads((tmp_path / "certipy.json").read_text())
    assert record_name("alice", "train") not in user_records(store, "alice")
    assert not (tmp_path / record_name("alice", "train")).exists()


def test_a_session_waiting_from_before_keeps_its_certificate_and_her_ca(tmp_path):
    """A session queued before the upgrade reads, when it runs, the files delivered at its submission; the
    upgraded hub that takes its job over pins the same certificate (the pair still fits: taken into her store,
    not made anew), and her own CA and client pair stay the ones her sessions hold."""
    from spawner.certs import _local_client, issued_certificate, local_record_names, user_records

    store = _store(tmp_path)
    before = Certipy(store_dir=store)
    names = ["DNS:localhost", "IP:127.0.0.1", f"DNS:{user_host_name('alice')}", *NODES]
    old = before.create_signed_pair("user-alice", "notebooks-ca", alt_names=names)
    ca_name, client_name = local_record_names("alice")
    before.create_ca(ca_name)
    client = before.create_signed_pair(client_name, ca_name, alt_names=["DNS:localhost"])
    pinned = issued_certificate(store, "alice")
    assert session_pair(store, "alice", NODES, "bundle.crt")["certfile"] == old["files"]["cert"]
    assert issued_certificate(store, "alice") == pinned and "user-alice" in user_records(store, "alice")
    assert _local_client(store, "alice")[2] == Path(client["files"]["cert"])
    # Once the nodes change, the next start makes a pair of her own store's.
    made = session_pair(store, "alice", NODES[:2], "bundle.crt")["certfile"]
    assert made != old["files"]["cert"] and Path(old["files"]["cert"]).is_file()
    # A named session's pair taken over from before, then deleted: gone from both stores, its files once.
    from spawner.certs import forget_session

    train = before.create_signed_pair(record_name("alice", "train"), "notebooks-ca", alt_names=names)
    assert session_pair(store, "alice", NODES, "bundle.crt", server="train")["certfile"] == train["files"]["cert"]
    forget_session(store, "alice", "train")
    assert record_name("alice", "train") not in user_records(store, "alice")
    assert record_name("alice", "train") not in json.loads((tmp_path / "certipy.json").read_text())
    assert not Path(train["files"]["cert"]).exists()


def test_deleting_a_session_on_a_hub_without_a_store_makes_none(tmp_path):
    """A hub without internal TLS has no store: deleting a named session leaves the folder as it was."""
    from spawner.certs import forget_session

    forget_session(str(tmp_path), "alice", "train")
    assert list(tmp_path.iterdir()) == []


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
