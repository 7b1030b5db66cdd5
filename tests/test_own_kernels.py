"""A user's own environments as kernels in her session: registered with `ipykernel install --user`,
run in her slice (on the host, or in an image of her profile), and broken ones named and refused in
words (the demo's real sessions, real venvs made by the user herself)."""

import json

import pytest

from hubclient import active_jobs

HOME = "/home/alice"
KERNELS = f"{HOME}/.local/share/jupyter/kernels"

MAKE_ENVS = f"""
import json, os, shutil, subprocess, sys
shutil.rmtree('{HOME}/own-envs', ignore_errors=True)
for name in ('mine', 'image', 'gone', 'bare', 'elsewhere'):
    shutil.rmtree('{KERNELS}/' + name, ignore_errors=True)
run = lambda *a: subprocess.run(a, check=True, capture_output=True, text=True)
run('/usr/bin/python3', '-m', 'venv', '--system-site-packages', '{HOME}/own-envs/mine')
# No package index reaches the nodes: her venv takes ipykernel from the session's environment (a .pth
# file, as a venv on an offline cluster takes a site's shared packages); in the image, from the image's
# own Python (--system-site-packages), where that folder is not.
import ipykernel
site = os.path.dirname(os.path.dirname(ipykernel.__file__))
mine_site = subprocess.run(['{HOME}/own-envs/mine/bin/python', '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                           check=True, capture_output=True, text=True).stdout.strip()
with open(os.path.join(mine_site, 'session-packages.pth'), 'w') as f:
    f.write(site + '\\n')
run('{HOME}/own-envs/mine/bin/python', '-m', 'ipykernel', 'install', '--user', '--name', 'mine',
    '--display-name', "Alice's venv")
run('/usr/bin/python3', '-m', 'venv', '--without-pip', '{HOME}/own-envs/bare')
def spec(name, python, **metadata):
    os.makedirs('{KERNELS}/' + name, exist_ok=True)
    with open('{KERNELS}/' + name + '/kernel.json', 'w') as f:
        json.dump({{'argv': [python, '-m', 'ipykernel_launcher', '-f', '{{connection_file}}'],
                   'display_name': name, 'language': 'python', 'metadata': metadata}}, f)
spec('image', '{HOME}/own-envs/mine/bin/python', dsportal={{'image': 'debian-python'}})
spec('gone', '{HOME}/own-envs/gone/bin/python')
spec('bare', '{HOME}/own-envs/bare/bin/python')
spec('elsewhere', '{HOME}/own-envs/mine/bin/python', dsportal={{'image': 'no-such-image'}})
# IPython's old kernels folder in her home: not one the session reads (only her Jupyter kernels folder)
os.makedirs('{HOME}/.ipython/kernels/ipython-folder', exist_ok=True)
with open('{HOME}/.ipython/kernels/ipython-folder/kernel.json', 'w') as f:
    json.dump({{'argv': ['{HOME}/own-envs/gone/bin/python', '-m', 'ipykernel_launcher', '-f', '{{connection_file}}'],
               'display_name': 'ipython-folder', 'language': 'python'}}, f)
print('made')
"""


@pytest.fixture
def envs(alice):
    alice.spawn({"profile": "cpu"})
    assert alice.run_code(MAKE_ENVS, timeout=300).strip() == "made"
    yield alice
    alice.run_code(f"import shutil\nshutil.rmtree('{HOME}/own-envs', ignore_errors=True)\n"
                   f"shutil.rmtree('{HOME}/.ipython/kernels/ipython-folder', ignore_errors=True)\n"
                   f"for n in ('mine', 'image', 'gone', 'bare', 'elsewhere'): shutil.rmtree('{KERNELS}/' + n, ignore_errors=True)")


def kernelspecs(user) -> dict:
    return user.api("GET", "/user/alice/api/kernelspecs").json()["kernelspecs"]


def test_own_venv_kernel_appears_and_runs_as_her_in_her_slice(envs):
    specs = kernelspecs(envs)
    assert specs["mine"]["spec"]["display_name"] == "Alice's venv"
    assert specs["python3"]["spec"]["display_name"] != "Alice's venv", "the portal's own kernels keep their names"
    seen = json.loads(envs.run_code(
        "import json, os, sys\nprint(json.dumps({'prefix': sys.prefix, 'uid': os.getuid(), "
        "'job': os.environ.get('SLURM_JOB_ID'), 'cgroup': open('/proc/self/cgroup').read()}))", kernel="mine"))
    assert seen["prefix"] == f"{HOME}/own-envs/mine"
    job = str(active_jobs("alice")[0]["job_id"])
    assert seen["job"] == job and f"job_{job}" in seen["cgroup"], "her kernel runs inside her session's job"


def test_own_venv_kernel_in_an_image_of_her_profile(envs):
    spec = kernelspecs(envs)["image"]["spec"]
    assert spec["argv"][:3] == ["apptainer", "exec", "--containall"]
    assert spec["metadata"]["dsportal"] == {"own": True, "status": "ok", "image": "debian-python"}
    seen = json.loads(envs.run_code(
        "import json, sys\nprint(json.dumps({'prefix': sys.prefix, 'image': open('/dsportal-image').read().strip()}))",
        kernel="image"))
    assert seen == {"prefix": f"{HOME}/own-envs/mine", "image": "debian-python"}


def test_broken_own_environments_are_named_on_the_launcher_and_refused_in_words(envs):
    specs = kernelspecs(envs)
    assert "ipython-folder" not in specs, "~/.ipython/kernels is not read: her kernels folder is the Jupyter one"
    assert specs["gone"]["spec"]["display_name"] == f"gone (unavailable: {HOME}/own-envs/gone/bin/python is missing)"
    assert specs["elsewhere"]["spec"]["display_name"].startswith(
        "elsewhere (unavailable: the image 'no-such-image' is not offered to this session (offered: ")
    for name, reason in (("gone", "is missing. Make the environment again and register it"),
                         ("elsewhere", "is not offered to this session"),
                         ("bare", f"its Python {HOME}/own-envs/bare/bin/python has no ipykernel. Install it there")):
        refused = envs.api("POST", "/user/alice/api/kernels", json={"name": name})
        assert refused.status_code == 400, refused.text
        assert refused.json()["message"].startswith(f"Your kernel '{name}'") and reason in refused.json()["message"]
    assert envs.run_code("print('still here')").strip() == "still here"
