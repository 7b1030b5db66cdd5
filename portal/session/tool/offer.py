"""What a session offers besides Python notebooks: a terminal, R, VS Code and git (a profile's ``tools``).

The hub puts the profile's list into the job (portal.core.sessionspec's ``tools``, with where code-server is and which
CRAN mirror R uses). The session's entry point (portal.session.singleuser) turns it into Jupyter's own
configuration before the server starts, in a config folder of the session's own (first on
JUPYTER_CONFIG_PATH):

- terminal: ``ServerApp.terminals_enabled`` (JupyterLab shows no Terminal tile without it);
- git: jupyterlab-git's server extension (``ServerApp.jpserver_extensions``) and its JupyterLab
  plugins (page_config's ``disabledExtensions``), and with them nbdime's, which only jupyterlab-git's
  diffs use here (a session without git neither imports nor serves it);
- r: the R kernel's kernelspec in the session's folder (:func:`write_r_kernel`); without it the
  system's ``ir`` kernelspec is hidden (portal.session.kernel.ownkernels);
- vscode: the launcher tile of portal.session.tool.vscode (jupyter-server-proxy).

What a profile leaves out is not offered; it is not a wall: her terminal (where offered) runs what
she likes inside her own slice. Each tool runs in the session's job, as the user, within its cores,
memory and GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from portal.core import defaults, sessionspec
from portal.core.sessionspec import TOOLS  # noqa: F401 - the tools a profile may offer, as this module names them
from portal.core.wholefile import write_whole

# git's extensions, with nbdime's: installed as jupyterlab-git's dependency, used for its diffs.
GIT_SERVER_EXTENSIONS = ("jupyterlab_git", "nbdime")
GIT_LAB_EXTENSIONS = ("@jupyterlab/git", "nbdime-jupyterlab")
# Live co-editing (jupyter-collaboration), in shareable sessions only (portal.session.sharing).
COLLABORATION_SERVER_EXTENSIONS = ("jupyter_server_ydoc", "jupyter_server_fileid")
COLLABORATION_LAB_EXTENSIONS = ("@jupyter/collaboration-extension", "@jupyter/docprovider-extension")
GUEST_RECHECK = 10  # seconds: how long a guest's access, once confirmed by the hub, is taken as standing
R_KERNEL = "ir"  # IRkernel's kernelspec name (Debian's r-cran-irkernel installs it system-wide)
R_REPOSITORY_VARIABLE = "DSPORTAL_R_REPOSITORY"

# Run by R before IRkernel: her own library (made if missing: R otherwise offers to make it, a question a
# kernel cannot answer), the admin's CRAN mirror, and an install.packages() that says in words when the
# mirror cannot be reached (compute nodes often have no internet) instead of R's warnings.
R_START = " ".join(line.strip() for line in """
local({
  lib <- file.path(path.expand("~"), "R", paste0(R.version$platform, "-library"),
                   paste(R.version$major, sub("[.].*", "", R.version$minor), sep = "."));
  dir.create(lib, recursive = TRUE, showWarnings = FALSE);
  .libPaths(c(lib, .libPaths()));
  options(repos = c(CRAN = Sys.getenv("DSPORTAL_R_REPOSITORY", "https://cloud.r-project.org")));
  tools <- new.env();
  tools$install.packages <- function(pkgs, lib = .libPaths()[1], repos = getOption("repos"), ...) {
    remote <- Filter(function(r) !startsWith(r, "file:"), as.character(repos));
    if (length(remote) > 0) {
      index <- paste0(sub("/$", "", remote[[1]]), "/src/contrib/PACKAGES");
      reached <- tryCatch(length(curlGetHeaders(index, timeout = 10L)) > 0, error = function(e) FALSE);
      if (!reached) stop(sprintf(paste0("install.packages() cannot reach %s from this node: compute nodes ",
        "often have no internet. Install from a file you copied here: install.packages(\\"pkg.tar.gz\\", ",
        "repos = NULL), or ask your admin for a local CRAN mirror (portal.yaml: session.r_repository)."),
        remote[[1]]), call. = FALSE);
    };
    utils::install.packages(pkgs, lib = lib, repos = repos, ...)
  };
  attach(tools, name = "dsportal:tools", warn.conflicts = FALSE)
});
IRkernel::main()
""".strip().splitlines())


def r_argv(r_binary: str) -> list[str]:
    """R for a kernel: --no-restore, so an .RData in the notebook's folder (anyone's, in a shared
    folder) is not loaded and its .First not run."""
    return [r_binary, "--slave", "--no-restore", "-e", R_START, "--args", "{connection_file}"]


def r_environment(tools: Tools, home: str) -> dict[str, str]:
    """R reads .Renviron and .Rprofile from its working folder, the notebook's, before her home's: a
    neighbour's files in a shared folder would run as her. Her home's only (absent ones are skipped)."""
    return {R_REPOSITORY_VARIABLE: tools.r_repository, "R_ENVIRON_USER": os.path.join(home, ".Renviron"),
            "R_PROFILE_USER": os.path.join(home, ".Rprofile")}


@dataclass(frozen=True)
class Tools:
    offered: frozenset[str]
    code_server: str = defaults.CODE_SERVER
    r_repository: str = defaults.R_REPOSITORY

    @classmethod
    def from_env(cls, environ=None) -> Tools:
        """The hub's word (the session's spec); a server the hub did not start offers everything."""
        given = sessionspec.current(environ).tools
        return cls(frozenset(given.offered), given.code_server, given.r_repository)

    def offers(self, tool: str) -> bool:
        return tool in self.offered


def sharing_groups(environ=None) -> list[str]:
    """The sharing groups the hub found the session's owner in (the session's spec); [] where the
    session is not shareable (portal.session.sharing)."""
    return list(sessionspec.current(environ).sharing_groups)


def write_config(folder: Path, tools: Tools, shareable: bool = False) -> Path:
    """The session's own Jupyter config folder, for JUPYTER_CONFIG_PATH: what the profile leaves out,
    switched off by Jupyter's own settings. A shareable session (portal.session.sharing) loads live
    co-editing and judges guests; any other neither imports nor serves them."""
    config = folder / "config"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    server: dict = {"terminals_enabled": tools.offers("terminal"), "jpserver_extensions": {},
                    # jupyter_server's own, saying a full home in words (portal/session/contents.py)
                    "contents_manager_class": "portal.session.contents.ContentsManager"}
    if not tools.offers("git"):
        server["jpserver_extensions"].update(dict.fromkeys(GIT_SERVER_EXTENSIONS, False))
    server["jpserver_extensions"].update(dict.fromkeys(COLLABORATION_SERVER_EXTENSIONS, shareable))
    write_whole(config / "jupyter_server_config.json", json.dumps({"ServerApp": server}, indent=1))
    disabled = {} if tools.offers("git") else dict.fromkeys(GIT_LAB_EXTENSIONS, True)
    if not shareable:
        disabled.update(dict.fromkeys(COLLABORATION_LAB_EXTENSIONS, True))
    write_whole(config / "labconfig" / "page_config.json", json.dumps({"disabledExtensions": disabled}, indent=1))
    return config


def system_r_kernel(data_path: list[str]) -> Path | None:
    """IRkernel's kernelspec folder where R's package installed it (Debian: /usr/share/jupyter/kernels/ir)."""
    for folder in data_path:
        spec = Path(folder) / "kernels" / R_KERNEL
        if (spec / "kernel.json").is_file():
            return spec
    return None


def write_r_kernel(dest: Path, source: Path, tools: Tools) -> str | None:
    """The R kernel of this session into ``dest`` (on JUPYTER_PATH before the system's): IRkernel as
    installed, started with :data:`R_START`. Nothing where the installed kernelspec is not IRkernel's."""
    try:
        spec = json.loads((source / "kernel.json").read_text())
    except (OSError, ValueError):
        return None
    argv = spec.get("argv", [])
    if len(argv) < 2 or "IRkernel::main()" not in argv:
        return None
    spec["argv"] = r_argv(argv[0])
    spec["env"] = {**spec.get("env", {}), **r_environment(tools, os.path.expanduser("~"))}
    spec.setdefault("metadata", {})["dsportal"] = {"tool": "r"}
    folder = dest / "kernels" / R_KERNEL
    folder.mkdir(parents=True, exist_ok=True)
    write_whole(folder / "kernel.json", json.dumps(spec, indent=1))
    for logo in source.glob("logo-*"):  # copies: the server serves no link out of a kernelspec's folder
        shutil.copyfile(logo, folder / logo.name)
    return f"{R_KERNEL}: {spec.get('display_name', 'R')}"
