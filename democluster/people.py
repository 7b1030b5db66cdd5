"""The demo's people: the LDAP directory (slapd) and the matching Unix accounts and groups."""

from __future__ import annotations

import base64
import grp
import hashlib
import os
import pwd
import shutil
import socket
import subprocess

from democluster.base import DemoError, alive, demo_file, directory, paths, render, run, say, stop_pid, wait_for


def ssha(password: str) -> str:
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def ensure_accounts() -> None:
    """Unix accounts matching the LDAP entries: jobs must run as the user who logged in."""
    data = directory()
    created = []
    for user in data["users"]:
        name, uid = user["name"], int(user["uid"])
        try:
            existing = pwd.getpwnam(name)
            if existing.pw_uid != uid:
                raise DemoError(f"Unix account {name} exists with uid {existing.pw_uid}, LDAP says {uid}")
        except KeyError:
            if subprocess.run(["getent", "group", name], capture_output=True).returncode != 0:
                run(["groupadd", "-g", str(uid), name])
            run(["useradd", "-m", "-u", str(uid), "-g", str(uid), "-s", "/bin/bash", "-c", user["full_name"], name])
            created.append(name)
        # Private homes: the demo's users share its nodes like strangers share a GPU node.
        os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
    if created:  # one line, not one per account: a fresh demo makes hundreds
        say(f"Unix accounts created: {len(created)} ({', '.join(created[:3])}{', ...' if len(created) > 3 else ''})")
    for group in data["groups"]:
        if subprocess.run(["getent", "group", group["name"]], capture_output=True).returncode != 0:
            run(["groupadd", "-g", str(group["gid"]), group["name"]])
        # Only those not in it yet: a course of hundreds made a usermod per member at every `make demo`.
        members = set(grp.getgrnam(group["name"]).gr_mem)
        for member in group["members"]:
            if member not in members:
                run(["usermod", "-a", "-G", group["name"], member])


def ensure_ldap() -> None:
    p = paths()
    data = directory()
    ldap = p.ldap
    config_dir, data_dir = ldap / "slapd.d", ldap / "data"
    # The directory is made from users.yaml once; a changed users.yaml (a course added) makes it anew.
    wanted = hashlib.sha256(demo_file("users.yaml").read_bytes()).hexdigest()[:16]
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

