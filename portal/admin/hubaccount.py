"""The hub's own account and what it may do as users: the mediator, installed root-owned with its
settings, and the one sudo rule an unprivileged hub needs (`dsportal hub install-mediator`,
`dsportal hub sudoers`). `dsportal check` reads them back (:func:`check_sudo_rules`). Also the systemd
units the package ships (`dsportal hub install-units`, `dsportal firewall install-unit`)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

MEDIATOR_SOURCE = Path(__file__).parents[1] / "slurm" / "mediator.py"  # a file it copies, not an import
MEDIATOR_SETTINGS = Path("/etc/dsportal/mediator.json")
SUDOERS = Path("/etc/sudoers.d/dsportal")
# What the package ships besides its code (config/ of the repo, the package dsportal_config once installed).
SUDO_RULE = "sudoers/dsportal.sudoers"
SYSTEMD_UNITS = Path("/etc/systemd/system")
LOGIN_UNITS = ("dsportal-proxy.service", "dsportal-hub.service")  # the firewall's is every node's: FIREWALL_UNITS
FIREWALL_UNITS = ("dsportal-firewall.service",)


def shipped(name: str) -> Path:
    """A file of the repo's config/ when run from a checkout, else of the installed package (dsportal_config)."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists() and (checkout / "config" / name).exists():
        return checkout / "config" / name
    return Path(str(resources.files("dsportal_config") / name))


class AccountError(RuntimeError):
    """What keeps the hub's account from being set up; the message says what to do."""


def _root_file(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to a file of root's, replacing any file there at once (never half-written)."""
    for folder in reversed([path.parent, *path.parent.parents]):
        if not folder.exists():
            folder.mkdir(mode=0o755)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as handle:
        handle.write(text)
    os.chown(handle.name, 0, 0)
    os.chmod(handle.name, mode)
    os.replace(handle.name, path)


def install_mediator(settings) -> Path:
    """The mediator at settings.slurm.mediator (root's, 0755, run by the system Python in isolated mode)
    and its settings (root's, 0644): where Slurm's commands and slurm.conf are, which accounts it serves
    (slurm.people_uids)."""
    target = Path(settings.slurm.mediator)
    _root_file(target, MEDIATOR_SOURCE.read_text(), 0o755)
    low, high = settings.slurm.people_uids
    config = {"slurm_conf": str(settings.slurm.conf or ""), "bin_dir": str(settings.slurm.bin_dir), "min_uid": low,
              "max_uid": high}
    _root_file(MEDIATOR_SETTINGS, json.dumps(config, indent=1) + "\n", 0o644)
    return target


def sudo_rule(account: str, mediator: Path) -> str:
    """The hub's one sudo rule (the shipped config/sudoers/dsportal.sudoers, its account and mediator filled
    in): the mediator, as any user but root (the mediator itself refuses system accounts), without a password
    or a terminal; nothing else."""
    lines = shipped(SUDO_RULE).read_text().splitlines(keepends=True)
    rule = "".join(line for line in lines if not line.startswith("## "))  # the file's own notes stay behind
    return rule.replace("@ACCOUNT@", account).replace("@MEDIATOR@", str(mediator))


def install_sudo_rule(account: str, mediator: Path) -> Path:
    """/etc/sudoers.d/dsportal, checked by visudo before it replaces the old one."""
    rule = sudo_rule(account, mediator)
    with tempfile.NamedTemporaryFile("w", suffix=".sudoers", delete=False) as handle:
        handle.write(rule)
    try:
        result = subprocess.run(["visudo", "-c", "-f", handle.name], capture_output=True, text=True)
        if result.returncode != 0:
            raise AccountError(f"visudo refused the rule: {(result.stderr or result.stdout).strip()}")
    finally:
        os.unlink(handle.name)
    _root_file(SUDOERS, rule, 0o440)
    return SUDOERS


def install_units(names: tuple[str, ...], folder: Path, force: bool = False) -> tuple[list[str], list[str]]:
    """The shipped systemd units ``names`` into ``folder`` (0644; root's where root runs this). A unit there
    that differs from the shipped one, the site's edits most likely, is kept unless ``force``. Returns what
    was done and what was kept, a line each."""
    done, kept = [], []
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        text, target = shipped(f"systemd/{name}").read_text(), folder / name
        if target.exists() and target.read_text() == text:
            done.append(f"unchanged {target}")
            continue
        if target.exists() and not force:
            kept.append(f"kept {target}: it differs from the shipped {shipped(f'systemd/{name}')} (your site's "
                        "values?); compare them with diff -u, carry your values over, or give --force to replace it")
            continue
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as handle:
            handle.write(text)
        if os.geteuid() == 0:
            os.chown(handle.name, 0, 0)
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, target)
        done.append(f"installed {target}")
    return done, kept


def ensure_system_account(account: str, home: Path) -> pwd.struct_passwd:
    """A system account (uid below 1000: the node firewall lets system accounts reach sessions)
    without a login shell."""
    try:
        return pwd.getpwnam(account)
    except KeyError:
        pass
    result = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
                             "--shell", "/usr/sbin/nologin", "--comment", "dsportal hub", account],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise AccountError(f"useradd {account} failed: {(result.stderr or result.stdout).strip()}")
    return pwd.getpwnam(account)


def may_run_as(account: str, target: str, command: list[str]) -> bool:
    """Whether sudo lets ``account`` run ``command`` as ``target`` (sudo's own list mode, as root)."""
    sudo = shutil.which("sudo") or "/usr/bin/sudo"
    result = subprocess.run([sudo, "-n", "-l", "-U", account, "-u", target, *command], capture_output=True, text=True)
    return result.returncode == 0


def check_sudo_rules(account: str, mediator: Path, a_user: str) -> tuple[bool, str]:
    """(ok, what was found): the account may run the mediator as ``a_user``, and nothing as root,
    and no shell as the user."""
    if not Path(mediator).is_file():
        return False, f"{mediator} is not installed (dsportal hub install-mediator)"
    info = Path(mediator).stat()
    if info.st_uid != 0 or info.st_mode & 0o022:
        return False, f"{mediator} must be root's and writable by root only"
    if not may_run_as(account, a_user, [str(mediator)]):
        return False, f"sudo does not let {account} run {mediator} as {a_user} (dsportal hub sudoers --install)"
    too_much = [what for what, target, command in (
        ("the mediator as root", "root", [str(mediator)]),
        (f"a shell as {a_user}", a_user, ["/bin/sh"]),
        ("a shell as root", "root", ["/bin/sh"]),
    ) if may_run_as(account, target, command)]
    if too_much:
        return False, f"sudo lets {account} run {', '.join(too_much)}: it must allow the mediator as users only"
    return True, f"{account} may run {mediator} as users (not root), and nothing else"
