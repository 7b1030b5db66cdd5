"""What the demo's sessions see: the container image(s), the shared dataset folder, instructors' course folders."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from democluster.base import demo_file, say
from portal.core import images, settings as settings_module


def ensure_images(config_path: Path | None = None, build: bool = True) -> None:
    """The demo's container image(s) and the shared dataset folder bound into kernels (``build``:
    the images not built yet too, else they are left to scripts/build-extras.sh)."""
    settings = settings_module.load(settings_module.config_path(config_path, demo=True))
    for mount in settings.data_mounts:
        folder = Path(mount.source)
        if not folder.exists():
            folder.mkdir(parents=True)
            (folder / "README.txt").write_text("Shared datasets of the dsportal demo (read-only in kernels).\n")
            os.chmod(folder, 0o755)
    targets = images.bind_targets(settings)
    for image in images.unbuilt_demo_images(settings) if build else []:
        images.build(image, targets, force=False)
    for image in settings.images:  # an image built before a bind was added gets its folder too
        if image.source.startswith("debootstrap:") and Path(image.path).is_dir():
            images.add_mount_points(Path(image.path), targets)


def ensure_courses(config_path: Path | None = None) -> None:
    """Course folders of the demo's instructors (template sources with an owner): created once,
    seeded from config/demo/courses/<name>/, then the instructor's own to edit."""
    settings = settings_module.load(settings_module.config_path(config_path, demo=True))
    for source in settings.templates.sources:
        folder = Path(source.path)
        if not source.owner or folder.exists():
            continue
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(folder.parent, 0o755)
        seed = demo_file("courses") / source.name
        if seed.is_dir():
            shutil.copytree(seed, folder)
        else:
            folder.mkdir()
        entry = pwd.getpwnam(source.owner)
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        say(f"course folder {folder} (owner {source.owner})")
