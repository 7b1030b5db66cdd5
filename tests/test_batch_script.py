"""The session batch script: the exact slice, rendered with escaping."""

import pytest

from conftest import CONFIG
from portal.core.rules import RequestError, slice_for
from portal.core.settings import load
from portal.core.templating import render

pytestmark = pytest.mark.quick


def script(**overrides):
    profile = load(CONFIG).profile("gpu")
    chosen = slice_for(profile, overrides.pop("gpus", None), overrides.pop("walltime", None))
    context = dict(job_name="dsportal-alice", partition=profile.partition, gpus=chosen.gpus, cpus=chosen.cpus,
                   mem_mb=chosen.mem_mb, walltime=chosen.walltime, log_path="/home/alice/.dsportal/logs/session-%j.log",
                   workdir="/home/alice", profile=profile.model_dump(), environment="/opt/dsportal/env",
                   command=["/opt/dsportal/env/bin/python", "-m", "portal.session.singleuser",
                            "/opt/dsportal/env/bin/jupyterhub-singleuser"],
                   catalog="", umask="077")
    context.update(overrides)
    return render("session.sbatch.j2", **context)


def test_default_slice_is_one_gpu_eight_cores_48g_eight_hours():
    text = script()
    for line in ("#SBATCH --gres=gpu:1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=49152M",
                 "#SBATCH --time=08:00:00", "#SBATCH --partition=gpu", "#SBATCH --nodes=1", "#SBATCH --ntasks=1"):
        assert line in text.splitlines()


def test_cpus_and_memory_follow_the_gpu_count():
    text = script(gpus=2)
    assert "#SBATCH --cpus-per-task=16" in text and "#SBATCH --mem=98304M" in text


def test_values_that_could_smuggle_syntax_are_refused():
    with pytest.raises(ValueError):
        script(workdir="/home/alice\n#SBATCH --uid=0")
    with pytest.raises(ValueError):
        script(job_name="x $(id)")


def test_shell_values_are_quoted():
    text = script(environment="/opt/env with space")
    assert "export PATH='/opt/env with space/bin'" in text


@pytest.mark.parametrize("gpus", [3, -1, "2; id", "1.5", True])
def test_gpu_counts_outside_the_choices_are_refused(gpus):
    with pytest.raises(RequestError):
        slice_for(load(CONFIG).profile("gpu"), gpus)


@pytest.mark.parametrize("walltime", ["13:00:00", "8h", "00:00:00", "1-00:00:00"])
def test_walltimes_outside_the_limit_are_refused(walltime):
    with pytest.raises(RequestError):
        slice_for(load(CONFIG).profile("gpu"), 1, walltime)


def test_session_runs_with_a_private_umask():
    lines = script().splitlines()
    assert "umask 077" in lines
    assert lines.index("umask 077") < next(i for i, line in enumerate(lines) if "portal.session.singleuser" in line)
