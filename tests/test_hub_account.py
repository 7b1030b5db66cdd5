"""The hub runs unprivileged: its own system account, acting as users only through the mediator."""

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from conftest import CONFIG
from portal.core.settings import load
from spawner.certs import local_record_names, user_records, user_store_dir

SETTINGS = yaml.safe_load(CONFIG.read_text())
ACCOUNT = SETTINGS["hub"]["account"]
DATA_DIR = Path(SETTINGS["hub"]["data_dir"])
MEDIATOR = "/usr/local/libexec/dsportal/mediator"
REPO = Path(__file__).resolve().parent.parent
HUB_PIDFILE = Path("/var/lib/dsportal-demo/run/dsportal-hub.pid")


def owner(pid: int) -> str:
    uid = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("Uid:"))
    return pwd.getpwuid(uid).pw_name


def as_hub(*argv: str, input: str | None = None) -> subprocess.CompletedProcess:
    """A command run by the hub's account, as the hub runs its own."""
    return subprocess.run(["runuser", "-u", ACCOUNT, "--", *argv], input=input, capture_output=True, text=True,
                          timeout=60, cwd="/")


def test_the_hub_and_its_proxy_run_as_the_hub_account_and_keep_their_secrets(portal):
    hub, proxy = int(HUB_PIDFILE.read_text()), int((DATA_DIR / "proxy.pid").read_text())
    assert (owner(hub), owner(proxy)) == (ACCOUNT, ACCOUNT)
    assert pwd.getpwnam(ACCOUNT).pw_uid < 1000  # a system account: no login, the node firewall's "system" class
    account = pwd.getpwnam(ACCOUNT).pw_uid
    assert DATA_DIR.stat().st_uid == account and DATA_DIR.stat().st_mode & 0o077 == 0
    # The hub's database: a server's (its password file) or, without hub.db_url, SQLite's file.
    database = Path(SETTINGS["hub"]["db_password_file"]).name if SETTINGS["hub"].get("db_url") else "jupyterhub.sqlite"
    for secret in ("cookie_secret", database, "internal-ssl/notebooks-ca/notebooks-ca.key",
                   "internal-ssl/hub-ca/hub-ca.key"):
        assert (DATA_DIR / secret).stat().st_uid == account, secret
    assert (DATA_DIR / "cookie_secret").stat().st_mode & 0o077 == 0
    # The proxy's token is in its environment (the account's alone), on no command line of anyone's.
    environ = Path(f"/proc/{proxy}/environ").read_bytes().split(b"\0")
    token = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"CONFIGPROXY_AUTH_TOKEN="))
    cookie_secret = (DATA_DIR / "cookie_secret").read_bytes().strip()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        assert token not in text and cookie_secret not in text, cmdline
    assert oct(os.stat(f"/proc/{proxy}/environ").st_mode & 0o777) == "0o400"


def test_a_neighbour_neither_reads_nor_replaces_alices_keys_in_the_hubs_store(alice):
    """After alice's start the hub's store holds her session key and her own CA's and client's (records
    named by a hash of her name): each the hub account's, mode 0600. bob, with a shell on
    the login node, can read none of them, nor the store's index, nor put a file of his into it."""
    alice.spawn({"profile": "cpu"})
    store = DATA_DIR / "internal-ssl"
    records = user_records(str(store), "alice")
    keys = [records[name]["files"]["key"] for name in ("user-alice", *local_record_names("alice"))]
    account = pwd.getpwnam(ACCOUNT).pw_uid
    for key in keys:
        assert Path(key).stat().st_uid == account and Path(key).stat().st_mode & 0o077 == 0, key
    hers = Path(user_store_dir(str(store), "alice"))
    for argv in (*(["cat", key] for key in keys), ["cat", str(store / "certipy.json")], ["ls", str(store)],
                 ["cat", str(hers / "certipy.json")], ["ls", str(hers)],
                 ["cp", "/etc/hostname", str(store / ".certipy.json.1.1")]):
        attempt = subprocess.run(["runuser", "-u", "bob", "--", *argv], capture_output=True, text=True, timeout=30)
        assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, (argv, attempt.stdout[:80])
    assert not (store / ".certipy.json.1.1").exists()


def test_each_start_writes_the_sessions_certificates_into_her_folder(alice):
    """The start's one mediator run writes the session's certificates (as alice, 0600) before its job
    is submitted: with her folder for this hub gone, the session still starts, serving the hub's
    certificate for her."""
    import hashlib
    import shutil

    store = DATA_DIR / "internal-ssl"
    folder = Path(pwd.getpwnam("alice").pw_dir) / ".dsportal/certs" / hashlib.sha256(
        str(store.resolve()).encode()).hexdigest()[:8]
    shutil.rmtree(folder, ignore_errors=True)
    alice.spawn({"profile": "cpu"})
    records = user_records(str(store), "alice")
    assert (folder / "session.crt").read_text() == Path(records["user-alice"]["files"]["cert"]).read_text()
    for name in ("session.key", "session.crt", "clients-ca.crt", "local-client.key", "local-client.crt",
                 "sessions-ca.crt"):
        assert (folder / name).owner() == "alice" and (folder / name).stat().st_mode & 0o777 == 0o600, name


def alices_jobs() -> list[str]:
    return subprocess.run(["squeue", "-h", "-u", "alice", "-o", "%A"], capture_output=True, text=True).stdout.split()


def test_sudo_lets_the_hub_account_run_the_mediator_as_users_and_nothing_else(portal):
    refused = {
        "a shell as alice": ["sudo", "-n", "-u", "alice", "/bin/sh", "-c", "id"],
        "anything as root": ["sudo", "-n", "/bin/true"],
        "the mediator as root": ["sudo", "-n", "-u", "root", MEDIATOR, "tail", "/etc/shadow"],
        "env as alice": ["sudo", "-n", "-u", "alice", "/usr/bin/env"],
    }
    for what, argv in refused.items():
        result = as_hub(*argv)
        print(f"{what}: rc {result.returncode} {result.stderr.strip()[:120]}")
        assert result.returncode != 0, what
    # The mediator as a system account (slurm's jobs are trusted by Slurm) refuses itself.
    result = as_hub("sudo", "-n", "-u", "slurm", MEDIATOR, "tail", "/etc/hostname")
    assert result.returncode == 2 and "runs only as a portal user" in result.stderr, result.stderr
    # As alice it does what it is for, with her rights and within her folders.
    assert as_hub("sudo", "-n", "-u", "alice", MEDIATOR, "tail", "/etc/hostname").returncode == 0
    result = as_hub("sudo", "-n", "-u", "alice", MEDIATOR, "tail", "/etc/shadow")
    assert result.returncode == 1 and "Permission denied" in result.stderr
    home = pwd.getpwnam("alice").pw_dir
    for folder in (f"{home}/.ssh", f"{home}/.dsportal/certs/../../.ssh", "/tmp/x"):
        result = as_hub("sudo", "-n", "-u", "alice", MEDIATOR, "certs", folder, input="authorized_keys AAAA\n")
        assert result.returncode == 2 and "is not below" in result.stderr, (folder, result.stderr)
    result = as_hub("sudo", "-n", "-u", "alice", MEDIATOR, "submit",
                    input='{"script": "#!/bin/sh\\ntrue\\n", "env": {}, "log_dir": "/tmp/elsewhere"}')
    assert result.returncode == 2 and "is not below" in result.stderr, result.stderr
    # A start (certificates, then the submission, in one run) writes nothing and submits nothing when
    # its certificates' folder or names are not the ones allowed.
    jobs_before = alices_jobs()
    submission = {"script": "#!/bin/sh\ntrue\n", "env": {}, "log_dir": f"{home}/.dsportal/logs"}
    for folder, files, refusal in ((f"{home}/.ssh", {"authorized_keys": "AAAA"}, "is not below"),
                                   (f"{home}/.dsportal/certs/t", {"../../../.ssh/authorized_keys": "AAAA"},
                                    "is not a certificate file name"),
                                   (f"{home}/.dsportal/certs/t", ["session.key"], "certs is an object")):
        result = as_hub("sudo", "-n", "-u", "alice", MEDIATOR, "start", folder,
                        input=json.dumps({**submission, "certs": files}))
        assert result.returncode == 2 and refusal in result.stderr, (folder, files, result.stderr)
    assert alices_jobs() == jobs_before


def test_dsportal_check_says_whether_the_sudo_rules_are_what_the_portal_needs_and_no_more(portal):
    dsportal = str(Path(sys.executable).parent / "dsportal")

    def hub_account_line() -> str:
        out = subprocess.run([dsportal, "--config", str(CONFIG), "check"], capture_output=True, text=True,
                             timeout=300).stdout
        return next(line for line in out.splitlines() if "hub account:" in line)

    line = hub_account_line()
    assert "[ok]" in line and "nothing else" in line, line
    extra = Path("/etc/sudoers.d/zz-dsportal-test")
    extra.write_text(f"{ACCOUNT} ALL = (ALL, !root) NOPASSWD: /bin/sh\n")
    extra.chmod(0o440)
    try:
        line = hub_account_line()
        assert "[FAIL]" in line and "a shell as" in line, line
    finally:
        extra.unlink()


PROXY_API_PROBE = """
import ssl, urllib.request
context = ssl._create_unverified_context()
try:
    answer = urllib.request.urlopen("{url}", context=context, timeout=10)
    print("answered", answer.status)
except Exception as error:
    print("refused", type(error).__name__)
"""


def as_bob(*argv: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "bob", "--", *argv], input=input, capture_output=True, text=True,
                          timeout=60, cwd="/")


def test_a_neighbour_reaches_neither_the_hubs_secrets_nor_its_database_nor_the_proxys_api(portal):
    """bob, a user with a shell on the login node: the hub's files, its database account, the proxy's
    API and the mediator (which he may run, as himself) give him nothing of the hub's or of alice's."""
    hub = SETTINGS["hub"]
    for secret in (hub["db_password_file"], hub["proxy_token_file"], str(DATA_DIR / "cookie_secret")):
        assert as_bob("cat", secret).returncode != 0, secret
    port = hub["db_url"].rsplit(":", 1)[1].split("/")[0]
    for password in ([], ["--password="], ["--password=guess"]):
        result = as_bob("mariadb", "-h", "127.0.0.1", "-P", port, "-u", "dsportal_hub", *password, "jupyterhub",
                        "-e", "SELECT COUNT(*) FROM api_tokens")
        assert result.returncode != 0 and "Access denied" in result.stderr, (password, result.stderr)
    api = urlparse(load(CONFIG).hub.proxy_api_url)._replace(scheme="https", path="/api/routes").geturl()
    probe = as_bob(sys.executable, "-I", "-c", PROXY_API_PROBE.format(url=api))
    assert probe.stdout.startswith("refused"), probe.stdout + probe.stderr  # no client certificate of the hub's
    alice = pwd.getpwnam("alice").pw_dir
    result = as_bob(MEDIATOR, "certs", f"{alice}/.dsportal/certs/x", input="a.crt AAAA\n")
    assert result.returncode == 2 and "is not below" in result.stderr, result.stderr
    result = as_bob(MEDIATOR, "submit",
                    input=json.dumps({"script": "#!/bin/sh\n", "env": {}, "log_dir": f"{alice}/.dsportal/logs"}))
    assert result.returncode == 2 and "is not below" in result.stderr, result.stderr
    result = as_bob(MEDIATOR, "start", f"{alice}/.dsportal/certs/x",
                    input=json.dumps({"script": "#!/bin/sh\n", "env": {}, "log_dir": "/tmp", "certs": {"a.crt": "AAAA"}}))
    assert result.returncode == 2 and "is not below" in result.stderr, result.stderr
    result = as_bob(MEDIATOR, "tail", f"{alice}/.dsportal/logs/session-1.log")
    assert result.returncode == 1 and "Permission denied" in result.stderr, result.stderr  # his rights, not the hub's


OLD_MEDIATOR = Path("/usr/local/libexec/dsportal/mediator-before-start")


def test_a_start_writes_the_certificates_and_submits_in_one_run_and_an_older_mediator_still_works(portal):
    """A session's start is one mediator run (certificates, then sbatch). A mediator installed before
    that verb existed (the hub upgraded, `dsportal hub install-mediator` not yet run) refuses it with
    its usage line: the hub then writes and submits in two runs, and says what to do in its log."""
    import asyncio

    from hubclient import demo_slurm

    source = Path(MEDIATOR).read_text()
    start_branch = source[source.index('        if verb == "start"'):source.index('        if verb == "tail"')]
    old = source.replace(start_branch, "").replace(" | start FOLDER", "")
    assert old != source and '"start"' not in old
    OLD_MEDIATOR.write_text(old)
    OLD_MEDIATOR.chmod(0o755)
    home = pwd.getpwnam("alice").pw_dir
    script = ("#!/bin/sh\n#SBATCH --partition=cpu\n#SBATCH --time=1\n#SBATCH --cpus-per-task=1\n#SBATCH --mem=100M\n"
              "#SBATCH --output=/dev/null\ntrue\n")
    try:
        for mediator, name in ((Path(MEDIATOR), "one-run"), (OLD_MEDIATOR, "two-runs")):
            slurm = demo_slurm(submit_as="runuser", mediator=mediator)
            folder = f"{home}/.dsportal/certs/test-{name}"
            job_id = asyncio.run(slurm.submit("alice", script, f"{home}/.dsportal/logs", env={},
                                              certs=(folder, {"session.crt": f"certificate {name}\n"})))
            assert job_id > 0
            subprocess.run(["scancel", str(job_id)], capture_output=True)
            written = Path(folder) / "session.crt"
            assert written.read_text() == f"certificate {name}\n"
            assert written.stat().st_mode & 0o777 == 0o600 and written.owner() == "alice"
    finally:
        OLD_MEDIATOR.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", f"{home}/.dsportal/certs/test-one-run", f"{home}/.dsportal/certs/test-two-runs"])


@pytest.mark.quick
def test_the_mediator_hands_sbatch_its_script_in_a_memory_file_or_a_pipe_where_those_are_refused(monkeypatch):
    """The mediator becomes sbatch (execve) with the batch script on its input: a file in memory,
    or a pipe on kernels that refuse those (vm.memfd_noexec=2); more than a pipe holds is refused."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mediator_under_test", REPO / "portal/slurm/mediator.py")
    mediator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mediator)

    def read_all(fd: int) -> bytes:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        os.close(fd)
        return b"".join(chunks)

    script = b"#!/bin/bash\n#SBATCH --job-name=x\necho started\n" * 2000  # ~100 KiB
    assert read_all(mediator.readable(script)) == script

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(mediator.os, "memfd_create", refused)
    assert read_all(mediator.readable(script)) == script
    with pytest.raises(mediator.Refused, match="more than a pipe holds"):
        mediator.readable(b"x" * (4 << 20))
