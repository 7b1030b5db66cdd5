"""The hub's trust in the system's certificate authorities: read from OpenSSL's hashed folder, not its bundle.

Every TLS context that loads the system's CAs parses OpenSSL's default CA file whole: on Debian
/etc/ssl/certs/ca-certificates.crt, about 150 certificates, 15-30 ms of the hub's CPU on its event loop.
JupyterHub makes one such context for each session start (``make_ssl_context`` in ``User._wait_up``,
with hub.internal_ssl), and ldap3 one for each LDAPS bind without a CA file of its own. OpenSSL's default
CA folder holds the same certificates, each under the hash of its name (``update-ca-certificates``,
``openssl rehash``), and reads one only when a chain asks for it.

Where that folder holds at least as many certificates as the bundle, :func:`use_hashed_folder` points the
hub's OpenSSL at the folder alone (``SSL_CERT_FILE=/dev/null``, ``SSL_CERT_DIR`` the folder): the same
authorities are trusted, and a context is made in well under a millisecond. Nothing else changes: a site
that set either variable itself keeps its own, a system whose folder is not hashed (RHEL's
/etc/pki/tls/certs) keeps the bundle, and the commands the hub runs as users never see these variables
(their environment is Slurm.env's). Proposed upstream: contexts for the hub's internal TLS trust the
internal CA only (docs/explanation/architecture.md).
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from pathlib import Path

log = logging.getLogger(__name__)

NO_BUNDLE = "/dev/null"  # a CA file of no certificates: OpenSSL then looks in the folder only
_HASHED = re.compile(r"[0-9a-f]{8}\.[0-9]+")  # a certificate's link: its subject's hash and a number (.r: CRLs)


def hashed_certificates(folder: str) -> int:
    """How many certificates ``folder`` holds under their hash names (0 if it cannot be read)."""
    try:
        return sum(1 for entry in os.scandir(folder) if _HASHED.fullmatch(entry.name))
    except OSError:
        return 0


def bundle_certificates(bundle: str) -> int:
    """How many certificates the PEM file ``bundle`` holds (0 if it cannot be read)."""
    try:
        return Path(bundle).read_bytes().count(b"-----BEGIN CERTIFICATE-----")
    except OSError:
        return 0


def use_hashed_folder(environ=os.environ, bundle: str = "", folder: str = "") -> str:
    """Point OpenSSL at the system's hashed CA folder instead of its bundle (OpenSSL's defaults, unless
    given), where that trusts the same authorities (see the module); says what it did, for the hub's log."""
    paths = ssl.get_default_verify_paths()
    if paths.openssl_cafile_env in environ or paths.openssl_capath_env in environ:
        return (f"the CAs the environment names ({paths.openssl_cafile_env}={environ.get(paths.openssl_cafile_env, '')}, "
                f"{paths.openssl_capath_env}={environ.get(paths.openssl_capath_env, '')})")
    bundle, folder = bundle or paths.openssl_cafile, folder or paths.openssl_capath
    in_bundle = bundle_certificates(bundle)
    in_folder = hashed_certificates(folder)
    if not in_bundle or in_folder < in_bundle:
        return f"the system's CAs from {bundle} ({in_bundle} certificates; {folder} holds {in_folder} by hash)"
    environ[paths.openssl_cafile_env] = NO_BUNDLE
    environ[paths.openssl_capath_env] = folder
    return f"the system's CAs from {folder}, each read when a chain needs it ({in_folder} by hash; {bundle}: {in_bundle})"
