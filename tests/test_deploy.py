"""A real cluster as docs/how-to/deploy.md brings it up: the shipped systemd units (checked by systemd itself,
no cluster needed), and the Slurm default the portal relies on: a job that names no memory gets
memory per CPU, not a whole node's (on the demo cluster)."""

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CONFIG, DSPORTAL, REPO
from democluster.slurmdaemons import MEM_MB_PER_NODE
from hubclient import scontrol_in_22_05
from portal.core.settings import parse_memory_mb

UNITS = REPO / "config" / "systemd"
HUB_UNIT, PROXY_UNIT = UNITS / "dsportal-hub.service", UNITS / "dsportal-proxy.service"
# systemd.exec(5): each of these makes NoNewPrivileges=yes for a unit with User=, and sudo then fails.
IMPLY_NO_NEW_PRIVILEGES = ("PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                           "ProtectClock", "ProtectHostname", "RestrictAddressFamilies", "RestrictNamespaces",
                           "RestrictRealtime", "RestrictSUIDSGID", "LockPersonality", "MemoryDenyWriteExecute",
                           "SystemCallFilter", "SystemCallArchitectures", "SystemCallLog", "DynamicUser")


def unit_settings(path: Path) -> dict[str, list[str]]:
    """A unit file's 'Key=value' settings (continued lines joined), every value of each key."""
    settings: dict[str, list[str]] = {}
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", ";", "[")):
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


@pytest.mark.quick
def test_systemd_accepts_the_shipped_units():
    """`systemd-analyze verify`: every key known, every value valid, the programs they start there."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian: apt-get install systemd)"
    units = sorted(UNITS.glob("*.service"))
    assert [u.name for u in units] == ["dsportal-firewall.service", "dsportal-hub.service", "dsportal-proxy.service"]
    for unit in units:
        result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, cwd=UNITS)
        # verify exits 0 on an unknown key, but says so: any output is a fault of the unit.
        assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), \
            f"{unit.name}:\n{result.stdout}{result.stderr}"


@pytest.mark.quick
def test_restarting_the_hub_leaves_the_proxy_and_its_routes_alone():
    hub, proxy = unit_settings(HUB_UNIT), unit_settings(PROXY_UNIT)
    assert "dsportal-proxy.service" in " ".join(hub["Wants"]) and "dsportal-proxy.service" in " ".join(hub["After"])
    for binding in ("PartOf", "BindsTo", "Requires", "PropagatesStopTo"):
        assert binding not in proxy, f"the proxy must not stop with the hub ({binding}=)"
    assert "configurable-http-proxy" in proxy["ExecStart"][0] and "proxy.js" in proxy["ExecStart"][0]
    assert "configurable-http-proxy" not in hub["ExecStart"][0]
    # proxy.js where the package installs it whatever the Python (Debian 12: 3.11, Debian 13: 3.13)
    script = proxy["ExecStart"][0].split()[1]
    assert script == "/opt/dsportal/env/share/dsportal/proxy.js" and "python3" not in proxy["ExecStart"][0]
    if Path("/opt/dsportal/env/bin/python").exists():  # installed (make deps): the same file as the package's
        assert Path(script).is_file(), f"{script} is not installed: make deps installs it (pyproject data-files)"
        assert Path(script).read_bytes() == (Path(__file__).resolve().parent.parent / "portal/hub/proxy.js").read_bytes()
    # The other way round, a proxy restart (its routes are in its memory only) restarts the hub, which
    # puts every route back as it starts.
    assert hub["PartOf"] == ["dsportal-proxy.service"]


@pytest.mark.quick
def test_hub_and_proxy_run_as_the_unprivileged_account_with_their_secret_off_the_command_line():
    hub, proxy = unit_settings(HUB_UNIT), unit_settings(PROXY_UNIT)
    for unit in (hub, proxy):
        assert unit["User"] == ["dsportal-hub"] and unit["Group"] == ["dsportal-hub"]
        assert unit["EnvironmentFile"] == ["/etc/dsportal/proxy-token.env"]
        assert not re.search(r"token|secret|password", unit["ExecStart"][0], re.IGNORECASE), unit["ExecStart"]
    assert hub["ExecStart"] == ["/opt/dsportal/env/bin/dsportal --config /etc/dsportal/portal.yaml hub"]
    # The public TLS key reaches the proxy as a systemd credential: the file itself stays root's.
    assert "--ssl-key %d/" in proxy["ExecStart"][0]
    assert any(c.startswith("public-tls.key:") for c in proxy["LoadCredential"])


@pytest.mark.quick
def test_the_hub_may_still_use_sudo_and_the_proxy_may_gain_nothing():
    hub, proxy = unit_settings(HUB_UNIT), unit_settings(PROXY_UNIT)
    assert hub.get("NoNewPrivileges", ["no"]) == ["no"]
    implying = [key for key in IMPLY_NO_NEW_PRIVILEGES if key in hub]
    assert not implying, f"these make NoNewPrivileges=yes for the hub, and sudo fails: {implying}"
    assert "ProtectHome" not in hub, "the mediator writes session certificates into the users' homes"
    assert proxy["NoNewPrivileges"] == ["yes"] and proxy["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"]


def tres_memory_mb(tres: str) -> int:
    """The memory in scontrol's TRES field (cpu=2,mem=12000M,node=1 or mem=48G), in MB."""
    return parse_memory_mb(dict(item.partition("=")[::2] for item in tres.split(","))["mem"])


def job_fields(job_id: int) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True,
                         check=True).stdout
    return scontrol_in_22_05(dict(field.partition("=")[::2] for field in out.split()))


def default_mem_per_cpu_mb() -> int:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"^DefMemPerCPU\s*=\s*(\d+)", out, re.MULTILINE)
    assert found, "slurm.conf has no DefMemPerCPU"
    return int(found.group(1))


def wait_running(job_id: int, timeout: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    fields = job_fields(job_id)
    while fields.get("JobState") == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.5)
        fields = job_fields(job_id)
    return fields


def plain_sbatch(user: str, node: str) -> int:
    """A user's `sbatch --wrap` with no --mem: 2 CPUs on ``node`` for a few minutes."""
    result = subprocess.run(["runuser", "-u", user, "--", "sbatch", "--parsable", "--partition=cpu", "--cpus-per-task=2",
                             f"--nodelist={node}", "--time=5", "--output=/dev/null", "--wrap", "sleep 300"],
                            capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, f"sbatch as {user}: {result.stderr}"
    return int(result.stdout.strip().split(";")[0])


@pytest.fixture
def plain_jobs(portal):
    submitted = []
    yield submitted
    for job_id in submitted:
        subprocess.run(["scancel", str(job_id)], capture_output=True)


def test_a_job_without_mem_gets_memory_per_cpu_and_leaves_the_node_to_others(plain_jobs):
    per_cpu = default_mem_per_cpu_mb()
    plain_jobs.append(plain_sbatch("alice", "node2"))
    first = wait_running(plain_jobs[0])
    assert first["JobState"] == "RUNNING", first
    assert parse_memory_mb(first["MinMemoryCPU"]) == per_cpu
    assert tres_memory_mb(first["TRES"]) == 2 * per_cpu < MEM_MB_PER_NODE
    # Another user's job fits beside it: the first did not take the node's memory.
    plain_jobs.append(plain_sbatch("bob", "node2"))
    second = wait_running(plain_jobs[1])
    assert second["JobState"] == "RUNNING", f"{second.get('JobState')} ({second.get('Reason')})"
    assert second["NodeList"] == first["NodeList"] == "node2"


def test_check_says_jobs_without_mem_get_a_default(portal):
    result = subprocess.run([DSPORTAL, "--config", str(CONFIG), "check"], capture_output=True, text=True)
    line = next((found for found in result.stdout.splitlines() if "default job memory" in found), "")
    assert line.strip() == f"[ok] default job memory: a job without --mem gets {default_mem_per_cpu_mb()} MB per CPU " \
                           "(DefMemPerCPU)", result.stdout
