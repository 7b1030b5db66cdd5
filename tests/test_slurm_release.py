"""The Slurm release dsportal finds, and what `dsportal check` says of it (portal/slurm/slurmparse.py,
docs/reference/compatibility.md). No cluster needed: the demo's own release is tried in test_check.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from portal.slurm.slurmparse import TESTED_RELEASES, describe_releases, parse_release

pytestmark = pytest.mark.quick

TABLE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "compatibility.md"


@pytest.mark.parametrize("said, version", [
    ("slurm 22.05.8\n", "22.05.8"),  # sinfo --version
    ("slurm 24.11.5", "24.11.5"),
    ("slurm-wlm 26.05.5-1", "26.05.5"),
    ("22.05.8", "22.05.8"),  # scontrol show config's SLURM_VERSION
    ("", None), ("slurm", None), ("version 2", None),
])
def test_the_release_is_read_from_what_slurm_says(said, version):
    assert parse_release(said) == version


def test_a_release_the_suite_passed_on_is_named_without_a_warning():
    words, warning = describe_releases("22.05.8", "22.05.8")
    assert not warning
    assert words == ("slurmctld 22.05.8, this host's commands 22.05.8: dsportal's cluster suite passed on Slurm 22.05 "
                     f"({TESTED_RELEASES['22.05']}, docs/reference/compatibility.md)")


def test_a_release_no_run_has_used_is_said_plainly():
    assert "23.02" not in TESTED_RELEASES  # a release no run of scripts/compatibility.sh has used
    words, warning = describe_releases("23.02.7", "23.02.7")
    tested = ", ".join(sorted(TESTED_RELEASES))
    assert warning and f"no run of dsportal's tests has used Slurm 23.02 yet (only {tested})" in words


def test_commands_of_another_release_than_slurmctld_are_a_warning():
    words, warning = describe_releases("24.11.5", "22.05.8")
    assert warning and "this host's commands are of another release than slurmctld" in words
    words, warning = describe_releases(None, "22.05.8")
    assert warning and "did not say its version" in words


def test_the_table_has_a_passed_row_for_each_release_the_code_calls_tested():
    rows = [line for line in TABLE.read_text().splitlines() if re.match(r"\| \d{2}\.\d{2}\.\d+ \|", line)]
    passed = {row.split("|")[1].strip().rsplit(".", 1)[0]: row for row in rows
              if row.split("|")[-2].strip().startswith("whole suite passed")}
    assert set(passed) == set(TESTED_RELEASES), rows
    for line, date in TESTED_RELEASES.items():
        assert f"| {date} |" in passed[line]


# ---- where releases differ: the Slurm layer speaks to the release it finds ---------------------------------
def test_each_node_is_listed_by_the_command_of_the_release_found():
    from portal.slurm.slurmparse import nodes_argv

    assert nodes_argv("22.05.8") == ["sinfo", "--json"]  # 22.05's sinfo --json lists each node
    for newer in ("23.02.1", "24.11.5", "26.05.5", None):  # from 23.02 on it groups them; not known: the newer
        assert nodes_argv(newer) == ["scontrol", "--json", "show", "nodes"]


def test_a_nodes_state_reads_the_same_from_either_release():
    from portal.slurm.slurmparse import Node, parse_sinfo_json

    old = {"name": "node1", "state": "idle", "gres": "gpu:4", "gres_used": "gpu:1", "cpus": 96, "alloc_cpus": 8}
    new = {**old, "state": ["IDLE", "DRAIN"], "address": "198.51.100.11"}
    assert Node.from_json(old).state == "idle" and Node.from_json(old).usable
    drained = Node.from_json(new)
    assert drained.state == "idle+drain" and not drained.usable
    assert (drained.gpus, drained.alloc_gpus, drained.address) == (4, 1, "198.51.100.11")
    assert [n.name for n in parse_sinfo_json(json.dumps({"nodes": [new], "last_update": {}}))] == ["node1"]
    # Power saving is not unusable (Slurm powers the node up for a job); an answer that lists no nodes is an error.
    assert Node.from_json({**new, "state": ["IDLE", "POWERED_DOWN"]}).usable
    from portal.slurm.slurmparse import SlurmError

    with pytest.raises(SlurmError, match="listed no nodes"):
        parse_sinfo_json(json.dumps({"sinfo": [], "errors": []}))  # 23.02's sinfo --json, asked of a 22.05 reading


def test_the_clusters_own_commands_come_first_on_a_jobs_path():
    from portal.slurm import mediator
    from portal.slurm.slurmclient import slurm_first

    assert slurm_first("/opt/slurm/bin", "/usr/local/bin:/usr/bin:/bin") == "/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin"
    assert slurm_first("/usr/bin", "/usr/local/bin:/usr/bin:/bin") == "/usr/local/bin:/usr/bin:/bin"  # as it was
    env = mediator.slurm_env({"bin_dir": "/opt/slurm/bin", "slurm_conf": ""})
    assert env == {"PATH": f"/opt/slurm/bin:{mediator.SAFE_PATH}"}  # configless: no SLURM_CONF
    assert mediator.slurm_env({"bin_dir": "/usr/bin", "slurm_conf": "/etc/slurm/slurm.conf"}) == {
        "PATH": mediator.SAFE_PATH, "SLURM_CONF": "/etc/slurm/slurm.conf"}


def test_check_says_where_the_commands_found_slurm_conf(tmp_path):
    from portal.admin.check import config_source

    cache = tmp_path / "slurm.conf"
    assert config_source("/etc/slurm/slurm.conf", cache) == "/etc/slurm/slurm.conf (portal.yaml's slurm.conf)"
    assert config_source(None, cache).startswith("configless: no copy here")
    cache.write_text("ClusterName=x\n")
    assert config_source(None, cache).startswith(f"configless: this host's commands read {cache}, the copy sackd")


def test_the_demo_on_another_release_reads_its_commands_configless(tmp_path, monkeypatch):
    """democluster's portal.yaml for make demo SLURM=24.11: the checkout's, with slurm.bin_dir that release's and no
    slurm.conf; everything else (comments too) as it was."""
    import democluster.base as base
    from portal.core.settings import load

    for name, value in (("SLURM_RELEASE", "24.11"), ("CONFIGLESS", True), ("STATE", tmp_path)):
        monkeypatch.setattr(base, name, value)
    source = Path(__file__).resolve().parent.parent / "config" / "portal.yaml"
    derived = base.release_config(source)
    assert derived == tmp_path / "config" / "portal-24.11.yaml"
    changed = [(a, b) for a, b in zip(source.read_text().splitlines(), derived.read_text().splitlines(), strict=True)
               if a != b]
    assert [b.split("#")[0].strip() for _, b in changed] == ["conf: null", "bin_dir: /opt/dsportal-slurm/24.11/bin"]
    assert base.release_config(derived) == derived  # its own path: derived from the checkout's again
    settings = load(derived)
    assert settings.slurm.conf is None and str(settings.slurm.bin_dir) == "/opt/dsportal-slurm/24.11/bin"


def test_a_release_is_asked_for_or_the_one_the_demo_runs(tmp_path, monkeypatch):
    import democluster.base as base

    monkeypatch.setattr(base, "STATE", tmp_path)
    monkeypatch.delenv("DSPORTAL_SLURM", raising=False)
    assert base._release() == ""  # a fresh machine: Debian's own
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "release").write_text("24.11\n")
    assert base._release() == "24.11"  # the release the demo's state is of
    for asked, release in (("22.05", ""), ("", ""), ("26.05", "26.05")):
        monkeypatch.setenv("DSPORTAL_SLURM", asked)
        assert base._release() == release
    monkeypatch.setenv("DSPORTAL_SLURM", "../../tmp/x")
    with pytest.raises(SystemExit, match="a Slurm release is YY.MM"):
        base._release()


def test_a_jobs_gpus_read_the_same_from_either_release():
    from portal.slurm.slurmparse import _gpu_count

    assert [_gpu_count(tres) for tres in ("gres:gpu:2", "gres/gpu:2", "gres/gpu:h100:4,gres/shard:3", "gres:shard:1", "")] \
        == [2, 2, 4, 0, 0]


def test_the_mpi_plugins_and_the_private_tmp_are_read_from_either_release():
    from portal.slurm.slurmparse import mpi_plugins, private_tmp_plugin

    listed = "MPI plugin types are...\n\tnone\n\tpmix\n\tpmi2\nspecific pmix plugin versions available: pmix_v4\n"
    assert mpi_plugins(listed) == {"none", "pmix", "pmi2"}
    assert mpi_plugins("MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n") == {"none", "cray_shasta", "pmi2"}
    assert private_tmp_plugin({"JobContainerType": "job_container/tmpfs"}) == "job_container/tmpfs"  # to 25.05
    assert private_tmp_plugin({"NamespaceType": "namespace/tmpfs"}) == "namespace/tmpfs"  # 25.11 on
    assert private_tmp_plugin({"JobContainerType": "(null)"}) is None


def test_the_running_sessions_states_are_asked_alone_where_the_release_can():
    from portal.slurm.slurmparse import SlurmError, job_states_argv, parse_job_states

    for older in ("22.05.8", None):  # 22.05 has no --only-job-state; a release not known: the full listing
        assert job_states_argv("squeue", older, [7]) is None
    for newer in ("23.02.1", "24.11.5", "26.05.5"):
        assert job_states_argv("/usr/bin/squeue", newer, [12, 7]) == [
            "/usr/bin/squeue", "--only-job-state", "--noheader", "--states=all", "--jobs=12,7", "--format=%i %T"]
    # As 24.11's squeue answers it (an id slurmctld forgot is not listed).
    assert parse_job_states("10894 RUNNING\n10893 COMPLETING\n\n") == {10894: "RUNNING", 10893: "COMPLETING"}
    assert parse_job_states("") == {}
    for unreadable in ("10894\n", "10894 RUNNING x\n", "x RUNNING\n", "squeue: error: Invalid job id specified\n"):
        with pytest.raises(SlurmError, match="could not be read"):
            parse_job_states(unreadable)
