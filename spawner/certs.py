"""TLS certificates of a session on a compute node (JupyterHub's internal_ssl, portal.yaml
``hub.internal_ssl``).

The hub makes each session a key and certificate, signed by JupyterHub's sessions' CA, in the hub's
store (its data folder, readable by the hub only): in a store of the user's own within it
(:func:`user_store_dir`), not in JupyterHub's one store of every record. A session runs on another
host, as its user, so :func:`prepare` hands them to the mediator, which writes them into the user's
``~/.dsportal/certs/<hub>/`` (folder 0700, files 0600, written *as the user*: a link the user planted
cannot make root overwrite anything). Nobody else can read a session's key.

The hub and its proxy connect to ``https://<node>:<port>``, so a session's certificate names
every compute node (:func:`node_alt_names`): the node is known only once Slurm has placed the
job, after the certificate was made. It also names its user (:func:`user_host_name`,
``DNS:<user>.users.dsportal.invalid``): when a session ends, another user may bind its port before
the hub drops the route, and her own certificate names the node too. The proxy
(portal/hub/proxy.js) and the hub's checks (portal/hub/routeowner.py) talk to a user's route only
when the certificate names that user.

A session's server asks its clients for a certificate of the hub's or the proxy's. The kernels
of the session call their own server too (``%tensorboard``): each user has a CA of their own in
the hub's store, and a client certificate from it (``local-client``) that only that user's
sessions accept.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import ipaddress
import json
import os
import pwd
import re
import stat
import threading
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from certipy import Certipy, CertNotFoundError
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from portal.slurm.slurmclient import Slurm, SlurmError

FOLDER = ".dsportal/certs"
# Certipy keeps its store in one JSON file that each new certificate rewrites: one at a time. The
# keys are made before, outside it (see _Store).
_STORE = threading.Lock()
KEY_BITS = 2048  # what Certipy asks create_key_pair for (its RSA default); answered with an EC key


def _new_key():
    """An EC key (P-256) for a user's CA, client or session: cheap to make, where Certipy's own
    RSA-2048 keys are costly, and the hub makes three for every student it has not served before
    (a CA, a client and a session key), on its own CPU, while a whole class may be starting.
    Python's ssl, Tornado and the proxy (Node) take P-256 keys as they take RSA ones, and the
    TLS handshakes they sign are cheaper too."""
    return ec.generate_private_key(ec.SECP256R1())


class _Store(Certipy):
    """Certipy, signing with keys made beforehand (outside the store's lock, which is held only to
    sign and rewrite the store), and EC keys instead of its RSA ones (:func:`_new_key`). Use it
    through :func:`_store`.

    Two more of Certipy's costs are left out: it rewrote its whole store (one JSON file, indented, a
    record per certificate and every signee under its CA) after each step, 5 times per new user; here it
    is written once, when the lock is let go (:meth:`write`). And it read and checked its CA's RSA key from disk for every
    signature; here a key or certificate is parsed once while its file's bytes stay the same
    (:func:`_cached_load`)."""

    def __init__(self, keys=(), **kwargs):
        super().__init__(**kwargs)
        self._keys = list(keys)
        self._changed = False
        self.store.save = self._note_change
        get_files = self.store.get_files
        self.store.get_files = lambda name: _cached_loads(get_files(name))

    def _note_change(self) -> None:
        self._changed = True

    def create_key_pair(self, cert_type, bits):
        if self._keys and bits == KEY_BITS:
            return self._keys.pop()
        return super().create_key_pair(cert_type, bits)

    def write(self) -> None:
        """The store's file, if a step changed it: written whole (compact JSON) beside it, then moved
        over it, so that a hub killed while writing leaves the last store, not half of one."""
        if not self._changed:
            return
        path = Path(self.store.store_file_path)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        with open(temporary, "w") as written:  # on disk before it replaces the store: a power cut leaves one whole
            written.write(json.dumps(self.store.store))
            written.flush()
            os.fsync(written.fileno())
        if path.exists():
            os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        os.replace(temporary, path)
        self._changed = False


SESSIONS_CA = "notebooks-ca"  # JupyterHub's CA of the sessions' certificates, in the hub's own store
USERS_FOLDER = "users"  # below the hub's store: each user's own store


def user_store_dir(store_dir: str, user: str) -> str:
    """The store of ``user``'s own records (her CA, client pair and session pairs): a folder of the hub's
    store named by a hash of her name. Certipy keeps a store in one JSON file that it reads whole and
    writes whole; with every user's records in the hub's one store, each start read and wrote the records
    of everybody who had ever started (3.4 MB and about 85 ms of the hub's CPU per start with 2,000 users,
    growing with each new one). Her own store holds her few records, and a record of the sessions' CA."""
    return str(Path(store_dir) / USERS_FOLDER / hashlib.sha256(user.encode()).hexdigest()[:32])


_HUB_STORE: dict[str, tuple[tuple, dict]] = {}  # store folder -> (its file's inode, mtime, size; its records)


def hub_records(store_dir: str) -> dict:
    """The hub's own store (JupyterHub's CAs and pairs, and the records of users from before each had a store
    of her own), read again only when its file changed: JupyterHub writes it as the hub starts."""
    path = Path(store_dir) / "certipy.json"
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}
    stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
    cached = _HUB_STORE.get(store_dir)
    if cached is None or cached[0] != stamp:
        cached = _HUB_STORE[store_dir] = (stamp, json.loads(path.read_text()))
    return cached[1]


@contextmanager
def _store(store_dir: str, user: str, keys=()):
    """``user``'s certificate store, its lock held, its file written at the end; it knows the sessions' CA
    as the hub's store has it now (a CA made anew is a new record there)."""
    with _STORE:
        store = _Store(keys, store_dir=user_store_dir(store_dir, user))
        Path(store.store.containing_dir).chmod(0o700)
        sessions_ca = hub_records(store_dir).get(SESSIONS_CA)
        if sessions_ca is None:
            raise CertNotFoundError(f"no {SESSIONS_CA} in the hub's store {store_dir}")
        if store.store.store.get(SESSIONS_CA, {}).get("files") != sessions_ca["files"]:
            store.store.add_record(SESSIONS_CA, is_ca=True, files=sessions_ca["files"], overwrite=True)
        yield store
        store.write()


def _from_before(store: Certipy, store_dir: str, name: str) -> dict | None:
    """Her record ``name`` from the hub's store, made before she had a store of her own, taken into hers as it
    is (its files stay where they are): a session that waits in the queue or runs with it keeps its certificate,
    which the hub's checks pin, and her own CA stays the one her sessions trust. None where there is none."""
    before = hub_records(store_dir).get(name)
    if before is None:
        return None
    store.store.add_record(name, record=copy.deepcopy(before))
    return store.store.get_record(name)


def user_records(store_dir: str, user: str) -> dict:
    """Every record of ``user``'s own store (name -> Certipy's record); {} before her first start."""
    with _STORE:
        try:
            return json.loads((Path(user_store_dir(store_dir, user)) / "certipy.json").read_text())
        except FileNotFoundError:
            return {}


_LOADED: dict[tuple, object] = {}  # (path, SHA-256 of its bytes) -> the key or certificate read from it
_LOADED_MOST = 512


def _cached_loads(bundle):
    """``bundle``'s files (a Certipy TLSFileBundle), each parsed once while its bytes stay the same."""
    for kind in ("key", "cert", "ca"):
        tls_file = getattr(bundle, kind, None)
        if tls_file is not None:
            tls_file.load = partial(_cached_load, tls_file, tls_file.load)
    return bundle


def _cached_load(tls_file, load):
    key = (tls_file.file_path, hashlib.sha256(Path(tls_file.file_path).read_bytes()).digest())
    loaded = _LOADED.get(key)
    if loaded is None:
        if len(_LOADED) >= _LOADED_MOST:
            _LOADED.clear()
        loaded = _LOADED[key] = load()
    tls_file.x509 = loaded
    return loaded


def _alt_name(name: str) -> str:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return f"DNS:{name}"
    return f"IP:{name}"


USERS_DOMAIN = "users.dsportal.invalid"  # .invalid: never a real host's name (RFC 2606)
_PLAIN_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


def user_host_name(user: str) -> str:
    """The name in a session certificate that says whose session it is: ``<user>.users.dsportal.invalid``.
    A user name that is not a plain DNS label (capitals, dots, other characters, or '--' where
    punycode puts it) is written ``xx--<SHA-256 of the name, 56 hex digits>``, so that no two users
    share a name. portal/hub/proxy.js computes the same (userHostName)."""
    if _PLAIN_LABEL.fullmatch(user) and user[2:4] != "--":
        return f"{user}.{USERS_DOMAIN}"
    return f"xx--{hashlib.sha256(user.encode()).hexdigest()[:56]}.{USERS_DOMAIN}"


NODES_MAX_AGE = 300.0  # nodes come and go rarely: a start does not wait for a fresh sinfo


async def node_alt_names(slurm: Slurm) -> list[str]:
    """DNS:<node> and its address for every node Slurm knows (the hub's shared sinfo). With
    slurmctld down, the last list: the start then fails at sbatch with the scheduler's message."""
    try:
        nodes = await slurm.nodes(max_age=NODES_MAX_AGE)
    except SlurmError:
        nodes = slurm.last_nodes
    names = []
    for node in nodes:
        names += [_alt_name(node.name)] + ([_alt_name(node.address)] if node.address != node.name else [])
    return sorted(set(names))


REUSE_MIN_VALIDITY = timedelta(days=7)  # a certificate this close to its end is made anew


def _still_fits(record: dict, names: list[str]) -> bool:
    """The user's last session certificate fits this start: signed by today's notebooks CA, for
    exactly ``names`` (the user's own name among them: a certificate made before certificates
    named their user does not fit, and is made anew), valid for another week, its key still in
    the store."""
    try:
        cert = x509.load_pem_x509_certificate(Path(record["files"]["cert"]).read_bytes())
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(Path(record["files"]["ca"]).read_bytes()))
        if not Path(record["files"]["key"]).is_file():
            return False
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, KeyError, TypeError, ValueError, InvalidSignature, x509.ExtensionNotFound):
        return False
    named = {f"DNS:{name}" for name in san.get_values_for_type(x509.DNSName)}
    named |= {f"IP:{address}" for address in san.get_values_for_type(x509.IPAddress)}
    return named == set(names) and cert.not_valid_after_utc - datetime.now(UTC) > REUSE_MIN_VALIDITY


def record_name(user: str, server: str = "") -> str:
    """The hub's store record of a session's key and certificate: ``user-<user>`` for her default
    session (as before named sessions), one per named session beside it. Each session has its own: a
    pair made anew for one (a node added) must not change the one another session of hers presents,
    which the hub's checks pin (portal/hub/routeowner.py). The hash keeps user and server names apart
    (``bob`` + ``x`` never meets a user called ``bob-x``)."""
    if not server:
        return f"user-{user}"
    digest = hashlib.sha256("\n".join((user, server)).encode()).hexdigest()
    return f"session-{digest[:32]}"


def session_pair(store_dir: str, user: str, alt_names: list[str], trust_bundle: str, server: str = "") -> dict:
    """What JupyterHub's Spawner.create_certs makes (a key and certificate from notebooks-ca, for
    localhost and ``alt_names``, plus the user's own name), made here so that the hub can make it off its event loop. The
    user's pair from their last start is used again while it fits (:func:`_still_fits`): a new one
    costs the hub's CPU, which the start waits for and a class starting together pays once per
    student."""
    names = ["DNS:localhost", "IP:127.0.0.1", f"DNS:{user_host_name(user)}", *alt_names]
    name = record_name(user, server)
    key = None
    while True:
        with _store(store_dir, user, [key] if key else []) as store:
            try:
                record = store.store.get_record(name)
            except CertNotFoundError:
                record = _from_before(store, store_dir, name)
            if record is not None and record.get("parent_ca") == SESSIONS_CA and _still_fits(record, names):
                break
            if record is not None and not Path(record["files"]["cert"]).is_relative_to(store.store.containing_dir):
                store.store.store.pop(name)  # one from before that no longer fits: its files left, never written over
            if key is not None:
                record = store.create_signed_pair(name, SESSIONS_CA, alt_names=names, overwrite=True)
                break
        key = _new_key()  # outside the lock: then looked at again, and signed
    return {"keyfile": record["files"]["key"], "certfile": record["files"]["cert"], "cafile": trust_bundle}


def forget_session(store_dir: str, user: str, server: str) -> None:
    """Remove a deleted named session's key and certificate from her store, and from the hub's where it was
    made before she had one (none: nothing to do; nothing is made to be deleted from)."""
    if not store_dir or not server:
        return
    name = record_name(user, server)
    hers = user_store_dir(store_dir, user)
    for folder in (hers, store_dir):
        if not (Path(folder) / "certipy.json").is_file() or (folder == store_dir and name not in hub_records(store_dir)):
            continue  # no store (a hub without internal TLS, or her first session), or not in it: none made
        with _STORE:
            store = _Store(store_dir=folder)
            if folder == hers:
                Path(folder).chmod(0o700)  # Certipy makes its folder 0755
            try:
                record = store.store.get_record(name)
            except CertNotFoundError:
                continue
            if folder == hers and not Path(record["files"]["cert"]).is_relative_to(hers):
                store.store.remove_record(name)  # taken into hers from before: its files go with the hub's record
            else:
                store.store.remove_files(name, delete_dir=True)
            store.write()


def issued_certificate(store_dir: str, user: str, server: str = "") -> bytes | None:
    """The session certificate the hub last made for ``user``'s session ``server`` (DER), the one that
    session presents; None if there is none."""
    name = record_name(user, server)
    record = user_records(store_dir, user).get(name) or hub_records(store_dir).get(name)  # hers, or from before
    if record is None:
        return None
    try:
        return x509.load_pem_x509_certificate(Path(record["files"]["cert"]).read_bytes()).public_bytes(Encoding.DER)
    except (OSError, KeyError, TypeError, ValueError):
        return None


def local_record_names(user: str) -> tuple[str, str]:
    """The hub's store records of ``user``'s own CA and client pair. Named by a hash of the user's
    name, never ``user-...``: as ``user-<name>-local-ca`` (before), a user called ``alice-local-ca``
    had her session's pair written over alice's own CA."""
    digest = hashlib.sha256(user.encode()).hexdigest()[:32]
    return f"local-ca-{digest}", f"local-client-{digest}"


def _local_client(store_dir: str, user: str) -> tuple[Path, Path, Path, Path]:
    """(CA cert, client key, client cert) of the user's own CA, made once in the hub's store, and
    the CA of all sessions' certificates."""
    keys: list = []
    while True:
        with _store(store_dir, user, keys) as store:
            missing = _local_client_missing(store, store_dir, user)
            if len(keys) >= missing:
                ca, key, cert = _local_client_pair(store, user)
                return ca, key, cert, Path(store.store.get_record(SESSIONS_CA)["files"]["cert"])
        keys += [_new_key() for _ in range(missing - len(keys))]  # outside the lock


def _local_client_missing(store: Certipy, store_dir: str, user: str) -> int:
    """How many keys the user's own CA and client pair still need (0 once made, in her store or before it)."""
    missing = 0
    for name in local_record_names(user):
        try:
            store.store.get_record(name)
        except CertNotFoundError:
            missing += _from_before(store, store_dir, name) is None
    return missing


def _local_client_pair(store: Certipy, user: str) -> tuple[Path, Path, Path]:
    ca_name, client_name = local_record_names(user)
    try:
        store.store.get_record(ca_name)
    except CertNotFoundError:
        store.create_ca(ca_name)
    try:
        record = store.store.get_record(client_name)
    except CertNotFoundError:
        record = store.create_signed_pair(client_name, ca_name, alt_names=["DNS:localhost"])
    ca = store.store.get_record(ca_name)["files"]["cert"]
    return Path(ca), Path(record["files"]["key"]), Path(record["files"]["cert"])


async def prepare(user: str, paths: dict, store_dir: str, server: str = "") -> tuple[str, dict[str, str], dict]:
    """The session's certificates for the user's folder (a named session's into a folder of its own: a
    session waiting in the queue reads its files when it starts): (the folder, {file name: text}, their
    paths there). A start hands them to Slurm.submit, which writes them in the same mediator run as the
    submission."""
    local_ca, client_key, client_cert, notebooks_ca = await asyncio.to_thread(_local_client, store_dir, user)
    hub = hashlib.sha256(str(Path(store_dir).resolve()).encode()).hexdigest()[:8]  # each hub its own folder
    folder = Path(pwd.getpwnam(user).pw_dir) / FOLDER / hub
    if server:
        folder = folder / "sessions" / server
    files = {
        "session.key": Path(paths["keyfile"]).read_text(),
        "session.crt": Path(paths["certfile"]).read_text(),
        # Whom the session's server answers (hub, proxy, the user's own kernels) and whose
        # certificate it trusts when it calls the hub.
        "clients-ca.crt": Path(paths["cafile"]).read_text() + local_ca.read_text(),
        # For the session's kernels calling their own server.
        "local-client.key": client_key.read_text(),
        "local-client.crt": client_cert.read_text(),
        "sessions-ca.crt": notebooks_ca.read_text(),
    }
    return str(folder), files, {"keyfile": str(folder / "session.key"), "certfile": str(folder / "session.crt"),
                                "cafile": str(folder / "clients-ca.crt")}
