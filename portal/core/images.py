"""The image catalog of portal.yaml: whether each image is there (``image_status``, also asked by
sessions before they launch one) and `dsportal images`: list, build (Apptainer/Singularity), build-demo."""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from portal.core.wholefile import write_whole

if TYPE_CHECKING:  # annotations only: a session start reads images without the settings models
    from portal.core.settings import Image

DEBIAN_MIRROR = os.environ.get("DSPORTAL_DEBIAN_MIRROR", "http://deb.debian.org/debian")
MARKER = "dsportal-image"  # /dsportal-image inside an image names it: tests and users can tell where they are
PACKAGES_STAMP = "dsportal-packages"  # /dsportal-packages: the Debian packages a debootstrap: image was built with
# Beside an image: ".lock" (root's alone, held while it is built), ".queued" ({"ready_by": epoch} while a
# builder will build it, touched by the builder every HEARTBEAT seconds: users read it, and lock nothing
# a build needs), ".seconds" (how long its last build took).
QUEUED, LOCK, SECONDS = ".queued", ".lock", ".seconds"
DEFAULT_BUILD_SECONDS = 180  # a debootstrap: image on 2 cores, until one was built here
HEARTBEAT = 20  # seconds between a builder's touches of its images' .queued; three missed: it is gone


def _beside(image: Image, suffix: str) -> Path:
    target = Path(image.path)
    return target.with_name(target.name + suffix)


def building_detail(image: Image) -> str | None:
    """'being built, about N min' for an image not there yet that a live builder is making, else None
    (two stats: the hub asks it for every form it renders)."""
    return None if Path(image.path).exists() else _building_text(being_built(image))


def _building_text(left: int | None) -> str | None:
    return None if left is None else f"being built, about {math.ceil(left / 60)} min"


def being_built(image: Image) -> int | None:
    """Seconds until an image a live builder is making (or will make) should be ready, else None."""
    marker = _beside(image, QUEUED)
    try:
        if time.time() - marker.stat().st_mtime > 3 * HEARTBEAT:
            return None  # its builder stopped touching it: gone
        queued = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    ready_by = queued.get("ready_by") if isinstance(queued, dict) else None
    left = ready_by - time.time() if isinstance(ready_by, int | float) else DEFAULT_BUILD_SECONDS
    return max(60, int(left))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def heartbeat(images: list[Image], parent: int | None = None) -> None:
    """Touches the .queued markers of ``images`` every HEARTBEAT seconds while any is left (a build
    removes its own) and while its builder (``parent``) lives: a builder killed outright must not
    leave its images "being built" for ever."""
    while parent is None or _alive(parent):
        markers = [m for m in (_beside(i, QUEUED) for i in images) if m.exists()]
        if not markers:
            return
        for marker in markers:
            try:
                os.utime(marker)
            except OSError:
                pass
        time.sleep(HEARTBEAT)


def build_seconds(image: Image) -> float:
    try:
        return float(_beside(image, SECONDS).read_text())
    except (OSError, ValueError):
        return DEFAULT_BUILD_SECONDS


class ImageError(RuntimeError):
    pass


# The command each runtime is run as, where an image does not name its own (Image.runtime_binary).
RUNTIME_COMMANDS = {"apptainer": "apptainer", "singularity": "singularity", "charliecloud": "ch-run"}
FUSE = "/dev/fuse"


def runtime_command(image: Image) -> str:
    return image.runtime_binary or RUNTIME_COMMANDS[image.runtime]


def image_status(image: Image) -> tuple[str, str]:
    """('built' | 'missing' | 'unreadable' | 'no-runtime', detail) as the calling user sees it, on
    the machine it runs on: a session asks on its node before it offers an image's kernel."""
    path = Path(image.path)
    if not path.exists():
        detail = _building_text(being_built(image))
        return ("building", detail) if detail else ("missing", f"no image at {path}")
    command = runtime_command(image)
    if not shutil.which(command):
        return "no-runtime", f"{image.runtime} is not installed on this machine ({command} not found)"
    if path.is_dir():
        return _folder_status(image, path)
    if image.runtime == "charliecloud":
        return "unreadable", f"{path} is not an image directory (Charliecloud runs folders)"
    if not os.access(path, os.R_OK):
        return "unreadable", f"{path} is not readable"
    with open(path, "rb") as handle:
        head = handle.read(64)
    if b"singularity" not in head.lower() and not head.startswith(b"#!"):
        return "unreadable", f"{path} is not a SIF image"
    if not os.access(FUSE, os.R_OK | os.W_OK):
        # Without setuid, Apptainer mounts a SIF through squashfuse, which needs /dev/fuse.
        return "unreadable", (f"{path} is a SIF file, which needs {FUSE} open to users on this machine (it is "
                              "not); a sandbox folder of the image runs without it (apptainer build --sandbox)")
    return "built", str(path)


def _folder_status(image: Image, path: Path) -> tuple[str, str]:
    """An image folder: Charliecloud's image, or Apptainer's sandbox (the folder plus /.singularity.d,
    whose environment scripts put the host's GPU libraries on LD_LIBRARY_PATH under --nv)."""
    python = path / image.python.lstrip("/") if image.python.startswith("/") else path / "usr/bin" / image.python
    if not (path / "etc/os-release").exists():
        return "unreadable", f"{path} is not an image directory (no etc/os-release)"
    if not os.access(path, os.R_OK | os.X_OK) or not os.access(python, os.X_OK):
        return "unreadable", f"{path} has no usable {image.python}"
    if image.runtime != "charliecloud" and not (path / ".singularity.d").is_dir():
        return "unreadable", (f"{path} is a root folder, not an {image.runtime} sandbox (no /.singularity.d): "
                              "build it with `dsportal images build` or `apptainer build --sandbox`")
    return "built", str(path)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_symlink())


def describe(images: list[Image]) -> list[str]:
    lines = []
    for image in images:
        status, detail = image_status(image)
        size = f"{size_of(Path(image.path)) / 2**20:,.0f} MiB" if status == "built" else "-"
        lines.append(f"  {image.name:<16} {status:<10} {size:>10}  {image.runtime:<12} {image.source}  ({detail})")
    return lines


def build(image: Image, data_mount_targets: list[str], force: bool = True) -> None:
    """Build an image from its source (one build of an image at a time: a second waits, and
    without ``force`` finds it built)."""
    target = Path(image.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = _beside(image, LOCK)
    # Root's alone: a user who could open it could hold a lock that stops every build. One of other
    # rights (an older version's) is made anew: a descriptor already open on it stays on the old one.
    if lock_path.exists() and (lock_path.is_symlink() or (lock_path.stat().st_uid, lock_path.stat().st_mode & 0o777)
                               != (os.geteuid(), 0o600)):
        lock_path.unlink()
    with open(os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        if image.source.startswith("debootstrap:"):
            if not force and _root_folder_only(image):
                make_sandbox(image, target)  # an older demo's image: made a sandbox where it is
            elif force or image_status(image)[0] != "built" or outdated(image):
                build_debootstrap(image, data_mount_targets)
                _beside(image, SECONDS).write_text(f"{time.monotonic() - started:.0f}\n")
        else:
            _build_sif(image)
        _beside(image, QUEUED).unlink(missing_ok=True)


def queue(images: list[Image], wheels_in: float = 0) -> list[tuple[Image, float]]:
    """Marks images a builder will build, with when each should be ready: they are shown "being
    built, about N min" while the builder's heartbeat (:func:`heartbeat`) keeps the marks fresh.
    Images whose wheels are not there yet wait ``wheels_in`` seconds for them (Horovod's build,
    beside the first images)."""
    now, free_at, marked, paths = time.time(), time.time(), [], set()
    for image in images:
        if image.path in paths:  # two entries of one folder: built once
            continue
        paths.add(image.path)
        waits = _wheels_missing(image)
        start = max(free_at, now + wheels_in) if waits else free_at
        free_at = start + build_seconds(image)
        path = _beside(image, QUEUED)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps({"ready_by": round(free_at)}), mode=0o644)
        marked.append((image, free_at - now))
    return marked


def _build_sif(image: Image) -> None:
    """apptainer/singularity build. Credentials come from the environment and stay there."""
    target = Path(image.path)
    if image.runtime not in ("apptainer", "singularity"):
        raise ImageError(f"{image.name}: {image.runtime} images are built with `dsportal images build-demo` "
                         "(debootstrap:) or by hand; `build` runs Apptainer/Singularity")
    binary = image.runtime_binary or image.runtime
    if not shutil.which(binary):
        raise ImageError(f"{binary} is not installed on this machine")
    env = dict(os.environ)
    prefix = "APPTAINER" if image.runtime == "apptainer" else "SINGULARITY"
    if image.source.startswith("docker://nvcr.io/") and env.get("NGC_API_KEY"):
        # NGC's registry login: user '$oauthtoken', password the API key. Passed in the
        # environment only (never argv: process lists are world-readable), never printed.
        env[f"{prefix}_DOCKER_USERNAME"] = "$oauthtoken"
        env[f"{prefix}_DOCKER_PASSWORD"] = env["NGC_API_KEY"]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    # A path that is not a .sif file gets a sandbox folder: what nodes without FUSE for users run.
    sandbox = [] if target.suffix == ".sif" else ["--sandbox"]
    result = subprocess.run([binary, "build", "--force", *sandbox, str(partial), image.source], env=env)
    if result.returncode != 0:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        partial.unlink(missing_ok=True)
        raise ImageError(f"{binary} build of {image.name} failed (exit {result.returncode})")
    if sandbox:
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(partial)], check=True)
        shutil.rmtree(target, ignore_errors=True)
    else:
        os.chmod(partial, 0o644)
    partial.replace(target)


def build_debootstrap(image: Image, data_mount_targets: list[str]) -> None:
    """A real small Debian image for Charliecloud: minbase + python3-ipykernel (+ the listed packages)."""
    suite = image.source.split(":", 1)[1] or "bookworm"
    target = Path(image.path)
    partial = target.with_name(target.name + ".partial")
    _unmount_under(partial)  # an interrupted debootstrap leaves its /proc mounted
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    packages = ["python3-ipykernel", *image.packages]
    wheels = _wheels(image)
    if wheels and "python3-pip" not in packages:
        packages.append("python3-pip")
    print(f"[images] debootstrap {suite} + {' '.join(packages)} -> {target} (about a minute)", flush=True)
    # minbase + python3 first, then apt inside: debootstrap's own resolver trips on virtual packages.
    steps = [
        ["debootstrap", "--variant=minbase", "--include=python3", suite, str(partial), DEBIAN_MIRROR],
        ["cp", "/etc/resolv.conf", str(partial / "etc/resolv.conf")],
        ["chroot", str(partial), "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        ["chroot", str(partial), "apt-get", "clean"],
    ]
    if wheels:
        print(f"[images] pip install {' '.join(w.name for w in wheels)} (and what they need)", flush=True)
        # The host's pip fetches what the wheels need (with the host's index, proxy and CA
        # settings); pip inside the image then installs offline from that folder.
        steps += [
            ["mkdir", "-p", str(partial / "tmp/wheels")],
            ["cp", *map(str, wheels), str(partial / "tmp/wheels")],
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d",
             str(partial / "tmp/wheels"), *[str(partial / "tmp/wheels" / w.name) for w in wheels]],
            ["chroot", str(partial), "python3", "-m", "pip", "install", "-q", "--no-cache-dir", "--no-index",
             "--find-links=/tmp/wheels", "--break-system-packages", "--root-user-action=ignore",
             *[f"/tmp/wheels/{w.name}" for w in wheels]],
            ["rm", "-rf", str(partial / "tmp/wheels")],
        ]
    for step in steps:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if step[0] == "chroot":  # the host's pip settings (find-links, CA path) mean nothing inside
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        result = subprocess.run(step, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            _unmount_under(partial)
            shutil.rmtree(partial, ignore_errors=True)
            raise ImageError(f"{' '.join(step[:3])} failed: {(result.stderr or result.stdout)[-2000:]}")
    shutil.rmtree(partial / "var/lib/apt/lists", ignore_errors=True)
    (partial / MARKER).write_text(f"{image.name}\n")
    (partial / PACKAGES_STAMP).write_text(_packages_stamp(image))
    add_mount_points(partial, data_mount_targets)
    subprocess.run(["chmod", "-R", "a+rX", str(partial)], check=True)
    if image.runtime in ("apptainer", "singularity"):
        make_sandbox(image, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    print(f"[images] {image.name} built: {size_of(target) / 2**20:,.0f} MiB", flush=True)


def _root_folder_only(image: Image) -> bool:
    path = Path(image.path)
    return (image.runtime in ("apptainer", "singularity") and (path / "etc/os-release").is_file()
            and not (path / ".singularity.d").exists())


def make_sandbox(image: Image, root: Path) -> None:
    """Makes a root folder an Apptainer sandbox where it is: ``apptainer build --sandbox`` from it adds
    /.singularity.d (its environment scripts put the host's GPU libraries on LD_LIBRARY_PATH
    under --nv); the result replaces the folder."""
    command = runtime_command(image)
    if not shutil.which(command):
        raise ImageError(f"{command} is not installed on this machine (make deps installs Apptainer)")
    built = root.with_name(root.name + ".sandbox")
    shutil.rmtree(built, ignore_errors=True)
    print(f"[images] {command} build --sandbox {image.name}", flush=True)
    result = subprocess.run([command, "build", "--force", "--sandbox", str(built), str(root)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(built, ignore_errors=True)
        raise ImageError(f"{command} build --sandbox of {image.name} failed: {(result.stderr or result.stdout)[-2000:]}")
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(built)], check=True)
    shutil.rmtree(root)
    built.rename(root)


# Files ch-run binds from the host when the image has them: without /etc/hosts (debootstrap makes
# none) a kernel's lookup of its own node's name went to the image's copy of the build machine's
# DNS server, unreachable from the nodes: each lookup waited out the resolver's timeout, and a
# container kernel's start with it.
HOST_FILES = ("etc/hosts", "etc/resolv.conf")


def add_mount_points(image_dir: Path, targets: list[str]) -> None:
    """Charliecloud binds onto folders and files the image has only: make them (mode 755/644)."""
    for target in targets:
        folder = image_dir / target.lstrip("/")
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o755)
    for name in HOST_FILES:
        path = image_dir / name
        if not path.exists() and not path.is_symlink():
            path.touch(mode=0o644)
            os.chmod(path, 0o644)


def bind_targets(settings) -> list[str]:
    """Where the catalog's Charliecloud images get folders bound: data mounts, jobs' container binds."""
    return [m.target for m in settings.data_mounts] + sorted({path for profile in settings.profiles
                                                              for path in profile.jobs.container_binds})


def _unmount_under(folder: Path) -> None:
    try:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return
    for mount in sorted((m for m in mounts if m == str(folder) or m.startswith(f"{folder}/")), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)


def _wheels(image: Image) -> list[Path]:
    """The wheel files an image lists (paths or globs); each must match something."""
    found = []
    for pattern in image.wheels:
        matches = sorted(Path("/").glob(pattern.lstrip("/"))) if any(c in pattern for c in "*?[") else [
            Path(pattern)] if Path(pattern).is_file() else []
        if not matches:
            raise ImageError(f"{image.name}: no wheel matches {pattern} (multi-node images need "
                             "scripts/build-horovod.sh, which scripts/build-extras.sh runs)")
        found.append(matches[-1])
    return found


def _packages_stamp(image: Image) -> str:
    return "\n".join(sorted(image.packages)) + "\n"


def outdated(image: Image) -> bool:
    """A built debootstrap: image whose catalog entry lists other packages than it was built with
    (or that predates the stamp): `images build-demo` builds it again; sessions use it meanwhile."""
    try:
        return (Path(image.path) / PACKAGES_STAMP).read_text() != _packages_stamp(image)
    except OSError:
        return True


def unbuilt_demo_images(settings) -> list[Image]:
    """The debootstrap: images of the catalog that are not built yet, or are outdated (a folder two
    entries share is built once: the second finds it built)."""
    return [i for i in settings.images if i.source.startswith("debootstrap:")
            and (image_status(i)[0] != "built" or outdated(i))]


def _wheels_missing(image: Image) -> bool:
    try:
        _wheels(image)
    except ImageError:
        return True
    return False


def main(settings, action: str, name: str | None, wheels_in: float = 0, ready: bool = False,
         parent: int | None = None) -> int:
    images = settings.images
    if action == "queue":  # build-extras.sh, before it builds them in the background
        for image, seconds in queue(unbuilt_demo_images(settings), wheels_in):
            print(f"{image.name}: about {math.ceil(seconds / 60)} min")
        return 0
    if action == "heartbeat":  # build-extras.sh, beside its builds
        heartbeat(images, parent)
        return 0
    if action == "list":
        print(f"  {'name':<16} {'status':<10} {'size':>10}  {'runtime':<12} source")
        print("\n".join(describe(images)) or "  (no images in portal.yaml)")
        return 0
    targets = bind_targets(settings)
    if action == "build-demo":
        chosen = [i for i in unbuilt_demo_images(settings) if not (ready and _wheels_missing(i))]
    else:
        chosen = [i for i in images if i.name == name]
        if not chosen:
            print(f"dsportal images: no image named {name!r} (have: {', '.join(i.name for i in images)})",
                  file=sys.stderr)
            return 1
    for image in chosen:
        try:
            build(image, targets, force=action != "build-demo")
        except ImageError as error:
            print(f"dsportal images: {error}", file=sys.stderr)
            return 1
    return 0
