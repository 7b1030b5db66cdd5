"""`dsportal check`: a readable report of the real cluster, non-zero on any failure."""

import subprocess

import yaml

from conftest import CONFIG, DSPORTAL
from democluster import network
from democluster.base import CONFIGLESS, SLURM_RELEASE, slurm_conf_path
from portal.slurm.slurmparse import describe_releases


def check(config_path) -> subprocess.CompletedProcess:
    return subprocess.run([DSPORTAL, "--config", str(config_path), "check"], capture_output=True, text=True)


def test_check_passes_on_the_demo_cluster(portal):
    result = check(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    for name in ("configuration", "Slurm controller", "profile gpu", "profile cpu", "LDAP", "user environment",
                 "node firewall", "job confinement", "private /tmp", "private processes", "notebook schedules",
                 "terminal", "R kernel", "git"):
        assert f"[ok] {name}" in result.stdout
    # The release found (make test SLURM=...: that one), named; a warning until a whole suite passed on it.
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    words, warning = describe_releases(version, version)
    assert f"[{'WARN' if warning else 'ok'}] Slurm release: {words}" in result.stdout, result.stdout
    assert ("dsportal's cluster suite passed on Slurm 22.05" in words) == (not SLURM_RELEASE)
    # Where the commands found slurm.conf: configless on another release (sackd's copy), else portal.yaml's.
    where = "configless: this host's commands read /run/slurm/conf/slurm.conf" if CONFIGLESS else \
        f"{slurm_conf_path()} (portal.yaml's slurm.conf)"
    assert f"[ok] Slurm configuration: {where}" in result.stdout, result.stdout
    # The demo's login node guards the hub's ports as deploy.md section 6 does: the compute nodes and itself only.
    nodes = ", ".join(network.address(node) for node in ("node1", "node2", "node3"))
    assert f"[ok] hub's ports: 8081, 8082 answer only this host and {nodes}" in result.stdout, result.stdout
    assert "computes 55 (profiles gpu, staff, course, class, class-gpu, cpu, scavenger)" in result.stdout  # R, tried as a user
    # The demo keeps its shares on a node of their own (partition share), as Slurm 22.05 would mix them.
    assert "[ok] GPU shares class-gpu: 4 shares per GPU on node3" in result.stdout, result.stdout
    # Each compute node by its own address on the node network, reached from the login node.
    for node in ("node1", "node2", "node3"):
        assert f"[ok] node {node}: {network.address(node)}: reached" in result.stdout, result.stdout


def test_check_names_each_broken_part(portal, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    next(p for p in config["profiles"] if p["name"] == "cpu")["partition"] = "nosuchpartition"
    config["ldap"]["server_port"] = 1  # nothing listens there
    config["session"]["environment"] = "/root"  # exists, unusable
    # Whole GPUs where the shares are: Slurm 22.05 may put a whole-GPU job on a GPU whose shares run.
    next(p for p in config["profiles"] if p["name"] == "staff")["partition"] = "share"
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    result = check(path)
    assert result.returncode == 1
    assert ("[WARN] GPU shares class-gpu: 4 shares per GPU on node3; profiles staff give whole GPUs on the same "
            "nodes") in result.stdout, result.stdout
    assert "[FAIL] profile cpu: partition 'nosuchpartition' not in sinfo" in result.stdout
    assert "[FAIL] LDAP" in result.stdout
    assert "[FAIL] user environment" in result.stdout
    assert "[ok] profile gpu" in result.stdout


def test_check_says_which_tools_a_profile_offers_but_the_nodes_lack(portal, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    config["session"]["code_server"] = "/nonexistent/code-server"
    for profile in config["profiles"]:
        profile["tools"] = ["vscode"] if profile["name"] == "cpu" else []
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    result = check(path)
    assert result.returncode == 0, result.stdout  # a warning: sessions leave it out and say why
    assert "[WARN] VS Code: offered by profiles cpu but not working here" in result.stdout, result.stdout
    assert "[ok] R kernel: offered by no profile" in result.stdout


def test_check_names_the_container_runtime_and_each_image_as_a_user_sees_it(portal, tmp_path):
    result = check(CONFIG)
    # (1.4.5 as pinned; install-apptainer.sh takes unstable's newer one, and says so, once 1.4.5 is gone there)
    assert "[ok] container runtime apptainer: apptainer version 1." in result.stdout, result.stdout
    assert "[ok] container runtime charliecloud: " in result.stdout
    assert "[ok] image debian-python: apptainer, /var/lib/dsportal-demo/images/debian-python" in result.stdout
    assert "[WARN] image pytorch: missing: no image at /var/lib/dsportal-demo/images/pytorch-24.05.sif" in result.stdout

    config = yaml.safe_load(CONFIG.read_text())
    demo_image = next(i for i in config["images"] if i["name"] == "debian-python")
    root_folder = tmp_path / "root-folder"  # a debootstrap-like folder that was never made a sandbox
    (root_folder / "etc").mkdir(parents=True)
    (root_folder / "etc/os-release").write_text("ID=debian\n")
    python = root_folder / "usr/bin/python3"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    for folder in [root_folder, *root_folder.parents]:  # nobody must reach it (pytest's folders are 0700)
        if folder == folder.parent:
            break
        folder.chmod(folder.stat().st_mode | 0o055)
    config["images"] += [{**demo_image, "name": "elsewhere", "runtime_binary": "/opt/nowhere/apptainer"},
                         {**demo_image, "name": "rootonly", "path": str(root_folder)}]
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    result = check(path)
    assert result.returncode == 1
    assert ("[FAIL] container runtime apptainer: /opt/nowhere/apptainer does not run for users: runuser: failed to "
            "execute /opt/nowhere/apptainer: No such file or directory; make deps installs Apptainer") in result.stdout
    assert ("[WARN] image elsewhere: no-runtime: apptainer is not installed on this machine "
            "(/opt/nowhere/apptainer not found)") in result.stdout
    assert f"[WARN] image rootonly: unreadable: {root_folder} is a root folder, not an apptainer sandbox" in result.stdout


def test_check_reports_slurm_outage_and_invalid_config(portal, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    bad_conf = tmp_path / "slurm.conf"
    bad_conf.write_text(slurm_conf_path().read_text().replace("SlurmctldPort=6817", "SlurmctldPort=6999"))
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
