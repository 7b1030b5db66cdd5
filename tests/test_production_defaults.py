"""A site's dsportal never reads the demo's settings by accident: without --config every command but `demo` reads
$DSPORTAL_CONFIG, else /etc/dsportal/portal.yaml, refuses a missing file in words, and refuses the demo's file or
its state folder's paths, naming the file, the key and its line, unless DSPORTAL_DEMO=1 says this is the demo.
A bad file is refused naming the file, the key and its line.

Each runs the checkout's `dsportal` (portal.cli, the entry point's function) in a process of its own, with a
clean environment (no DSPORTAL_CONFIG, no DSPORTAL_DEMO) and a home of its own. No cluster needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO_CONFIG as CONFIG, REPO
from portal.admin import hubaccount
from portal.core.settings import DEMO_STATE, PRODUCTION_CONFIG

pytestmark = pytest.mark.quick


def dsportal(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    clean = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "PYTHONPATH": str(REPO),
             **env}
    return subprocess.run([sys.executable, "-m", "portal.cli", *args], capture_output=True, text=True, env=clean,
                          cwd=tmp_path, timeout=120)


def line_of(text: str, needle: str) -> int:
    """The 1-based line of the first line of ``text`` that contains ``needle``."""
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def site_config(tmp_path: Path, keep_demo: str | None = None) -> tuple[Path, str]:
    """The demo's file as a site would have it: every path in the demo's state folder moved to one of the site's,
    but for the lines holding ``keep_demo``; the lines stay where they were."""
    site = tmp_path / "site"
    lines = [line if keep_demo and keep_demo in line else line.replace(str(DEMO_STATE), str(site))
             for line in CONFIG.read_text().splitlines(keepends=True)]
    path = tmp_path / "portal.yaml"
    path.write_text("".join(lines))
    return path, path.read_text()


def snapshot(*paths: Path) -> dict[Path, tuple | None]:
    found = {}
    for path in paths:
        try:
            info = path.stat()
            found[path] = (info.st_mtime_ns, info.st_ino, path.read_bytes())
        except FileNotFoundError:
            found[path] = None
    return found


MEDIATOR_FILES = (hubaccount.MEDIATOR_SETTINGS, Path("/usr/local/libexec/dsportal/mediator"))


def test_install_mediator_without_config_refuses_and_writes_nothing(tmp_path):
    if PRODUCTION_CONFIG.exists():
        pytest.skip(f"{PRODUCTION_CONFIG} exists on this machine: the default is a site's file here")
    before = snapshot(*MEDIATOR_FILES)
    result = dsportal(tmp_path, "hub", "install-mediator")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (f"dsportal: {PRODUCTION_CONFIG}: file not found; give --config or set "
                                     "DSPORTAL_CONFIG")
    assert not result.stdout
    assert snapshot(*MEDIATOR_FILES) == before, "install-mediator wrote the mediator or its settings"


def test_install_mediator_refuses_the_demos_slurm_conf_naming_key_and_line(tmp_path):
    """A site's file that still names one of the demo's paths (slurm.conf): never into /etc/dsportal/mediator.json."""
    path, text = site_config(tmp_path, keep_demo="slurm.conf")
    before = snapshot(*MEDIATOR_FILES)
    result = dsportal(tmp_path, "--config", str(path), "hub", "install-mediator")
    assert result.returncode == 2, result.stdout + result.stderr
    line = line_of(text, f"conf: {DEMO_STATE}/slurm/slurm.conf")
    assert f"dsportal: {path} holds the demo's settings" in result.stderr
    assert f"line {line}: slurm.conf: {DEMO_STATE}/slurm/slurm.conf" in result.stderr, result.stderr
    assert "DSPORTAL_DEMO=1" in result.stderr
    assert snapshot(*MEDIATOR_FILES) == before, "install-mediator wrote the mediator or its settings"
    # The same through $DSPORTAL_CONFIG.
    assert dsportal(tmp_path, "hub", "install-mediator", DSPORTAL_CONFIG=str(path)).returncode == 2
    assert snapshot(*MEDIATOR_FILES) == before


def test_check_refuses_the_demos_own_file_naming_it_and_its_keys(tmp_path):
    result = dsportal(tmp_path, "--config", str(CONFIG), "check")
    assert result.returncode == 1, result.stdout + result.stderr
    text = CONFIG.read_text()
    assert f"[FAIL] configuration: {CONFIG} holds the demo's settings" in result.stdout, result.stdout
    assert "it is the demo's own portal.yaml" in result.stdout
    line = line_of(text, f"conf: {DEMO_STATE}/slurm/slurm.conf")
    assert f"line {line}: slurm.conf: {DEMO_STATE}/slurm/slurm.conf" in result.stdout
    assert f"line {line_of(text, 'data_dir: ')}: hub.data_dir: {DEMO_STATE}/hub" in result.stdout
    assert result.stdout.rstrip().endswith("some checks FAILED")
    # Nothing past the configuration was checked: no Slurm, LDAP or node was asked.
    assert "[ok]" not in result.stdout and "Slurm controller" not in result.stdout


def test_every_production_command_refuses_the_demo_and_the_demo_marker_allows_it(tmp_path):
    for command in (["hub", "sudoers"], ["hub"], ["hub", "proxy"], ["images", "list"], ["templates", "list"],
                    ["usage"]):
        result = dsportal(tmp_path, "--config", str(CONFIG), *command)
        assert result.returncode == 2 and "holds the demo's settings" in result.stderr, (command, result.stderr)
    # Explicitly the demo: the same file is read (the sudo rule names the demo's hub account).
    allowed = dsportal(tmp_path, "--config", str(CONFIG), "hub", "sudoers", DSPORTAL_DEMO="1")
    assert allowed.returncode == 0, allowed.stderr
    assert "dsportal-hub ALL = (ALL, !root) NOPASSWD: /usr/local/libexec/dsportal/mediator" in allowed.stdout
    # Another value is not a yes.
    assert dsportal(tmp_path, "--config", str(CONFIG), "hub", "sudoers", DSPORTAL_DEMO="yes").returncode == 2


def test_a_sites_own_file_is_read_as_it_is(tmp_path):
    path, _ = site_config(tmp_path)
    result = dsportal(tmp_path, "hub", "sudoers", DSPORTAL_CONFIG=str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == hubaccount.sudo_rule("dsportal-hub", Path("/usr/local/libexec/dsportal/mediator")) == (
        "# dsportal: the hub's account dsportal-hub may run the mediator as a user, and nothing else.\n"
        "Defaults:dsportal-hub !requiretty, !lecture, env_reset\n"
        "dsportal-hub ALL = (ALL, !root) NOPASSWD: /usr/local/libexec/dsportal/mediator\n")


@pytest.mark.parametrize("old, new, key, message", [
    ("  admin_users: [dave]", "  admin_userz: [dave]", "hub.admin_userz", "Extra inputs are not permitted"),
    ("  start_timeout: 300 ", "  start_timeout: soon", "hub.start_timeout", "Input should be a valid integer"),
    ("    cpus_per_gpu: 8", "    cpus_per_gpu: eight", "profiles.0.cpus_per_gpu", "Input should be a valid integer"),
], ids=["unknown-key", "wrong-type", "wrong-type-in-a-list"])
def test_a_bad_file_is_refused_naming_the_file_the_key_and_the_line(tmp_path, old, new, key, message):
    path, text = site_config(tmp_path)
    assert old in text
    path.write_text(text.replace(old, new, 1))
    for command in (["templates", "list"], ["hub"]):  # an admin command, and the hub as it starts
        result = dsportal(tmp_path, "--config", str(path), *command)
        assert result.returncode == 2, (command, result.stdout + result.stderr)
        assert result.stderr.startswith(f"dsportal: {path} is invalid:\n"), result.stderr
        assert f"  line {line_of(text, old)}: {key}: {message}" in result.stderr, result.stderr
    checked = dsportal(tmp_path, "--config", str(path), "check")
    assert checked.returncode == 1 and f"  line {line_of(text, old)}: {key}: {message}" in checked.stdout, checked.stdout


def test_a_file_that_is_not_yaml_or_cannot_be_read_is_refused_naming_it(tmp_path):
    path, text = site_config(tmp_path)
    broken = text.replace("  bind_url: http://127.0.0.1:8000", "  bind_url: [http://127.0.0.1:8000", 1)
    path.write_text(broken)
    result = dsportal(tmp_path, "--config", str(path), "check")
    assert result.returncode == 1
    assert f"[FAIL] configuration: {path}: line " in result.stdout and "not valid YAML" in result.stdout
    assert f"at line {line_of(text, '  bind_url: ')})" in result.stdout, result.stdout
    folder = tmp_path / "a-folder.yaml"
    folder.mkdir()
    result = dsportal(tmp_path, "--config", str(folder), "templates", "list")
    assert result.returncode == 2 and result.stderr.strip() == f"dsportal: {folder}: cannot read: Is a directory"
    # A file its reader may not read: root reads any file, so the command runs as nobody.
    path.write_text(text)
    path.chmod(0o600)
    tmp_path.chmod(0o755)
    as_nobody = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    result = subprocess.run([*as_nobody, sys.executable, "-m", "portal.cli", "--config", str(path), "templates", "list"],
                            capture_output=True, text=True, timeout=120, cwd="/",
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8",
                                 "PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == f"dsportal: {path}: cannot read: Permission denied", result.stderr


def test_the_demos_commands_default_to_the_demos_file_and_nothing_else_does(monkeypatch):
    from portal.core import settings

    monkeypatch.delenv("DSPORTAL_CONFIG", raising=False)
    assert settings.config_path() == PRODUCTION_CONFIG
    assert settings.config_path(demo=True) == settings.demo_config() == CONFIG
    monkeypatch.setenv("DSPORTAL_CONFIG", "/srv/portal.yaml")
    assert settings.config_path() == settings.config_path(demo=True) == Path("/srv/portal.yaml")
    assert settings.config_path("/x.yaml") == Path("/x.yaml")
