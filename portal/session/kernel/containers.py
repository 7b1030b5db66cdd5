"""Container runtime backends: an image + binds + environment + command -> the argv that runs it.

Apptainer (or Singularity) is the portal's runtime, on production clusters and on the demo;
Charliecloud is the second backend. Each backend is a few lines: adding one means adding a class
here and a name in ``RUNTIMES``.

What a container sees of the host is what its Launch binds and nothing else: a kernel gets its
home, the data mounts, the session's runtime folder and the job's own /tmp (private to the job
where Slurm's job_container/tmpfs is on), its GPUs are the job's (CUDA_VISIBLE_DEVICES), and its
environment is only what the kernelspec sets. Ranks of a multi-node job keep their launcher's
environment (srun's PMIx, torchrun's RANK...) and share the node's /dev/shm with each other (MPI's
shared-memory transport between ranks of one node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class Bind:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Launch:
    image: str
    command: list[str]
    binds: list[Bind] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    gpus: bool = True
    ranks: bool = False  # the ranks of a multi-node job, not a kernel (see the module's docstring)


class ApptainerRuntime:
    """``apptainer exec --containall --nv``: none of the host's folders, processes or environment but
    the binds and APPTAINERENV_ variables; GPUs of the job (CUDA_VISIBLE_DEVICES) only.

    Ranks: ``apptainer exec`` with the node's /dev, the launcher's environment and processes, as
    Apptainer's MPI guide runs them. Under ``--contain`` each rank got a /dev of its own, with a
    /dev/shm of its own (Apptainer skips a bind onto it), and no /dev/infiniband: NCCL found no
    shared memory or peer access between two ranks of one node and sent their traffic through
    sockets (bench/results/gpu-scaling.md, 2026-11-28). A rank is the user's own process on her
    job's node either way; what confines it is the job (cgroup devices, job_container/tmpfs)."""

    binary = "apptainer"
    env_prefix = "APPTAINERENV_"

    def __init__(self, binary: str | None = None):
        self.binary = binary or self.binary

    def argv(self, launch: Launch) -> list[str]:
        argv = [self.binary, "exec"] + ([] if launch.ranks else ["--containall"])
        if launch.gpus:
            argv.append("--nv")
        # --containall gives the container an empty 64 MB /tmp: the job's own /tmp instead (ranks
        # have it, as they have their home, from Apptainer's own defaults).
        binds = ([] if launch.ranks else [Bind("/tmp", "/tmp")]) + launch.binds
        for bind in binds:
            if bind.source == bind.target and (bind.target.startswith("/tmp/") or (launch.ranks and bind.target == "/tmp")):
                continue  # within the job's /tmp, bound already
            argv += ["--bind", f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "")]
        return argv + [launch.image, *launch.command]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """Variables for the runtime's own process that set ``env`` inside the container."""
        return {f"{self.env_prefix}{key}": value for key, value in env.items()}


class SingularityRuntime(ApptainerRuntime):
    binary = "singularity"
    env_prefix = "SINGULARITYENV_"


class CharliecloudRuntime:
    """``ch-run``: unprivileged, shares the host's network and passes the environment through."""

    binary = "ch-run"

    def __init__(self, binary: str | None = None):
        self.binary = binary or self.binary

    def argv(self, launch: Launch) -> list[str]:
        # --no-passwd: the image keeps its own /etc/passwd; the uid is still the user's.
        argv = [self.binary, "--no-passwd"]
        seen = set()
        for bind in launch.binds:
            source, target = self._existing(launch.image, bind)
            if (source, target) not in seen:
                seen.add((source, target))
                argv.append(f"--bind={source}:{target}")
        return argv + [launch.image, "--", *launch.command]

    @staticmethod
    def _existing(image: str, bind: Bind) -> tuple[str, str]:
        """ch-run binds onto folders the (read-only) image has. A same-path bind whose target is
        missing (/home/alice, /tmp/dsportal-...) binds its nearest existing ancestor instead
        (/home, /tmp): the host folders Apptainer binds by default too."""
        if bind.source != bind.target:
            return bind.source, bind.target
        path = PurePosixPath(bind.target)
        while path != path.parent and not (Path(image) / str(path).lstrip("/")).is_dir():
            path = path.parent
        return str(path), str(path)

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return dict(env)


RUNTIMES = {"apptainer": ApptainerRuntime, "singularity": SingularityRuntime, "charliecloud": CharliecloudRuntime}


def runtime(name: str, binary: str | None = None):
    try:
        return RUNTIMES[name](binary)
    except KeyError:
        raise ValueError(f"unknown container runtime {name!r}: one of {', '.join(RUNTIMES)}") from None
