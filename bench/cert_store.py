"""The hub's CPU for a session's certificates (hub.internal_ssl) on a hub that has served many people.

Certipy keeps a store in one JSON file, read and written whole. JupyterHub's own Spawner.create_certs (what a
stock hub with internal_ssl runs) keeps every user's session pair in the hub's one store; dsportal kept its
users' records there too until each user had a store of her own (spawner/certs.py user_store_dir). This
makes a hub's store of PEOPLE users' records (synthetic records, as each user's start left them) and
times, in this process's CPU, 20 first starts and 20 later ones of new users, for:

- dsportal: spawner/certs.py as it is (session pair, the user's own CA and client, the pinned check);
- dsportal's previous store (``--before COMMIT``: spawner/certs.py of that commit, from git);
- JupyterHub's own: Certipy.create_signed_pair into the hub's store, as Spawner.create_certs makes it.

No cluster: the hub's certificate work alone, which runs in the hub's threads (holding the GIL its loop
needs). The last line sums up.

    python bench/cert_store.py --people 100,2000 --before b6cfd3f
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from certipy import Certipy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NODES = ["DNS:node1", "IP:198.51.100.11", "DNS:node2", "IP:198.51.100.12"]
STARTS = 20


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def served(folder: Path, people: int) -> str:
    """A hub's store with the sessions' CA and the records ``people`` users' starts left in it."""
    store = Certipy(store_dir=str(folder))
    store.create_ca("notebooks-ca")
    store.create_signed_pair("user-someone", "notebooks-ca", alt_names=["DNS:localhost", *NODES])
    records = json.loads((folder / "certipy.json").read_text())
    for n in range(people):
        for kind in ("user-", "local-ca-", "local-client-"):
            records[f"{kind}person{n}"] = records["user-someone"]
        records["notebooks-ca"]["signees"][f"user-person{n}"] = 1
    (folder / "certipy.json").write_text(json.dumps(records))
    return str(folder)


def dsportal_start(certs):
    def start(store: str, user: str) -> None:
        certs.session_pair(store, user, NODES, "bundle.crt")
        certs._local_client(store, user)
        certs.issued_certificate(store, user)
    return start


def jupyterhub_start(store: str, user: str) -> None:
    Certipy(store_dir=store).create_signed_pair(f"user-{user}", "notebooks-ca",
                                                alt_names=["DNS:localhost", "IP:127.0.0.1", *NODES], overwrite=True)


def timed(start, store: str) -> tuple[float, float]:
    """(ms of CPU per first start, per later start) of STARTS new users."""
    spent = []
    for _ in range(2):
        began = time.process_time()
        for n in range(STARTS):
            start(store, f"student{n}")
        spent.append(1000 * (time.process_time() - began) / STARTS)
    return spent[0], spent[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", default="100,2000", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--before", default="", help="a commit whose spawner/certs.py to time too")
    args = parser.parse_args()
    kinds = {"dsportal": dsportal_start(_module(ROOT / "spawner/certs.py", "certs_now"))}
    with tempfile.TemporaryDirectory() as scratch:
        if args.before:
            before = Path(scratch) / "certs_before.py"
            before.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{args.before}:spawner/certs.py"],
                                             capture_output=True, text=True, check=True).stdout)
            kinds[f"dsportal at {args.before}"] = dsportal_start(_module(before, "certs_before"))
        kinds["JupyterHub's own"] = jupyterhub_start
        results = {}
        for people in args.people:
            for kind, start in kinds.items():
                first, later = timed(start, served(Path(scratch) / f"{kind}-{people}".replace(" ", "-"), people))
                results[people, kind] = first, later
                print(f"{people:5d} people served, {kind:22s}: a first start {first:5.1f} ms, a later one {later:5.1f} ms "
                      "of the hub's CPU", flush=True)
    most = max(args.people)
    print(f"cert_store: with {most} people served, a start's certificates cost the hub "
          + ", ".join(f"{kind} {results[most, kind][0]:.1f}/{results[most, kind][1]:.1f} ms" for kind in kinds)
          + " (first/later start)")


if __name__ == "__main__":
    main()
