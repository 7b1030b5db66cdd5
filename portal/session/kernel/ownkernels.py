"""A user's own environments as kernels: what she registers with ``python -m ipykernel install --user``.

The hub's disable_user_config leaves the user's Jupyter folders out of the session (her ~/.jupyter
config must not change what her server serves), and with them her data folder's kernelspecs (and
~/.ipython/kernels, which jupyter_client would add: it is left out).
Those are hers to run, as herself, inside her own job: this kernelspec manager (ServerApp's
kernel_spec_manager_class, jupyter-config/jupyter_server_config.json) adds her kernels folder, and
only that, after the portal's own (her names never hide "python3" or an image's kernel).

Nothing is discovered at session start: Jupyter lists kernelspecs when JupyterLab asks. Each of hers
is checked then, cheaply (its program exists and may be run, the image it names is offered and
built); one that fails is listed as "<name> (unavailable: <why>)" and starting it answers why
(:func:`refusal`, raised by the session's kernel provisioner before anything starts), never a kernel that dies
without a word. A Python kernel also gets the session's private pipe for forked children's output
(portal.session.kernel.kernelpipe, as image kernels do), since its environment has no dsportal.

A kernelspec whose metadata says ``{"dsportal": {"image": "<image name>"}}`` runs inside that image,
one of those the session's profile offers, launched as the session's image kernels are (her home is
bound in: a venv there is found at the same path).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.provisioning import LocalProvisioner
from jupyter_core.paths import jupyter_data_dir, jupyter_path, jupyter_runtime_dir
from tornado import web
from traitlets import default

from portal.core import sessionvars
from portal.core.images import image_status
from portal.session.kernel.specs import (
    CATALOG_FILE,
    container_command,
    ensure_kernel_pipe_config,
    read_catalog,
    refresh_building_kernels,
)
from portal.session.tool.offer import R_KERNEL, Tools

IMPORT_CHECK_TIMEOUT = 20  # seconds for her Python to say whether it has ipykernel (a cold home on NFS)


def own_kernels_dir() -> Path:
    return Path(jupyter_data_dir()) / "kernels"


def is_ipykernel(argv: list[str]) -> bool:
    return "ipykernel_launcher" in argv[1:4] or "ipykernel" in argv[1:4]


def program_problem(program: str) -> str:
    """Why ``program`` (a kernelspec's argv[0]) cannot run on this node, or ''."""
    path = program if os.path.isabs(program) else shutil.which(program)
    if not path or not os.path.lexists(path):
        return f"{program} is missing"
    if not os.path.exists(path):
        return f"{program} is missing (a link to {os.path.realpath(path)}, which is gone)"
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        return f"{program} is not a program you may run"
    return ""


class OwnKernelSpecManager(KernelSpecManager):
    """Jupyter's kernelspec manager, plus the user's own kernels folder, each of its specs checked."""

    @default("kernel_dirs")
    def _portal_kernel_dirs(self) -> list[str]:
        """Jupyter's kernels folders (disable_user_config keeps the home out of its data path),
        without the ~/.ipython/kernels that jupyter_client adds: in the home, it would list her
        kernelspecs there unchecked, as the portal's. Her folder is the one __init__ adds. (It also
        keeps IPython, a costly import, out of the server: jupyter_client imports it for that folder.)"""
        return jupyter_path("kernels")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Last: a name in the portal's folders is found there first (jupyter_client takes the first).
        if str(own_kernels_dir()) not in self.kernel_dirs:
            self.kernel_dirs = [*self.kernel_dirs, str(own_kernels_dir())]

    @property
    def _hidden(self) -> set[str]:
        """Kernels the profile does not offer (portal.session.tool.offer): the system's R kernel."""
        return set() if Tools.from_env().offers("r") else {R_KERNEL}

    def find_kernel_specs(self) -> dict[str, str]:
        """Jupyter's listing (the launcher's and every kernel start's), after the kernels of images
        that were being built are written again (they become the kernel itself once built)."""
        folder = os.environ.get(sessionvars.SESSION_DIR, "")
        if folder:
            try:
                refresh_building_kernels(Path(folder), os.path.expanduser("~"), _runtime_dir(),
                                         os.environ.get("CUDA_VISIBLE_DEVICES"))
            except Exception as error:  # noqa: BLE001 - the listing (every other kernel) must go on
                self.log.warning("dsportal: kernels of images being built not refreshed: %s", error)
        return {name: folder for name, folder in super().find_kernel_specs().items() if name not in self._hidden}

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name in self._hidden:
            raise NoSuchKernel(kernel_name)
        spec = super().get_kernel_spec(kernel_name)
        if Path(spec.resource_dir).parent == own_kernels_dir() and kernel_name not in self._portal_names():
            self._as_own(kernel_name, spec)
        return spec

    def _portal_names(self) -> set[str]:
        """Names the portal's own folders give: those kernels are the portal's, whatever is in hers."""
        own = str(own_kernels_dir())
        names = set()
        for folder in self.kernel_dirs:
            if folder != own and os.path.isdir(folder):
                names.update(name.lower() for name in os.listdir(folder))
        return names

    def _as_own(self, kernel_name: str, spec: KernelSpec) -> None:
        asked = spec.metadata.get("dsportal") if isinstance(spec.metadata.get("dsportal"), dict) else {}
        image_name = asked.get("image") if isinstance(asked.get("image"), str) else None
        mine = {"own": True, "status": "ok"}
        problem = program_problem(spec.argv[0]) if spec.argv and not image_name else ("" if spec.argv else "its argv is empty")
        if image_name and not problem:
            mine["image"] = image_name
            problem = self._in_image(spec, image_name)
        elif is_ipykernel(spec.argv) and not problem:
            spec.argv = [*spec.argv, f"--config={ensure_kernel_pipe_config(_runtime_dir())}"]
        if problem:
            mine.update(status="unavailable", reason=(
                f"Your kernel {spec.display_name!r} ({own_kernels_dir() / kernel_name}) cannot start: {problem}. "
                "Make the environment again and register it: python -m ipykernel install --user --name "
                f"{kernel_name}, or remove it: jupyter kernelspec remove {kernel_name}."))
            spec.display_name = f"{spec.display_name} (unavailable: {problem})"
        spec.metadata = {**spec.metadata, "dsportal": mine}

    def _in_image(self, spec: KernelSpec, image_name: str) -> str:
        images, mounts = self._catalog()
        image = next((image for image in images if image.name == image_name), None)
        if image is None:
            offered = ", ".join(image.name for image in images) or "none"
            return f"the image {image_name!r} is not offered to this session (offered: {offered})"
        status, detail = image_status(image)
        if status != "built":
            return f"the image {image_name!r} is {status} ({detail})"
        command = [*spec.argv]
        if is_ipykernel(command):
            command.append(f"--config={ensure_kernel_pipe_config(_runtime_dir())}")
        spec.argv, env = container_command(image, mounts, os.path.expanduser("~"), _runtime_dir(),
                                           os.environ.get("CUDA_VISIBLE_DEVICES"), command)
        spec.env = {**env, **{key: value for key, value in spec.env.items() if key not in env}}
        return ""

    def _catalog(self) -> tuple[list, list]:
        folder = os.environ.get(sessionvars.SESSION_DIR, "")
        try:
            return read_catalog(json.loads((Path(folder) / CATALOG_FILE).read_text())) if folder else ([], [])
        except (OSError, ValueError):
            return [], []


def _runtime_dir() -> str:
    return os.environ.get("JUPYTER_RUNTIME_DIR") or jupyter_runtime_dir()


def refusal(spec: KernelSpec | None) -> str:
    """Why a kernel must not start, for a person, or '' (CheckedProvisioner asks before each start).

    The listing's check, again (an environment may have gone since the launcher showed it), and for
    the user's own Python kernels whether her Python has ipykernel: one short Python start, worth it
    against a kernel that dies and restarts five times without a word."""
    if spec is None:
        return ""
    mine = spec.metadata.get("dsportal") if isinstance(spec.metadata.get("dsportal"), dict) else {}
    if mine.get("reason"):
        return mine["reason"]
    if not mine.get("own") or mine.get("image") or not is_ipykernel(spec.argv):
        return ""
    check = ("import importlib.util, sys; "
             "sys.exit(0 if importlib.util.find_spec('ipykernel_launcher') else 3)")
    env = {**os.environ, **spec.env}
    try:
        done = subprocess.run([spec.argv[0], "-c", check], env=env, capture_output=True, text=True,
                              timeout=IMPORT_CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Your kernel {spec.display_name!r} cannot start: {spec.argv[0]} did not run ({error})."
    if done.returncode == 3:
        return (f"Your kernel {spec.display_name!r} cannot start: its Python {spec.argv[0]} has no ipykernel. "
                f"Install it there: {spec.argv[0]} -m pip install ipykernel")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"Your kernel {spec.display_name!r} cannot start: {spec.argv[0]} fails ({last})."
    return ""


def refuse_to_start(spec: KernelSpec | None) -> None:
    reason = refusal(spec)
    if reason:
        raise web.HTTPError(400, reason)


class CheckedProvisioner(LocalProvisioner):
    """Jupyter's local kernel provisioner (every kernel of a session: jupyter-config names it the
    default), refusing with the reason a kernel that cannot start. Raised here, the refusal reaches
    the kernels API as a 400 with the reason, which JupyterLab shows in its "Error Starting Kernel"
    dialog."""

    async def pre_launch(self, **kwargs):
        await asyncio.to_thread(refuse_to_start, self.kernel_spec)
        return await super().pre_launch(**kwargs)
