"""`dsportal check`: a readable report of the real cluster, non-zero on any failure."""

import subprocess

import yaml

from conftest import CONFIG, DSPORTAL
from portal.cluster.demo import network


def check(config_path) -> subprocess.CompletedProcess:
    return subprocess.run([DSPORTAL, "--config", str(config_path), "check"], capture_output=True, text=True)


def test_check_passes_on_the_demo_cluster(portal):
    result = check(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    for name in ("configuration", "Slurm controller", "profile gpu", "profile cpu", "LDAP", "user environment",
                 "node firewall", "job confinement", "private /tmp", "private processes"):
        assert f"[ok] {name}" in result.stdout
    # Each compute node by its own address on the node network, reached from the login node.
    for node in ("node1", "node2"):
        assert f"[ok] node {node}: {network.address(node)}: reached" in result.stdout, result.stdout


def test_check_names_each_broken_part(portal, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    next(p for p in config["profiles"] if p["name"] == "cpu")["partition"] = "nosuchpartition"
    config["ldap"]["server_port"] = 1  # nothing listens there
    config["session"]["environment"] = "/root"  # exists, unusable
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    result = check(path)
    assert result.returncode == 1
    assert "[FAIL] profile cpu: partition 'nosuchpartition' not in sinfo" in result.stdout
    assert "[FAIL] LDAP" in result.stdout
    assert "[FAIL] user environment" in result.stdout
    assert "[ok] profile gpu" in result.stdout


def test_check_reports_slurm_outage_and_invalid_config(portal, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    bad_conf = tmp_path / "slurm.conf"
    bad_conf.write_text(open(config["slurm"]["conf"]).read().replace("SlurmctldPort=6817", "SlurmctldPort=6999"))
    config["slurm"]["conf"] = str(bad_conf)
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    result = check(path)
    assert result.returncode == 1
    assert "[FAIL] Slurm controller: not reachable" in result.stdout
    assert "[WARN] job confinement: not known (" in result.stdout

    config["profiles"][0]["cpus_per_gpu"] = -8
    path.write_text(yaml.safe_dump(config))
    result = check(path)
    assert result.returncode == 1
    assert "profiles.0.cpus_per_gpu" in result.stdout
