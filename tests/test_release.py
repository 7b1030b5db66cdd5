"""A release installs on its own: `make dist` builds the sdist and the wheel of pyproject.toml's version; the wheel,
installed into a fresh environment beside requirements.lock's packages, says its version, carries the systemd
units and the hub's sudo rule, and installs them with its own commands, no checkout needed. Its `dsportal`
refuses the packaged demo file and a missing /etc/dsportal/portal.yaml as the checkout's does.

Needs no cluster; needs the package index (or pip's cache) for requirements.lock: about 70 s on the machine
it was written on."""

from __future__ import annotations

import subprocess
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO
from portal.admin import hubaccount
from portal.core.settings import DEMO_STATE, PRODUCTION_CONFIG

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SHIPPED = [f"systemd/{name}" for name in hubaccount.LOGIN_UNITS + hubaccount.FIREWALL_UNITS] + [hubaccount.SUDO_RULE]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(the dist folder, a fresh environment with the wheel installed)."""
    root = tmp_path_factory.mktemp("release")
    dist = root / "dist"
    made = subprocess.run(["make", "-s", "dist", f"DIST={dist}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    env = root / "env"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(env)], check=True, timeout=120)
    pip = [str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    started = time.monotonic()
    locked = subprocess.run([*pip, "--require-hashes", "-r", str(REPO / "requirements.lock")], capture_output=True,
                            text=True, timeout=900)
    assert locked.returncode == 0, locked.stderr[-3000:]
    wheel = dist / f"dsportal-{VERSION}-py3-none-any.whl"
    installed = subprocess.run([*pip, "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    print(f"requirements.lock and the wheel installed in {time.monotonic() - started:.0f} s")
    return dist, env


def dsportal(env: Path, home: Path, *args: str, **more: str) -> subprocess.CompletedProcess:
    """The installed release's dsportal, in a clean environment, outside the checkout."""
    home.mkdir(exist_ok=True)
    clean = {"PATH": f"{env}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **more}
    return subprocess.run([str(env / "bin" / "dsportal"), *args], capture_output=True, text=True, env=clean,
                          cwd=home, timeout=120)


def test_make_dist_builds_the_wheel_and_sdist_of_pyprojects_version(release):
    dist, _ = release
    assert sorted(p.name for p in dist.iterdir()) == [f"dsportal-{VERSION}-py3-none-any.whl",
                                                     f"dsportal-{VERSION}.tar.gz"]
    wheel = zipfile.ZipFile(dist / f"dsportal-{VERSION}-py3-none-any.whl").namelist()
    sdist = tarfile.open(dist / f"dsportal-{VERSION}.tar.gz").getnames()
    for name in SHIPPED:
        assert f"dsportal_config/{name}" in wheel, name
        assert f"dsportal-{VERSION}/config/{name}" in sdist, name
    assert f"dsportal-{VERSION}.dist-info/licenses/LICENSE" in wheel
    # where the proxy unit and deploy.md find them whatever the Python version (Debian 12: 3.11, 13: 3.13)
    for name in ("proxy.js", "portal.yaml"):
        assert f"dsportal-{VERSION}.data/data/share/dsportal/{name}" in wheel, name
    # The demo cluster and its files stay in the checkout: nothing a site installs can bring the demo up.
    assert not [name for name in wheel if name.startswith(("democluster/", "dsportal_config/demo/"))]


def test_the_installed_release_says_its_version(release, tmp_path):
    _, env = release
    result = dsportal(env, tmp_path / "home", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"dsportal {VERSION}"


def test_the_units_and_the_sudo_rule_come_with_the_package_and_install_from_it(release, tmp_path):
    _, env = release
    where = subprocess.run([str(env / "bin" / "python"), "-c", "import dsportal_config, os; "
                            "print(os.path.dirname(dsportal_config.__file__))"], capture_output=True, text=True,
                           cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, check=True).stdout.strip()
    package = Path(where)
    assert package.is_relative_to(env), package  # the installed copy, not the checkout's
    for name in SHIPPED:
        assert (package / name).read_bytes() == (REPO / "config" / name).read_bytes(), name
    home, units = tmp_path / "home", tmp_path / "units"
    done = dsportal(env, home, "hub", "install-units", "--dest", str(units))
    assert done.returncode == 0, done.stderr
    done = dsportal(env, home, "firewall", "install-unit", "--dest", str(units))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in units.iterdir()) == sorted(hubaccount.LOGIN_UNITS + hubaccount.FIREWALL_UNITS)
    for unit in units.iterdir():
        assert unit.read_bytes() == (REPO / "config" / "systemd" / unit.name).read_bytes()
        assert unit.stat().st_mode & 0o777 == 0o644
    # The site's edits to a unit are kept, and said so, unless --force.
    proxy = units / "dsportal-proxy.service"
    proxy.write_text(proxy.read_text().replace("login1.cluster.example.org", "login1.site.example"))
    again = dsportal(env, home, "hub", "install-units", "--dest", str(units))
    assert again.returncode == 1 and f"kept {proxy}" in again.stderr, again.stdout + again.stderr
    assert "login1.site.example" in proxy.read_text()
    assert f"unchanged {units / 'dsportal-hub.service'}" in again.stdout
    forced = dsportal(env, home, "hub", "install-units", "--dest", str(units), "--force")
    assert forced.returncode == 0 and proxy.read_bytes() == (REPO / "config/systemd/dsportal-proxy.service").read_bytes()


def test_the_installed_release_reads_a_sites_file_and_refuses_the_packaged_demo(release, tmp_path):
    _, env = release
    home = tmp_path / "home"
    if not PRODUCTION_CONFIG.exists():
        missing = dsportal(env, home, "hub", "install-mediator")
        assert missing.returncode == 2
        assert missing.stderr.strip() == (f"dsportal: {PRODUCTION_CONFIG}: file not found; give --config or set "
                                          "DSPORTAL_CONFIG")
    packaged = next((env / "lib").glob("python3*/site-packages/dsportal_config/portal.yaml"))
    refused = dsportal(env, home, "--config", str(packaged), "hub", "install-mediator")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"dsportal: {packaged} holds the demo's settings" in refused.stderr
    assert "it is the demo's own portal.yaml" in refused.stderr
    assert f"slurm.conf: {DEMO_STATE}/slurm/slurm.conf" in refused.stderr
    # A site's file (the demo's, its paths moved): the sudo rule from the package's file, its values filled in.
    site = tmp_path / "portal.yaml"
    site.write_text(packaged.read_text().replace(str(DEMO_STATE), str(tmp_path / "site")))
    rule = dsportal(env, home, "hub", "sudoers", DSPORTAL_CONFIG=str(site))
    assert rule.returncode == 0, rule.stderr
    assert rule.stdout == hubaccount.sudo_rule("dsportal-hub", Path("/usr/local/libexec/dsportal/mediator"))
    assert "@ACCOUNT@" not in rule.stdout and "@MEDIATOR@" not in rule.stdout
