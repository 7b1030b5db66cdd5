"""The demo's people: the LDAP directory (slapd) and the matching Unix accounts and groups."""

from __future__ import annotations

import base64
import grp
import hashlib
import json
import os
import pwd
import secrets
import shutil
import socket
from pathlib import Path

from democluster.base import DemoError, alive, directory, paths, render, run, say, stop_pid, wait_for


def ssha(password: str) -> str:
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def ensure_accounts() -> None:
    """Unix accounts matching the LDAP entries: jobs must run as the user who logged in. Made in batches
    (newusers, chpasswd, gpasswd: one process each, not three per account): a fresh demo makes hundreds,
    make bench's department thousands."""
    data = directory()
    missing = []
    for user in data["users"]:
        name, uid = user["name"], int(user["uid"])
        try:
            existing = pwd.getpwnam(name)
            if existing.pw_uid != uid:
                raise DemoError(f"Unix account {name} exists with uid {existing.pw_uid}, LDAP says {uid}")
        except KeyError:
            missing.append(user)
    if missing:
        _create_accounts(missing)
        say(f"Unix accounts created: {len(missing)} "
            f"({', '.join(u['name'] for u in missing[:3])}{', ...' if len(missing) > 3 else ''})")
    for user in data["users"]:  # private homes: the demo's users share its nodes like strangers share a GPU node
        os.chmod(pwd.getpwnam(user["name"]).pw_dir, 0o700)
    for group in data["groups"]:
        try:
            members = set(grp.getgrnam(group["name"]).gr_mem)
        except KeyError:
            run(["groupadd", "-g", str(group["gid"]), group["name"]])
            members = set()
        # One gpasswd for the group's whole list, and only when someone is missing from it.
        if set(group["members"]) - members:
            run(["gpasswd", "-M", ",".join(sorted(members | set(group["members"]))), group["name"]])


def _create_accounts(users: list[dict]) -> None:
    """Each account with a group of its name and gid = uid, a home from /etc/skel, a bash shell and no
    password (locked, as useradd makes them: people log in through LDAP). newusers sets a password: a
    random one nobody is told, locked by chpasswd -e right after."""
    alone = []
    batch = []
    for user in users:
        name, uid = user["name"], int(user["uid"])
        try:
            taken = grp.getgrnam(name).gr_gid != uid
        except KeyError:
            taken = _gid_taken(uid)
        if taken or ":" in user["full_name"] or "\n" in user["full_name"]:
            alone.append(user)  # an odd one: useradd's own checks and words
        else:
            batch.append(f"{name}:{secrets.token_hex(24)}:{uid}:{uid}:{user['full_name']}:/home/{name}:/bin/bash\n")
    if batch:
        run(["newusers"], input="".join(batch))
        run(["chpasswd", "-e"], input="".join(f"{line.split(':', 1)[0]}:!\n" for line in batch))
        for line in batch:
            name = line.split(":", 1)[0]
            account = pwd.getpwnam(name)
            for source in Path("/etc/skel").iterdir():
                target = Path(account.pw_dir) / source.name
                if source.is_file() and not target.exists():
                    shutil.copyfile(source, target)
                    os.chown(target, account.pw_uid, account.pw_gid)
    for user in alone:
        name, uid = user["name"], str(user["uid"])
        try:
            grp.getgrnam(name)
        except KeyError:
            run(["groupadd", "-g", uid, name])
        run(["useradd", "-m", "-u", uid, "-g", uid, "-s", "/bin/bash", "-c", user["full_name"], name])


def _gid_taken(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def ensure_ldap() -> None:
    p = paths()
    data = directory()
    ldap = p.ldap
    config_dir, data_dir = ldap / "slapd.d", ldap / "data"
    # The directory is made once from what users.yaml gives (make bench's department included); a change (a course
    # added, the bench's department or the demo's) makes it anew.
    wanted = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    stamp = ldap / "users.yaml.sha256"
    made = (config_dir / "cn=config.ldif").exists() and stamp.exists() and stamp.read_text() == wanted
    if not made and alive(p.run / "slapd.pid"):
        stop_ldap()
    if not made:
        shutil.rmtree(ldap, ignore_errors=True)
        for folder in (config_dir, data_dir, p.run):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(ldap, 0o700)
        users = [{**u, "password_hash": ssha(u["password"])} for u in data["users"]]
        (ldap / "config.ldif").write_text(
            render("slapd-config.ldif.j2", state=p.root, base_dn=data["base_dn"],
                    root_password_hash=ssha(os.urandom(16).hex()))
        )
        (ldap / "directory.ldif").write_text(
            render("directory.ldif.j2", base_dn=data["base_dn"], users=users, groups=data["groups"])
        )
        run(["slapadd", "-n", "0", "-F", str(config_dir), "-l", str(ldap / "config.ldif")])
        run(["slapadd", "-n", "1", "-F", str(config_dir), "-l", str(ldap / "directory.ldif")])
        stamp.write_text(wanted)
        say(f"LDAP directory created ({len(users)} accounts)")
    if not alive(p.run / "slapd.pid"):
        url = f"ldap://127.0.0.1:{data['ldap_port']}/"
        run(["/usr/sbin/slapd", "-h", url, "-F", str(config_dir)])
        wait_for(lambda: socket.create_connection(("127.0.0.1", data["ldap_port"]), timeout=1).close() or True,
                  "slapd")
        say(f"slapd started on {url}")


def stop_ldap() -> None:
    stop_pid(paths().run / "slapd.pid", "slapd")


def ldap_running() -> bool:
    return bool(alive(paths().run / "slapd.pid"))

