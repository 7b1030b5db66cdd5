"""A user's session certificate is made once and used again while it fits (spawner/certs.py)."""

from __future__ import annotations

from certipy import Certipy

from spawner.certs import session_pair

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
