"""A class logging in at once through Active Directory's search bind: dsportal's hub against a stock JupyterHub
with jupyterhub-ldapauthenticator, configured alike, in the same run.

The directory is Samba's AD domain controller (democluster/samba_ad.py) on the demo's node network, LDAPS with a
CA of its own; the class (student01 ... studentNN, the demo's own Unix accounts) are AD users in a group nested
inside the allowed one, so every login is: a search as the portal's service account, a bind as the DN found, the
in-chain group search. Each student's browser first loads the login page (its _xsrf), then all post their
password at the same moment; a login's time is from that post to the hub's redirect.

    python bench/ad_logins.py [--students 100]     # as root, with the demo up (make demo); `make bench` runs it

Prints each hub's p50, p99 and slowest login, failures, and the hub's own CPU seconds for the burst; writes
bench/results/ad-logins-DATE.json; the last line sums up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from democluster import samba_ad  # noqa: E402 - after the checkout is on the path
from democluster.base import release_config  # noqa: E402
from hubprocess import HubResources  # noqa: E402 - bench/, this script's own folder

RESULTS = REPO / "bench" / "results"
PASSWORD = "Class-Pass-1234"
SERVICE_PASSWORD = "Svc-Pass-1234"
ALLOWED = f"CN=datascience,{samba_ad.USERS}"
DSPORTAL = Path(sys.executable).parent / "dsportal"
CHP = "/opt/dsportal/chp/node_modules/.bin/configurable-http-proxy"

STOCK_CONFIG = """import ssl
c.JupyterHub.authenticator_class = "ldapauthenticator.LDAPAuthenticator"
c.LDAPAuthenticator.server_address = {address!r}
c.LDAPAuthenticator.server_port = 636
c.LDAPAuthenticator.tls_strategy = "on_connect"
c.LDAPAuthenticator.tls_kwargs = {{"validate": ssl.CERT_REQUIRED, "ca_certs_file": {ca!r}}}
c.LDAPAuthenticator.lookup_dn = True
c.LDAPAuthenticator.user_search_base = {base!r}
c.LDAPAuthenticator.user_attribute = "sAMAccountName"
c.LDAPAuthenticator.lookup_dn_user_dn_attribute = "sAMAccountName"
c.LDAPAuthenticator.lookup_dn_search_user = {service!r}
c.LDAPAuthenticator.lookup_dn_search_password = {password!r}
c.LDAPAuthenticator.allowed_groups = [{allowed!r}]
c.LDAPAuthenticator.group_search_filter = {nested!r}
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.pid_file = "{folder}/jupyterhub.pid"
"""


def free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def start_hub(kind: str, folder: Path, dc, port: int) -> subprocess.Popen:
    """dsportal's hub (the demo's portal.yaml, its ldap section AD's search bind) or a stock JupyterHub."""
    folder.mkdir(parents=True)
    for busy in range(port, port + 4):  # the proxy, the hub, dsportal's service (the hub's port + 1), the proxy's API
        if not free(busy):
            raise SystemExit(f"port {busy} is taken: stop what listens there first")
    if kind == "dsportal":
        config = yaml.safe_load(release_config(REPO / "config" / "portal.yaml").read_text())
        config["hub"].update(bind_url=f"http://127.0.0.1:{port}", hub_bind_url=f"http://127.0.0.1:{port + 1}",
                             proxy_api_url=f"http://127.0.0.1:{port + 3}", data_dir=str(folder / "hub"),
                             db_url=None, db_password_file=None, external_proxy=False, proxy_token_file=None,
                             subdomain_host=None)
        config["hub"].pop("account", None)  # a scratch hub of the bench's: root, its own SQLite, no sessions started
        config["slurm"]["submit_as"] = "runuser"
        config["ldap"] = {"server_address": dc.address, "server_port": 636, "tls_strategy": "on_connect",
                          "ca_file": str(dc.ca), "search_base": samba_ad.USERS, "user_attribute": "sAMAccountName",
                          "search_bind_dn": samba_ad.SERVICE, "search_bind_password_file": str(dc.password_file),
                          "allowed_groups": [ALLOWED], "group_search_filter": samba_ad.NESTED}
        (folder / "portal.yaml").write_text(yaml.safe_dump(config))
        command = [str(DSPORTAL), "--config", str(folder / "portal.yaml"), "hub"]
    else:
        (folder / "jupyterhub_config.py").write_text(STOCK_CONFIG.format(
            address=dc.address, ca=str(dc.ca), base=samba_ad.USERS, service=samba_ad.SERVICE,
            password=SERVICE_PASSWORD, allowed=ALLOWED, nested=samba_ad.NESTED, port=port, hub_port=port + 1,
            api_port=port + 3, chp=CHP, folder=folder))
        command = [sys.executable, "-m", "jupyterhub", "-f", str(folder / "jupyterhub_config.py")]
    log = open(folder / "hub.log", "wb")
    process = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "DSPORTAL_DEMO": "1"})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the {kind} hub exited:\n" + (folder / "hub.log").read_text()[-3000:])
        try:
            if requests.get(f"http://127.0.0.1:{port}/hub/api", timeout=2).status_code == 200:
                return process
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the {kind} hub did not answer within 90 s: {folder / 'hub.log'}")


def class_logs_in(base: str, students: list[str], hub_pid: int) -> dict:
    """Every student loads the login page, then all post at once: each login's seconds, failures, the hub's CPU."""
    ready = threading.Barrier(len(students) + 1)
    times: dict[str, float] = {}
    failures: dict[str, str] = {}

    def student(name: str) -> None:
        session = requests.Session()
        session.trust_env = False
        try:
            page = session.get(f"{base}/hub/login", timeout=60)
            xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
            form = {"username": name, "password": PASSWORD, **({"_xsrf": xsrf.group(1)} if xsrf else {})}
        except requests.RequestException as error:
            failures[name] = f"login page: {error}"
            form = None
        ready.wait()
        if form is None:
            return
        started = time.monotonic()
        try:
            answer = session.post(f"{base}/hub/login", data=form, allow_redirects=False, timeout=120)
        except requests.RequestException as error:
            failures[name] = str(error)
            return
        times[name] = time.monotonic() - started
        if answer.status_code != 302 or "jupyterhub-session-id" not in session.cookies:
            failures[name] = f"{answer.status_code} {answer.text[-200:]!r}"

    threads = [threading.Thread(target=student, args=(name,)) for name in students]
    for thread in threads:
        thread.start()
    resources = HubResources(hub_pid)  # the hub's own CPU seconds (bench/hubprocess.py), counted from here
    ready.wait()
    started = time.monotonic()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    ordered = sorted(times.values())
    return {"students": len(students), "failed": len(failures), "failures": dict(list(failures.items())[:5]),
            "p50": statistics.median(ordered) if ordered else None,
            "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None,
            "max": ordered[-1] if ordered else None, "all_in": took, "hub_cpu": resources.stop()["hub_cpu"]}


def describe(result: dict) -> str:
    if not result["p50"]:
        return f"no login answered ({result['failed']} failed: {result['failures']})"
    return (f"p50 {result['p50']:.2f} s, p99 {result['p99']:.2f} s, slowest {result['max']:.2f} s, all in "
            f"{result['all_in']:.2f} s; {result['failed']} of {result['students']} failed; hub CPU "
            f"{result['hub_cpu']:.1f} s" + (f" ({result['failures']})" if result["failed"] else ""))


def run(students: int, workdir: Path) -> dict:
    """The domain controller with the class in it, then each hub in turn: {kind: result}."""
    names = [f"student{n:02d}" for n in range(1, students + 1)]
    results = {}
    with samba_ad.domain_controller(workdir / "ad", {"dsportal": SERVICE_PASSWORD},
                                    {"datascience": [], "class101": []}) as dc:
        subprocess.run(["samba-tool", "group", "addmembers", "datascience", "class101", f"--configfile={dc.conf}"],
                       check=True, capture_output=True)  # the class's group inside the allowed one: nested
        samba_ad.add_users(dc, names, PASSWORD, "class101")
        for index, kind in enumerate(("dsportal", "stock")):
            port = 8040 + 10 * index
            hub = start_hub(kind, workdir / kind, dc, port)
            try:
                results[kind] = class_logs_in(f"http://127.0.0.1:{port}", names, hub.pid)
            finally:
                os.killpg(hub.pid, 15)
                hub.wait(30)
            print(f"  {kind:8s} {describe(results[kind])}", flush=True)
    return results


def summary(results: dict, students: int) -> str:
    ours, stock = results["dsportal"], results["stock"]
    bar = "met" if ours["p99"] is not None and ours["p99"] <= 2 and not ours["failed"] else "NOT met"
    stock_p99 = f"{stock['p99']:.2f} s" if stock["p99"] is not None else "none answered"
    return (f"AD logins, a class of {students} at once through the search bind: p99 {ours['p99']:.2f} s vs stock "
            f"ldapauthenticator {stock_p99}, {ours['failed']} vs {stock['failed']} failed, hub CPU "
            f"{ours['hub_cpu']:.1f} vs {stock['hub_cpu']:.1f} s (bar p99 <= 2 s: {bar})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=100)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="dsportal-ad-logins-", dir="/var/tmp"))
    print(f"== AD logins: {args.students} students at once, each hub in turn (logs in {workdir})", flush=True)
    results = run(args.students, workdir)
    dated = RESULTS / f"ad-logins-{time.strftime('%Y-%m-%d-%H%M', time.gmtime())}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dated.write_text(json.dumps({"argv": argv or sys.argv[1:], "commit": commit.strip(), "results": results}, indent=1))
    print(f"bench: {summary(results, args.students)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
