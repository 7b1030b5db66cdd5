"""Kernelspecs for the container images a session may use, written at session start in the job.

The hub puts the catalog (the profile's images and the data mounts) into the batch script;
inside the job the session's entry point (portal.session.singleuser; ``python -m portal.session.kernel.specs``
by hand) writes one kernelspec per image into a folder only this session reads (``JUPYTER_PATH``),
with the job's own CUDA_VISIBLE_DEVICES passed in. An
image that is missing or unreadable still gets a kernelspec that says why, so the launcher
shows it as unavailable and starting it fails with that reason; the session keeps working.

A container kernel talks to the server over unix sockets in the session's runtime folder (see
portal.session.kernel.kernelsockets), bound into the image at the same path. Its image's ipykernel loads
a copy of portal.session.kernel.kernelpipe (written into that folder) so that its pipe for forked
children's output is a unix socket there too, not a TCP port.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from portal.core.images import image_status
from portal.core.wholefile import write_whole
from portal.session.kernel.containers import Bind, Launch, runtime
from portal.session.tool.offer import Tools, r_argv, r_environment
from portal.upstream.patchcheck import stands_aside

if TYPE_CHECKING:
    from portal.core.settings import DataMount, Image

# Copied, not imported: the file runs inside the image's kernel, and importing it here would load
# zmq and ipykernel into every session start.
KERNEL_PIPE_SOURCE = Path(__file__).with_name("kernelpipe.py")
KERNEL_PIPE_CONFIG = "dsportal_kernel_pipe.py"  # in the runtime folder, an IPython config file for the kernel


def kernel_pipe_config(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, KERNEL_PIPE_CONFIG)


def kernel_spec(image: Image, mounts: list[DataMount], home: str, runtime_dir: str, cuda: str | None) -> dict:
    status, detail = image_status(image)
    if status != "built":
        if status == "no-runtime":
            shown, reason = "runtime not installed", f"{image.display_name} is unavailable: {detail}. Ask your admin."
        elif status == "building":  # the launcher shows it ready once built (refresh_building_kernels)
            reason = (f"{image.display_name} is {detail}: it appears on the launcher without '(being built)' "
                      "once it is ready; start it then.")
            return {
                "display_name": f"{image.display_name} ({detail})",
                "language": "python",
                "argv": [sys.executable, "-c", f"import sys; sys.exit({reason!r})", "{connection_file}"],
                "metadata": {"dsportal": {"image": image.name, "status": status, "reason": reason}},
            }
        else:
            shown = f"image {status}"
            reason = f"{image.display_name} is unavailable: image {status} ({detail}). Ask your admin to build it."
        return {
            "display_name": f"{image.display_name} (unavailable: {shown})",
            "language": "python",
            "argv": [sys.executable, "-c", f"import sys; sys.exit({reason!r})", "{connection_file}"],
            "metadata": {"dsportal": {"image": image.name, "status": status, "reason": reason}},
        }
    argv, env = container_command(image, mounts, home, runtime_dir, cuda,
                                  [image.python, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                                   f"--config={kernel_pipe_config(runtime_dir)}"])
    return {
        "display_name": image.display_name,
        "language": "python",
        "argv": argv,
        "env": env,
        "metadata": {"dsportal": {"image": image.name, "status": status, "runtime": image.runtime}},
    }


def r_kernel_spec(image: Image, mounts: list[DataMount], home: str, runtime_dir: str, cuda: str | None,
                  tools: Tools) -> dict:
    """The R kernel of an image whose catalog entry says it has R (``r``): IRkernel inside the image,
    started as the host's R kernel is (portal.session.tool.offer.R_START)."""
    argv, env = container_command(image, mounts, home, runtime_dir, cuda, r_argv("R"), r_environment(tools, home))
    return {
        "display_name": f"R in a container ({image.name})",
        "language": "R",
        "argv": argv,
        "env": env,
        "metadata": {"dsportal": {"image": image.name, "status": "built", "runtime": image.runtime, "tool": "r"}},
    }


def container_command(image: Image, mounts: list[DataMount], home: str, runtime_dir: str, cuda: str | None,
                      command: list[str], extra_env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run ``command`` as a kernel inside ``image``: the session's
    image kernels and a user's own kernel that names an image (portal.session.kernel.ownkernels)."""
    backend = runtime(image.runtime, image.runtime_binary)
    binds = [Bind(home, home), Bind(runtime_dir, runtime_dir)]
    binds += [Bind(str(m.source), m.target, m.read_only) for m in mounts]
    launch = Launch(image=str(image.path), binds=binds, gpus=bool(cuda), command=command)
    # What the kernel is told (Apptainer's --containall passes nothing else): its GPUs, its job, the
    # session's runtime folder (where its sockets are).
    env = {"CUDA_VISIBLE_DEVICES": cuda} if cuda is not None else {}
    env["JUPYTER_RUNTIME_DIR"] = runtime_dir
    # Python 3.11+ does not put the working folder (the notebook's, perhaps a shared one) first on
    # sys.path: a planted ipykernel_launcher.py there would run as her (-P for the image's Python).
    env["PYTHONSAFEPATH"] = "1"
    if os.environ.get("SLURM_JOB_ID"):
        env["SLURM_JOB_ID"] = os.environ["SLURM_JOB_ID"]
    env.update(extra_env or {})
    return backend.argv(launch), backend.environment(env)


def ensure_kernel_pipe_config(runtime_dir: str) -> str:
    """The kernel pipe's config file in the runtime folder (copied once), for kernels of other Pythons."""
    path = kernel_pipe_config(runtime_dir)
    if not os.path.exists(path):
        shutil.copyfile(KERNEL_PIPE_SOURCE, path)
    return path


BUILDING: set[str] = set()  # images this session offered while they were being built (refresh_building_kernels)


def write_kernelspecs(dest: Path, images: list[Image], mounts: list[DataMount], home: str, runtime_dir: str,
                      cuda: str | None) -> list[str]:
    written, tools = [], Tools.from_env()
    if images:
        shutil.copyfile(KERNEL_PIPE_SOURCE, kernel_pipe_config(runtime_dir))
    for image in images:
        folder = dest / "kernels" / f"dsportal-{image.name}"
        folder.mkdir(parents=True, exist_ok=True)
        spec = kernel_spec(image, mounts, home, runtime_dir, cuda)
        write_whole(folder / "kernel.json", json.dumps(spec, indent=1))  # the listing may read it meanwhile
        written.append(f"{image.name}: {spec['display_name']}")
        if getattr(image, "r", False) and spec["metadata"]["dsportal"].get("status") == "built" and tools.offers("r"):
            r_folder = dest / "kernels" / f"dsportal-{image.name}-r"
            r_folder.mkdir(parents=True, exist_ok=True)
            r_spec = r_kernel_spec(image, mounts, home, runtime_dir, cuda, tools)
            write_whole(r_folder / "kernel.json", json.dumps(r_spec, indent=1))
            written.append(f"{image.name}: {r_spec['display_name']}")
        (BUILDING.add if spec["metadata"]["dsportal"].get("status") == "building" else BUILDING.discard)(image.name)
    return written


def refresh_building_kernels(dest: Path, home: str, runtime_dir: str, cuda: str | None) -> None:
    """The kernelspecs of images that were being built, written again (the listing asks before it
    reads them): a kernel's "(being built, about N min)" counts down and becomes the kernel itself
    once its image is built, without a restart of the session."""
    if not BUILDING:
        return
    try:
        images, mounts = read_catalog(json.loads((dest / CATALOG_FILE).read_text()))
    except (OSError, ValueError):
        return
    write_kernelspecs(dest, [image for image in images if image.name in BUILDING], mounts, home, runtime_dir, cuda)


HOST_KERNEL = "python3"
LAUNCHER = ["python", "-m", "ipykernel_launcher"]  # how ipykernel's own kernelspec starts it


def write_host_kernel(dest: Path) -> str | None:
    """The session's Python 3 kernel: the environment's own kernelspec (ipykernel's), started by
    portal.session.kernelstart instead of ipykernel_launcher, into ``dest`` (on JUPYTER_PATH, before
    the environment's folder). Nothing where that kernelspec is not ipykernel's usual one."""
    source = Path(sys.prefix) / "share" / "jupyter" / "kernels" / HOST_KERNEL
    try:
        spec = json.loads((source / "kernel.json").read_text())
    except (OSError, ValueError):
        return None
    if spec.get("argv", [])[:3] != LAUNCHER:
        return None
    if stands_aside("kernel-launcher"):  # ipykernel's launcher changed: its own kernelspec, as it is
        return None
    spec["argv"] = [sys.executable, "-P", "-m", "portal.session.kernelstart", *spec["argv"][3:]]
    folder = dest / "kernels" / HOST_KERNEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
    for logo in source.glob("logo-*"):  # copies: the server serves no link out of a kernelspec's folder
        shutil.copyfile(logo, folder / logo.name)
    return f"{HOST_KERNEL}: {spec.get('display_name', HOST_KERNEL)}"


CATALOG_FILE = "catalog.json"  # in the session's folder: the images a user's own kernel may name


def read_catalog(catalog: dict) -> tuple[list, list]:
    """A catalog as the hub writes it: {"images": [...], "data_mounts": [...]}, its validated settings
    (Image and DataMount, every field), read here as they come: a session start does not import
    pydantic and the settings models for them (an import every start would wait for)."""
    return ([SimpleNamespace(**image) for image in catalog.get("images", [])],
            [SimpleNamespace(**mount) for mount in catalog.get("data_mounts", [])])


def write_catalog(dest: Path, catalog: dict, home: str, runtime_dir: str, cuda: str | None) -> list[str]:
    """The kernelspecs of a catalog; the catalog itself is kept beside them for own kernels."""
    images, mounts = read_catalog(catalog)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / CATALOG_FILE).write_text(json.dumps(catalog))
    return write_kernelspecs(dest, images, mounts, home, runtime_dir, cuda)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write this session's container kernelspecs.")
    parser.add_argument("--dest", required=True, help="folder to put on JUPYTER_PATH")
    parser.add_argument("--catalog", required=True, help='JSON: {"images": [...], "data_mounts": [...]}')
    parser.add_argument("--runtime-dir", required=True)
    args = parser.parse_args(argv)
    for line in write_catalog(Path(args.dest), json.loads(args.catalog), os.path.expanduser("~"), args.runtime_dir,
                              os.environ.get("CUDA_VISIBLE_DEVICES")):
        print(f"dsportal: kernel {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
