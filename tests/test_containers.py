"""Kernels inside container images, limited to the session's GPU slice (real Apptainer and
Charliecloud, real image)."""

import json
import os
import pwd
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from democluster import network
from hubclient import active_jobs
from portal.session.kernel.containers import ApptainerRuntime, Bind, CharliecloudRuntime, Launch, SingularityRuntime

PROBE = """
import json, os
seen = {
    "os": open("/etc/os-release").read(),
    "marker": open("/dsportal-image").read().strip(),
    "uid": os.getuid(),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "job": os.environ.get("SLURM_JOB_ID"),
    "datasets": sorted(os.listdir("/datasets")),
}
home = os.path.expanduser("~alice") if os.getuid() else "/root"
path = os.path.join("/home/alice", "written-in-container.txt")
with open(path, "w") as f:
    f.write("from the container")
seen["home_rw"] = open(path).read()
import numpy
seen["numpy"] = numpy.__version__
import socket  # the node's own name, from the cluster's /etc/hosts (not a DNS server it cannot reach)
seen["node"] = [socket.gethostname(), socket.gethostbyname(socket.gethostname())]
print(json.dumps(seen))
"""


@pytest.mark.parametrize("kernel, display_name, argv", [
    ("dsportal-debian-python", "Python 3 in a container (Debian bookworm + NumPy)",
     ["apptainer", "exec", "--containall", "--nv"]),
    ("dsportal-debian-python-ch", "Python 3 in a container (Charliecloud)", ["ch-run", "--no-passwd"]),
])
def test_container_kernel_runs_in_the_image_as_the_user_with_the_slice(alice, kernel, display_name, argv):
    alice.spawn({"profile": "gpu", "gpus": 2})
    specs = alice.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]
    assert "python3" in specs, "the host Python 3 kernel stays available"
    assert specs[kernel]["spec"]["display_name"] == display_name
    assert specs[kernel]["spec"]["argv"][:len(argv)] == argv

    host_gpus = alice.run_code("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip()
    seen = json.loads(alice.run_code(PROBE, kernel=kernel))
    assert 'VERSION_CODENAME=bookworm' in seen["os"]
    assert seen["marker"] == "debian-python"
    assert seen["uid"] == pwd.getpwnam("alice").pw_uid
    assert seen["cuda"] == host_gpus and len(seen["cuda"].split(",")) == 2
    assert seen["job"] == str(active_jobs("alice")[0]["job_id"])
    node = active_jobs("alice")[0]["nodes"]
    assert seen["node"] == [node, network.address(node)], seen["node"]
    assert "README.txt" in seen["datasets"]
    assert seen["home_rw"] == "from the container"
    with open("/home/alice/written-in-container.txt") as written:  # the real home, seen from the host
        assert written.read() == "from the container"


def test_missing_image_is_shown_unavailable_and_the_session_keeps_working(alice):
    alice.spawn({"profile": "gpu", "gpus": 1})
    spec = alice.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]["dsportal-pytorch"]["spec"]
    assert spec["display_name"] == "PyTorch 24.05 (NGC) (unavailable: image missing)"
    reason = spec["metadata"]["dsportal"]["reason"]
    assert "no image at /var/lib/dsportal-demo/images/pytorch-24.05.sif" in reason
    # Its argv only states the reason and exits; the other kernels still run.
    assert "unavailable" in " ".join(spec["argv"])
    assert alice.run_code("print('still here')").strip() == "still here"
    assert alice.run_code("print('ok')", kernel="dsportal-debian-python").strip() == "ok"


def test_cpu_profile_gets_only_the_images_it_may_use(alice):
    alice.spawn({"profile": "cpu"})
    specs = alice.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]
    assert "dsportal-debian-python" in specs
    assert "dsportal-pytorch" not in specs  # the pytorch image is for the GPU profiles only


HOST_VIEW = """
import json, os
host_tmp = os.environ.get("HOST_TMPDIR_FILE")
print(json.dumps({
    "env": sorted(os.environ),
    "host_folders": [p for p in ("/var/lib/dsportal-demo/slurm", "/opt/dsportal", "/etc/munge", "/etc/dsportal",
                                 "/home/bob", "/var/lib/dsportal-demo/nodes/node1") if os.path.exists(p)],
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "tmp": sorted(os.listdir("/tmp")),
    "devices": sorted(os.listdir("/dev")),
}))
"""


def test_apptainer_kernel_sees_its_slice_and_nothing_else_of_the_host(alice):
    """--containall: the kernel's files are its home, the data, the job's own /tmp; its processes
    are its own; its environment holds none of the session's secrets."""
    alice.spawn({"profile": "gpu", "gpus": 1})
    host = json.loads(alice.run_code(
        "import json, os; print(json.dumps({'tmp': sorted(os.listdir('/tmp')), "
        "'token': 'JUPYTERHUB_API_TOKEN' in os.environ}))"))
    assert host["token"], "the host kernel has the session's token (the container must not)"
    seen = json.loads(alice.run_code(HOST_VIEW, kernel="dsportal-debian-python"))
    assert not [name for name in seen["env"] if name.startswith(("JUPYTERHUB", "JPY_", "DSPORTAL", "SLURM_"))
                and name != "SLURM_JOB_ID"], seen["env"]
    assert seen["host_folders"] == []
    assert len(seen["processes"]) < 10, seen["processes"]  # its own process namespace, not the node's
    assert seen["tmp"] == host["tmp"], "the job's own /tmp (job_container/tmpfs), as the session sees it"
    assert not [d for d in seen["devices"] if d.startswith(("nvidia", "sd", "vd", "loop", "mem"))], seen["devices"]


@pytest.mark.quick
def test_image_of_an_uninstalled_runtime_is_unavailable_in_words(tmp_path):
    from portal.core.images import image_status
    from portal.core.settings import Image
    from portal.session.kernel.specs import kernel_spec

    image = Image(name="s", display_name="S", source="docker://x", path=tmp_path, runtime="singularity")
    status, detail = image_status(image)
    assert status == "no-runtime"
    assert detail == "singularity is not installed on this machine (singularity not found)"
    spec = kernel_spec(image, [], "/home/alice", "/tmp/rt", "0")
    assert spec["display_name"] == "S (unavailable: runtime not installed)"
    assert spec["metadata"]["dsportal"]["reason"] == (
        "S is unavailable: singularity is not installed on this machine (singularity not found). Ask your admin.")


# The Apptainer/Singularity command lines, pinned to their documented CLI:
# `apptainer exec [--nv] [--bind src:dest[:ro]] IMAGE COMMAND`, APPTAINERENV_VAR sets VAR inside.
LAUNCH = Launch(image="/images/pytorch.sif", command=["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                binds=[Bind("/home/alice", "/home/alice"), Bind("/data", "/datasets", read_only=True)])


@pytest.mark.quick
def test_apptainer_command_line():
    assert ApptainerRuntime().argv(LAUNCH) == [
        "apptainer", "exec", "--containall", "--nv", "--bind", "/tmp:/tmp", "--bind", "/home/alice:/home/alice",
        "--bind", "/data:/datasets:ro",
        "/images/pytorch.sif", "python", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    # A job's ranks: the launcher's environment and the node's /dev (one /dev/shm for the ranks of a node)
    ranks = Launch(image="/images/h", command=["python3", "-u", "train.py"], gpus=False, ranks=True,
                   binds=[Bind("/tmp/dsportal-alice-7/runtime", "/tmp/dsportal-alice-7/runtime")])
    assert ApptainerRuntime().argv(ranks) == ["apptainer", "exec", "/images/h", "python3", "-u", "train.py"]
    assert ApptainerRuntime().environment({"CUDA_VISIBLE_DEVICES": "0,1"}) == {
        "APPTAINERENV_CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.mark.quick
def test_singularity_command_line():
    argv = SingularityRuntime("/usr/local/bin/singularity").argv(LAUNCH)
    assert argv[:4] == ["/usr/local/bin/singularity", "exec", "--containall", "--nv"]
    assert SingularityRuntime().environment({"CUDA_VISIBLE_DEVICES": "2"}) == {"SINGULARITYENV_CUDA_VISIBLE_DEVICES": "2"}


@pytest.mark.quick
def test_charliecloud_binds_onto_folders_the_image_has():
    argv = CharliecloudRuntime().argv(Launch(
        image="/var/lib/dsportal-demo/images/debian-python", command=["python3"],
        binds=[Bind("/home/alice", "/home/alice"), Bind("/tmp/dsportal-alice-7/runtime", "/tmp/dsportal-alice-7/runtime"),
               Bind("/srv/data", "/datasets")]))
    assert argv == ["ch-run", "--no-passwd", "--bind=/home:/home", "--bind=/tmp:/tmp", "--bind=/srv/data:/datasets",
                    "/var/lib/dsportal-demo/images/debian-python", "--", "python3"]


@pytest.mark.quick
def test_corrupt_images_are_reported_unreadable(tmp_path):
    from portal.core.images import image_status
    from portal.core.settings import Image
    from portal.session.kernel.specs import kernel_spec

    not_an_image = tmp_path / "half-built"
    not_an_image.mkdir()
    broken_sif = tmp_path / "broken.sif"
    broken_sif.write_bytes(b"\x00" * 64)
    for image in (Image(name="a", display_name="A", source="debootstrap:bookworm", path=not_an_image,
                        runtime="charliecloud"),
                  Image(name="b", display_name="B", source="docker://x", path=broken_sif, runtime="apptainer")):
        status, detail = image_status(image)
        assert status == "unreadable", detail
        spec = kernel_spec(image, [], "/home/alice", "/tmp/rt", "0")
        assert spec["display_name"].endswith("(unavailable: image unreadable)")


BUILT_IMAGE = "/var/lib/dsportal-demo/images/debian-python"  # the demo's, built before the tests


@pytest.mark.quick
def test_an_image_being_built_says_so_and_becomes_its_kernel_when_built(tmp_path):
    """While a builder (make demo's, in the background) keeps its mark fresh, a queued image is "being
    built, about N min" on the launcher, in a job's refusal and on the form; once built, the same
    session's listing offers the kernel itself; a mark its builder stopped touching is read as gone."""
    from portal.core.images import HEARTBEAT, heartbeat, image_status, queue
    from portal.core.rules import RequestError, _image
    from portal.core.settings import Image
    from portal.session.kernel import specs as kernels

    image = Image(name="later", display_name="Later", source="debootstrap:bookworm", path=tmp_path / "images" / "later",
                  runtime="apptainer")
    assert image_status(image)[0] == "missing"
    queue([image], wheels_in=300)  # an image without wheels does not wait for them
    status, detail = image_status(image)
    assert (status, detail) == ("building", "being built, about 3 min"), detail
    # The launcher: the kernel's name says so, starting it says when to come back.
    session = tmp_path / "session"
    catalog = {"images": [image.model_dump(mode="json")], "data_mounts": []}
    assert kernels.write_catalog(session, catalog, "/home/alice", str(tmp_path), None) == [
        "later: Later (being built, about 3 min)"]
    spec = json.loads((session / "kernels/dsportal-later/kernel.json").read_text())
    assert spec["metadata"]["dsportal"] == {"image": "later", "status": "building", "reason": (
        "Later is being built, about 3 min: it appears on the launcher without '(being built)' once it is ready; "
        "start it then.")}
    # A job asking for it is refused in words, and nothing is submitted.
    policy = SimpleNamespace(images_for=lambda profile: [image])
    with pytest.raises(RequestError, match="image later is being built, about 3 min: launch the job again once"):
        _image("later", policy, SimpleNamespace(display_name="GPU"), image_status)
    # Built (here: the demo's built image appears at its path): the listing offers the kernel itself.
    image_path = Path(image.path)
    image_path.symlink_to(BUILT_IMAGE)
    kernels.refresh_building_kernels(session, "/home/alice", str(tmp_path), None)
    spec = json.loads((session / "kernels/dsportal-later/kernel.json").read_text())
    assert spec["display_name"] == "Later" and spec["argv"][:3] == ["apptainer", "exec", "--containall"]
    assert "later" not in kernels.BUILDING
    # A builder that died: its heartbeat ends with it (at once), its mark goes stale, and nothing
    # claims the image is coming.
    image_path.unlink()
    marker = image_path.with_name("later.queued")
    assert image_status(image)[0] == "building"
    gone = subprocess.Popen(["true"])
    gone.wait()
    started = time.monotonic()
    heartbeat([image], parent=gone.pid)
    assert time.monotonic() - started < 1
    old = time.time() - 3 * HEARTBEAT - 1
    os.utime(marker, (old, old))
    assert image_status(image)[0] == "missing"


@pytest.mark.quick
def test_the_form_says_which_images_are_still_being_built():
    from portal.core.templating import render

    html = render("spawn_form.html.j2", rows=[], default="", mail={"address": "", "note": ""}, last={},
                  building=[("PyTorch + Horovod", "being built, about 4 min")])
    assert "Some container images are still being built" in html
    assert "<b>PyTorch + Horovod</b> (being built, about 4 min)" in html
    assert "dsportal-building" not in render("spawn_form.html.j2", rows=[], default="", mail={"address": "", "note": ""},
                                             last={}, building=[])


def test_build_extras_runs_one_at_a_time(tmp_path):
    """scripts/build-extras.sh (make demo's background build, make test's first step): while one runs,
    a second in the background leaves the work to it, and one in the foreground waits for it, then
    finds everything built."""
    import sys

    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DSPORTAL_DEMO_DIR": str(tmp_path)}
    (tmp_path / "run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                               "f = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600); "  # as a builder makes it
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(4)",
                               str(tmp_path / "run/extras.lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    copy = tmp_path / "run" / "build-extras.copy"  # what --background runs: a copy of its own
    copy.write_text((repo / "scripts/build-extras.sh").read_text())
    second = subprocess.run(["bash", str(copy), "--in-background", str(repo)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "another build is running: left to it" in second.stdout, second
    waited = subprocess.run(["bash", str(repo / "scripts/build-extras.sh")], env=env, capture_output=True, text=True,
                            timeout=600)
    holder.wait()
    assert waited.returncode == 0, waited.stdout[-2000:] + waited.stderr[-2000:]
    assert "waiting for the build already running" in waited.stdout and "[extras] done in" in waited.stdout


def test_images_build_makes_a_sif_or_a_sandbox_that_users_run(tmp_path):
    """`dsportal images build` runs the real `apptainer build`: a .sif path gets a SIF file, any other
    path a sandbox folder, readable by users, which alice runs."""
    import os
    import shutil
    import subprocess

    import yaml

    from conftest import CONFIG, DSPORTAL

    root = tmp_path / "root"  # a tiny root folder: /bin/true and what it links
    for path in ("/usr/bin/true", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(path), root / path.lstrip("/"))
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text("ID=tiny\n")
    built = Path(tempfile.mkdtemp(prefix="dsportal-images-", dir="/var/tmp"))  # users reach it (not pytest's 0700)
    os.chmod(built, 0o755)
    try:
        config = yaml.safe_load(CONFIG.read_text())
        config["images"] = [
            {"name": "tiny-sif", "display_name": "T", "source": str(root), "path": str(built / "tiny.sif"),
             "python": "/usr/bin/true"},
            {"name": "tiny-sandbox", "display_name": "T", "source": str(root), "path": str(built / "tiny"),
             "python": "/usr/bin/true"}]
        path = tmp_path / "portal.yaml"
        path.write_text(yaml.safe_dump(config))
        for name in ("tiny-sif", "tiny-sandbox"):
            done = subprocess.run([DSPORTAL, "--config", str(path), "images", "build", name], capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
        assert (built / "tiny.sif").read_bytes()[:64].lower().count(b"singularity") == 1
        assert (built / "tiny/.singularity.d").is_dir() and (built / "tiny/usr/bin/true").is_file()
        listed = subprocess.run([DSPORTAL, "--config", str(path), "images", "list"], capture_output=True, text=True)
        assert "tiny-sandbox     built" in listed.stdout, listed.stdout
        ran = subprocess.run(["runuser", "-u", "alice", "--", "apptainer", "exec", "--containall", str(built / "tiny"),
                              "/usr/bin/true"], capture_output=True, text=True, cwd="/", timeout=60)
        assert ran.returncode == 0, ran.stderr
    finally:
        shutil.rmtree(built)
