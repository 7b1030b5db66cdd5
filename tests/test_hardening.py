"""Issue 27 (items 6-8): what root and the hub run for a user runs nothing another user planted,
takes none of the hub's secrets along, reads a user's files in bounded slices, and keeps one
user's log lines out of the shared hub log. Tried as a hostile neighbour would."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import CONFIG, DSPORTAL, login
from democluster.base import paths
from hubclient import DEMO_SLURM_CONF, demo_slurm
from portal.slurm.slurmparse import LINE_CHARS

# Modules the template check's runner imports (its first: nbformat), planted in /tmp by bob.
PLANTED = ("nbformat", "nbclient")
# What a hub may hold in its environment; none of it may reach a user.
HUB_SECRETS = ("JUPYTERHUB_CRYPT_KEY", "CONFIGPROXY_AUTH_TOKEN", "NGC_API_KEY", "DSPORTAL_TEST_HUB_SECRET")


def as_user(user: str, *argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True, **kwargs)


def notebook_of(source: str) -> dict:
    return {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def planted_by_bob():
    """bob's modules in /tmp: each, imported, leaves a mark (its importer's uid) in bob's folder."""
    marks = Path(tempfile.mkdtemp(prefix="dsportal-test-marks-"))
    shutil.chown(marks, "bob")
    marks.chmod(0o1777)  # anyone's process may leave a mark: the question is whether one runs
    code = f"import os\nopen({str(marks)!r} + '/' + __name__ + '-' + str(os.getuid()), 'w').close()\n"
    planted = [Path(f"/tmp/{name}.py") for name in PLANTED]
    for path in planted:
        result = as_user("bob", "sh", "-c", 'cat > "$1" && chmod 644 "$1"', "sh", str(path), input=code)
        assert result.returncode == 0, result.stderr
    yield marks
    for path in planted:
        path.unlink(missing_ok=True)
    shutil.rmtree(marks)


def test_templates_check_runs_no_module_planted_in_tmp_and_none_of_roots_environment(portal, planted_by_bob, tmp_path):
    secret = uuid.uuid4().hex
    folder = Path(tempfile.mkdtemp(prefix="dsportal-test-templates-"))
    folder.chmod(0o755)
    (folder / "env.ipynb").write_text(json.dumps(notebook_of(
        "import os\n"
        f"leaked = sorted(k for k, v in os.environ.items() if {secret!r} in v)\n"
        "assert not leaked, f'root environment reached the notebook: {leaked}'\n"
        "assert os.environ['USER'] == 'alice' and os.environ['DSPORTAL_TEMPLATE_CHECK'] == '1'")))
    config = yaml.safe_load(CONFIG.read_text())
    config["templates"]["sources"] = [{"name": "planted", "path": str(folder)}]
    (tmp_path / "portal.yaml").write_text(yaml.safe_dump(config))
    # Root's environment as an admin's shell may have it: secrets, and a PYTHONPATH naming /tmp.
    env = {**os.environ, "NGC_API_KEY": secret, "DSPORTAL_TEST_ROOT_SECRET": secret, "PYTHONPATH": "/tmp"}
    try:
        result = subprocess.run([DSPORTAL, "--config", str(tmp_path / "portal.yaml"), "templates", "check"],
                                capture_output=True, text=True, timeout=300, env=env, cwd="/tmp")
    finally:
        shutil.rmtree(folder)
    print(result.stdout, result.stderr)
    assert "  planted          as alice (a member of datascience)" in result.stdout
    assert result.returncode == 0, result.stdout
    assert sorted(p.name for p in planted_by_bob.iterdir()) == [], "a module bob planted in /tmp ran"


def test_commands_the_hub_runs_as_a_user_get_none_of_its_secrets(portal, monkeypatch):
    secrets = {name: uuid.uuid4().hex for name in HUB_SECRETS}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    slurm = demo_slurm()
    # The mediator's own environment, as alice (the only program the hub runs as a user).
    seen = asyncio.run(slurm.run(slurm.as_user("alice", "tail", "/proc/self/environ"))).replace("\0", "\n")
    assert DEMO_SLURM_CONF is None or f"SLURM_CONF={DEMO_SLURM_CONF}" in seen.splitlines()
    assert not [name for name, value in secrets.items() if value in seen], seen


def one_origin(config: dict) -> None:
    """The second hub serves at its own address: not the main hub's users' origins."""
    config["hub"].pop("subdomain_host", None)


def test_a_session_job_gets_none_of_the_hubs_secrets(second_hub, monkeypatch):
    secrets = {name: uuid.uuid4().hex for name in HUB_SECRETS}
    secrets["JUPYTERHUB_CRYPT_KEY"] = os.urandom(32).hex()  # a valid key: the hub reads it at start
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    base = second_hub(one_origin)
    alice = login(base, "alice")
    alice.spawn({"profile": "cpu"})
    # Every process of hers (the batch script, the server, this kernel): their environments.
    found = alice.run_code(
        "import os, json\nvalues = set()\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n        values.update(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace').split('\\0'))\n"
        "    except OSError:\n        pass\n"
        f"print(json.dumps(sorted(v for v in values if any(s in v for s in {sorted(secrets.values())!r}))))")
    assert json.loads(found) == [], f"the hub's secrets reached alice's job: {found}"
    alice.stop_server()


@pytest.fixture
def fake_environment():
    """A session environment whose python writes one 100 MB line to the job's log and fails."""
    prefix = Path(tempfile.mkdtemp(prefix="test-env-", dir=paths().root))  # the nodes see it (not /tmp)
    prefix.chmod(0o755)
    (prefix / "bin").mkdir(mode=0o755)
    python = prefix / "bin" / "python"
    python.write_text("#!/bin/sh\nhead -c 100000000 /dev/zero | tr '\\0' x\necho\nexit 3\n")
    python.chmod(0o755)
    yield str(prefix)
    shutil.rmtree(prefix)


def peak_memory_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


def pid_of_hub(config: Path) -> int:
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(config).encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no hub runs with {config}")


def test_a_failed_start_with_a_huge_log_line_costs_the_hub_nothing(second_hub, fake_environment, tmp_path):
    base = second_hub(lambda config: (one_origin(config), config["session"].update(environment=fake_environment)))
    hub = pid_of_hub(tmp_path / "portal.yaml")
    alice = login(base, "alice")
    before = peak_memory_mb(hub)
    response = alice.start_server({"profile": "cpu"})
    events = alice.progress_events(timeout=120) if response.status_code == 202 else []
    message = events[-1]["message"] if events else response.json()["message"]
    grown = peak_memory_mb(hub) - before
    print(f"hub peak memory grew {grown:.0f} MB; message {len(message)} characters")
    assert "exit code 3" in message, message[:2000]
    assert "more characters]" in message and len(message) < 10 * LINE_CHARS, message[:2000]
    assert grown < 50, f"the hub's memory grew {grown:.0f} MB reading a 100 MB log line"
    # Her log's lines are hers: the hub's log names the file, and holds none of them.
    hub_log = (tmp_path / "hub.log").read_text(errors="replace")
    assert "x" * 100 not in hub_log, "alice's log lines are in the hub's log"
    assert "shown to alice" in hub_log
    for log in (Path(pwd.getpwnam("alice").pw_dir) / ".dsportal" / "logs").glob("session-*.log"):
        if log.stat().st_size > 50_000_000:  # this test's
            log.unlink()


def test_the_hub_reads_a_users_file_with_her_rights_and_in_a_bounded_slice(portal):
    """A symlink alice plants to a file only root reads, and a file of one huge line."""
    slurm = demo_slurm()
    folder = Path(tempfile.mkdtemp(prefix="dsportal-test-read-"))
    shutil.chown(folder, "alice")
    secret = folder.parent / f"{folder.name}-root-only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    try:
        assert as_user("alice", "ln", "-s", str(secret), str(folder / "session.log")).returncode == 0
        shown = asyncio.run(slurm.read_as_user("alice", str(folder / "session.log")))
        assert "root's secret" not in shown and "Permission denied" in shown, shown
        assert as_user("alice", "sh", "-c", f"head -c 5000000 /dev/zero | tr '\\0' y > {folder}/big.log").returncode == 0
        shown = asyncio.run(slurm.read_as_user("alice", str(folder / "big.log")))
        assert len(shown) < 2 * LINE_CHARS and shown.startswith("y" * LINE_CHARS), shown[:100]
    finally:
        shutil.rmtree(folder)
        secret.unlink()


def test_the_hubs_log_and_data_folder_are_for_root_alone(portal):
    hub_log = paths().log / "hub.log"
    data_dir = Path(yaml.safe_load(CONFIG.read_text())["hub"]["data_dir"])
    assert stat.S_IMODE(hub_log.stat().st_mode) & 0o077 == 0, oct(hub_log.stat().st_mode)
    assert stat.S_IMODE(data_dir.stat().st_mode) & 0o077 == 0, oct(data_dir.stat().st_mode)
    assert as_user("bob", "cat", str(hub_log)).returncode != 0
    assert as_user("bob", "ls", str(data_dir)).returncode != 0
