"""`dsportal check`: is everything portal.yaml describes really there? A readable report."""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import shutil
import socket
import ssl
import stat
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import ldap3

from portal.admin import firewall, hubaccount
from portal.core import ldapconnect, settings as settings_module
from portal.core.images import runtime_command
from portal.core.templatesources import notebooks
from portal.slurm.slurmclient import CATCHING_UP, SlurmCommands
from portal.slurm.slurmparse import (
    SlurmError,
    describe_releases,
    gpus_and_shards,
    mpi_plugins,
    private_tmp_plugin,
)

USER_SIDE_MODULES = "jupyterhub, jupyterlab, ipykernel, jupyter_server_proxy, portal.session.singleuser"


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    warning: bool = False  # worth fixing, but nothing is broken: `check` still passes

    def line(self) -> str:
        mark = "FAIL" if not self.ok else "WARN" if self.warning else "ok"
        return f"  [{mark}] {self.name}: {self.detail}"


def check_slurm(settings) -> list[Result]:
    try:
        found = SlurmCommands.from_settings(settings).partitions()
    except SlurmError as error:
        return [Result("Slurm controller", False, f"not reachable: {error}")]
    results = [Result("Slurm controller", True, f"answers; partitions {', '.join(found) or 'none'}")]
    try:
        commands = SlurmCommands.from_settings(settings)
        detail, warning = describe_releases(*commands.releases())
        results.append(Result("Slurm release", True, detail, warning=warning))
        results.append(Result("Slurm configuration", True, config_source(settings.slurm.conf)))
    except SlurmError as error:
        results.append(Result("Slurm release", True, f"not known ({error})", warning=True))
    for profile in settings.profiles:
        ok = profile.partition in found
        detail = "exists" if ok else f"partition {profile.partition!r} not in sinfo ({', '.join(found)})"
        results.append(Result(f"profile {profile.name}", ok, detail))
    return results


# Where sackd, or slurmd in configless mode, keeps its copy of slurmctld's configuration on a host (Slurm's own path).
CONFIGLESS_CACHE = Path("/run/slurm/conf/slurm.conf")


def config_source(named, cache: Path = CONFIGLESS_CACHE) -> str:
    """Where this host's Slurm commands find slurm.conf, for portal.yaml's slurm.conf (``named``; None: configless).
    (scontrol show config's SLURM_CONF is slurmctld's own file, not this host's.)"""
    if named:
        return f"{named} (portal.yaml's slurm.conf)"
    if cache.is_file():
        return f"configless: this host's commands read {cache}, the copy sackd (or a slurmd) here keeps of slurmctld's"
    return ("configless: no copy here (" + str(cache) + "): this host's commands read their compiled-in slurm.conf "
            "if there is one, else fetch it from slurmctld at each run (DNS SRV or SLURM_CONF_SERVER)")


def check_mpi(settings) -> list[Result]:
    """Each MPI plugin the profiles' jobs ask srun for (jobs.launcher srun), among those this Slurm has (srun
    --mpi=list: a release or a build may lack one, as Debian unstable's 26.05.5 lacks pmix)."""
    asked: dict[str, list[str]] = {}
    for profile in settings.profiles:
        if profile.jobs.launcher == "srun":
            asked.setdefault(profile.jobs.mpi_plugin, []).append(profile.name)
    if not asked:
        return []
    commands = SlurmCommands.from_settings(settings)
    try:
        out = commands.run([commands.tool("srun"), "--mpi=list"])
    except SlurmError as error:
        return [Result("MPI jobs", True, f"not known (srun --mpi=list: {error})", warning=True)]
    have = mpi_plugins(out)
    results = []
    for plugin, profiles in sorted(asked.items()):
        names = ", ".join(profiles)
        if plugin in have:
            results.append(Result("MPI jobs", True, f"srun --mpi={plugin} (profiles {names})"))
        else:
            results.append(Result("MPI jobs", False, f"profiles {names} start their ranks with srun --mpi={plugin}, "
                                  f"which this Slurm lacks (srun --mpi=list: {', '.join(sorted(have)) or 'none'}): "
                                  "set their jobs.launcher to mpirun, or jobs.mpi_plugin to one it has that your MPI "
                                  "speaks"))
    return results


def check_nodes(settings) -> list[Result]:
    """Each compute node's address, and whether this host (the login node: hub, proxy) reaches it."""
    slurm = SlurmCommands.from_settings(settings)
    try:
        nodes = slurm.nodes(timeout=30)
        port = int(slurm.config().get("SlurmdPort") or 6818)
    except (SlurmError, ValueError) as error:
        return [Result("compute nodes", True, f"not known ({error})", warning=True)]
    results = []
    for node in nodes:
        try:
            socket.create_connection((node.address, port), timeout=3).close()
            results.append(Result(f"node {node.name}", True, f"{node.address}: reached (slurmd, port {port})"))
        except OSError as error:
            results.append(Result(f"node {node.name}", False, f"{node.address}: not reached from this host "
                                  f"(slurmd, port {port}: {error.strerror or error}); sessions there cannot be "
                                  "proxied"))
    return results


def check_oidc(settings) -> Result:
    """The OpenID provider answers its discovery and publishes keys, as the hub will ask, with oidc.ca_file."""
    oidc = settings.oidc
    context = ssl.create_default_context(cafile=str(oidc.ca_file) if oidc.ca_file else None)

    def fetch(url: str) -> dict:
        with urllib.request.urlopen(url, timeout=oidc.timeout, context=context) as answer:
            return json.loads(answer.read(1 << 20))

    try:
        oidc.client_secret()
        document = fetch(f"{oidc.issuer.rstrip('/')}/.well-known/openid-configuration")
        if document.get("issuer") != oidc.issuer:
            return Result("OpenID provider", False, f"{oidc.issuer}: its discovery names issuer "
                          f"{document.get('issuer')!r}; oidc.issuer must be exactly that")
        plain = [key for key in ("authorization_endpoint", "token_endpoint", "jwks_uri")
                 if not oidc.endpoint_allowed(str(document.get(key, "")))]
        if plain:
            return Result("OpenID provider", False, f"{oidc.issuer}: its discovery names {', '.join(plain)} without "
                          "https (behind a TLS proxy: tell the provider its public https address)")
        keys = [key for key in fetch(document["jwks_uri"]).get("keys", []) if key.get("use", "sig") == "sig"]
    except settings_module.SettingsError as error:
        return Result("OpenID provider", False, str(error))
    except (OSError, ValueError, KeyError) as error:  # URLError, TLS, timeouts; not JSON; no jwks_uri
        return Result("OpenID provider", False, f"{oidc.issuer}: {getattr(error, 'reason', None) or error}")
    if not keys:
        return Result("OpenID provider", False, f"{oidc.issuer}: publishes no signing keys ({document['jwks_uri']})")
    return Result("OpenID provider", True, f"{oidc.issuer} answers; {len(keys)} signing key(s); client "
                  f"{oidc.client_id}'s secret read (the provider checks it at the first sign-in)")


def check_ldap(settings) -> Result:
    ldap = settings.ldap
    where = ", ".join(f"{host}:{port}" for host, port in ldap.servers())
    try:
        conn = ldapconnect.open_connection(ldap, connect_timeout=5, receive_timeout=5)
        if not ldapconnect.bind_for_search(conn, ldap):
            who = f"as {ldap.search_bind_dn}" if ldap.search_bind_dn else "anonymously"
            return Result("LDAP", False, f"bind {who} to {where} refused: {conn.result.get('description')}")
        missing = [g for g in ldap.allowed_groups if not conn.search(g, "(objectClass=*)", search_scope=ldap3.BASE)]
        conn.unbind()
    except Exception as error:  # noqa: BLE001 - any failure is the report's content
        return Result("LDAP", False, f"{where}: {error}")
    if missing:
        return Result("LDAP", False, f"bind ok, but allowed group(s) not found: {', '.join(missing)}")
    how = f"search under {ldap.search_base} as {ldap.search_bind_dn or 'anonymous'}" if ldap.search_base else "bind"
    return Result("LDAP", True, f"{how} to {where} works; {len(ldap.allowed_groups)} allowed group(s) found")


# Asked as an ordinary account, in the user environment: what a session would find.
IMAGE_PROBE = """import json, sys
from types import SimpleNamespace
from portal.core.images import image_status
print(json.dumps([image_status(SimpleNamespace(**image)) for image in json.loads(sys.argv[1])]))"""
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"  # where sessions find their container runtime


def _as_nobody(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """``argv`` as an ordinary account, in /, with none of root's environment; one that hangs fails."""
    try:
        return subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True, text=True, cwd="/",
                              env={"PATH": USER_PATH, "LANG": "C.UTF-8"}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer in {timeout:.0f} s")


def check_user_environment(settings) -> Result:
    prefix = settings.session.environment
    python = prefix / "bin" / "python"
    for tool in ("python", "jupyterhub-singleuser"):
        if not (prefix / "bin" / tool).exists():
            return Result("user environment", False, f"{prefix}/bin/{tool} is missing")
    # Users, not root, run it: prove an unprivileged account can import the session stack. Isolated
    # (-I), in /, with none of root's environment: a module planted in the admin's current folder
    # (/tmp, say) must not run, and root's variables are not the probe's business.
    probe = _as_nobody([str(python), "-I", "-c", f"import {USER_SIDE_MODULES}"])
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        return Result("user environment", False, f"{prefix} is not usable by other accounts: {why}")
    return Result("user environment", True, f"{prefix} imports {USER_SIDE_MODULES} as an ordinary user")


def check_tools(settings) -> list[Result]:
    """What profiles offer besides notebooks (Profile.tools), each tried as an ordinary account: a tool
    offered but not working is a warning (sessions leave it out and say why)."""
    offered: dict[str, list[str]] = {}
    for profile in settings.profiles:
        for tool in profile.tools:
            offered.setdefault(tool, []).append(profile.name)
    python = str(settings.session.environment / "bin" / "python")
    probes = {
        "terminal": ("terminal", [python, "-I", "-c", "import terminado; print('terminado', terminado.__version__)"],
                     "jupyter_server's terminals need terminado in the session environment"),
        "r": ("R kernel", ["R", "--slave", "-e", 'cat("R", paste(R.version$major, R.version$minor, sep = "."), "IRkernel", '
                           'as.character(packageVersion("IRkernel")), "computes", sum(1:10), "\\n")'],
              "install Debian's r-cran-irkernel on every compute node (make deps does here)"),
        # (code-server writes a config file into the home: nobody's is a folder of its own, removed after)
        "vscode": ("VS Code", ["sh", "-c", 'HOME=$(mktemp -d) && "$0" --version; s=$?; rm -rf "$HOME"; exit $s',
                               str(settings.session.code_server)],
                   "bash scripts/install-code-server.sh (code-server needs Node.js 20)"),
        "git": ("git", [python, "-I", "-c", "import jupyterlab_git, subprocess; print('jupyterlab-git', "
                        "jupyterlab_git.__version__, subprocess.run(['git', '--version'], capture_output=True, "
                        "text=True, check=True).stdout.strip())"],
                "jupyterlab-git comes with the lock file (make deps); git from Debian's git package"),
    }
    results = []
    for tool, (name, argv, remedy) in probes.items():
        if tool not in offered:
            results.append(Result(name, True, "offered by no profile"))
            continue
        found = _as_nobody(argv, timeout=60)
        said = " ".join((found.stdout or found.stderr).strip().splitlines()[-1:]) or "no output"
        who = "profiles " + ", ".join(offered[tool])
        if found.returncode == 0 and (tool != "r" or "computes 55" in said):
            results.append(Result(name, True, f"{said} ({who})"))
        else:
            results.append(Result(name, True, f"offered by {who} but not working here: {said}; {remedy}", warning=True))
    return results


def check_images(settings) -> list[Result]:
    """Each container runtime the catalog uses runs for an ordinary account (its version), and
    each image is there for one; an image that is not is a warning: its kernel says so."""
    results = []
    for name, command in sorted({(image.runtime, runtime_command(image)) for image in settings.images}):
        found = _as_nobody([command, "--version"])
        ok, version = found.returncode == 0, (found.stdout or found.stderr).strip().splitlines()[:1]
        detail = (f"{' '.join(version)} ({command})" if ok else
                  f"{command} does not run for users: {' '.join(version) or 'not found'}; make deps installs Apptainer")
        results.append(Result(f"container runtime {name}", ok, detail))
    fields = [{"path": str(i.path), "runtime": i.runtime, "runtime_binary": i.runtime_binary, "python": i.python}
              for i in settings.images]
    if not fields:
        return results
    python = str(settings.session.environment / "bin" / "python")
    probe = _as_nobody([python, "-I", "-c", IMAGE_PROBE, json.dumps(fields)])
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        return results + [Result("images", False, f"could not look at the images as a user: {why}")]
    for image, (status, detail) in zip(settings.images, json.loads(probe.stdout), strict=True):
        shown = f"{image.runtime}, {detail}" if status == "built" else f"{status}: {detail}"
        results.append(Result(f"image {image.name}", True, shown, warning=status != "built"))
    return results


def check_templates(settings) -> list[Result]:
    """Each template source: a folder users can read, owned by its instructor when one is named."""
    results = []
    for source in settings.templates.sources:
        folder, name = source.path, f"templates {source.name}"
        if not folder.is_dir():
            results.append(Result(name, False, f"{folder} is not a folder"))
            continue
        if subprocess.run(["runuser", "-u", "nobody", "--", "test", "-r", str(folder), "-a", "-x", str(folder)],
                          capture_output=True).returncode != 0:
            results.append(Result(name, False, f"{folder} is not readable by ordinary accounts"))
            continue
        if source.owner:
            try:
                owner = pwd.getpwuid(folder.stat().st_uid).pw_name
            except KeyError:
                owner = str(folder.stat().st_uid)
            if owner != source.owner:
                results.append(Result(name, False, f"{folder} belongs to {owner}, not to {source.owner}"))
                continue
        results.append(Result(name, True, f"{folder}: {len(notebooks(folder))} notebook(s)"))
    return results


def _login_uid_range() -> range:
    limits = {"UID_MIN": 1000, "UID_MAX": 60000}
    try:
        for line in open("/etc/login.defs"):
            words = line.split()
            if len(words) == 2 and words[0] in limits and words[1].isdigit():
                limits[words[0]] = int(words[1])
    except OSError:
        pass
    return range(limits["UID_MIN"], limits["UID_MAX"] + 1)


def check_homes() -> Result:
    """People's homes must not be open to others: sessions of other users share the nodes."""
    uids, open_homes, seen = _login_uid_range(), [], 0
    for entry in pwd.getpwall():
        if entry.pw_uid not in uids:
            continue
        try:
            mode = os.stat(entry.pw_dir).st_mode
        except OSError:
            continue
        seen += 1
        if mode & (stat.S_IROTH | stat.S_IXOTH):
            open_homes.append(f"{entry.pw_name} ({entry.pw_dir} {stat.filemode(mode)})")
    if open_homes:
        shown = ", ".join(open_homes[:10]) + (f" and {len(open_homes) - 10} more" if len(open_homes) > 10 else "")
        return Result("private homes", True, f"{len(open_homes)} of {seen} homes are open to other users: "
                      f"{shown}; run chmod 700 on them (sessions keep what they write 0700/0600 anyway)",
                      warning=True)
    return Result("private homes", True, f"none of {seen} homes is open to other users")


def check_firewall() -> Result:
    separated = firewall.users()
    if separated is None:
        return Result("node firewall", True, "not in place on this host: users' TCP ports are reachable from other "
                      "users' processes (dsportal firewall up; see docs/how-to/deploy.md)", warning=True)
    hosts = firewall.cluster_hosts() or []
    return Result("node firewall", True, f"in place: TCP services of {len(separated)} portal user(s) are their own; "
                  f"cluster hosts: {', '.join(hosts) if hosts else 'none named (users reach no other host)'}")


def hub_ports_of(hub) -> tuple[set[int], set[int]]:
    """(the ports the sessions reach on the hub's host: its API and dsportal's service; the port only that
    host needs: the proxy's API, where it is not on loopback), from portal.yaml's ``hub``."""
    for_sessions = {urlparse(hub.hub_bind_url).port or 8081}
    if hub.service_port:
        for_sessions.add(hub.service_port)
    proxy_api = urlparse(hub.proxy_api_url)
    return for_sessions, set() if _loopback(proxy_api.hostname) else {proxy_api.port or 8001}


def check_hub_ports(settings) -> Result | None:
    """On the hub's host (the login node): the node firewall lets only the compute nodes and this host reach
    the hub's API and dsportal's service, and only this host the proxy's API (docs/how-to/deploy.md, section
    6). None where the table is not in place (check_firewall says so)."""
    guarded = firewall.guarded_ports()
    if guarded is None:
        return None
    for_sessions, local_only = hub_ports_of(settings.hub)
    open_ports = sorted((for_sessions - set(guarded["hub_ports"]) - set(guarded["local_ports"]))
                        | (local_only - set(guarded["local_ports"])))
    if open_ports:
        return Result("hub's ports", True, f"port(s) {', '.join(map(str, open_ports))} of this host answer every "
                      "host, not only the compute nodes (or this host): on the login node, give the firewall "
                      "HUB_PORTS, LOCAL_PORTS and COMPUTE (docs/how-to/deploy.md, section 6)", warning=True)
    return Result("hub's ports", True, firewall.describe_guarded(guarded).removeprefix("the hub's ports: "))


def _loopback(host: str | None) -> bool:
    """Whether a URL's host is this host's loopback only (a port bound there answers nobody else)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


# /proc mount options under which a user sees only their own processes (root sees all).
HIDEPID_INVISIBLE = ("invisible", "2", "ptraceable", "4")


def proc_hidepid(mounts: str = "/proc/mounts") -> str | None:
    """The hidepid option of /proc ('invisible', 'noaccess', 'ptraceable', '0'-'2'), or None."""
    for line in open(mounts).read().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/proc" and fields[2] == "proc":
            options = dict(o.partition("=")[::2] for o in fields[3].split(","))
            return options.get("hidepid")
    return None


def _job_confinement(config: dict[str, str]) -> Result:
    missing = [what for what, ok in (
        ("ProctrackType=proctrack/cgroup (processes a job leaves behind keep running)",
         config.get("ProctrackType") == "proctrack/cgroup"),
        ("TaskPlugin=task/cgroup", "task/cgroup" in config.get("TaskPlugin", "")),
        ("ConstrainDevices=yes in cgroup.conf (a job can open every GPU of its node)",
         config.get("ConstrainDevices") == "yes"),
        ("ConstrainRAMSpace=yes in cgroup.conf (a job can take its neighbours' memory)",
         config.get("ConstrainRAMSpace") == "yes"),
    ) if not ok]
    if missing:
        return Result("job confinement", True, "Slurm does not confine jobs that share a node: "
                      + "; ".join(missing) + " (see docs/how-to/deploy.md)", warning=True)
    return Result("job confinement", True, "Slurm keeps each job's processes, GPUs and memory "
                  "to itself (proctrack/cgroup, task/cgroup, ConstrainDevices, ConstrainRAMSpace)")


def _private_tmp(config: dict[str, str]) -> Result:
    plugin = private_tmp_plugin(config)
    if plugin:
        return Result("private /tmp", True, f"each job has its own /tmp and /dev/shm ({plugin})")
    return Result("private /tmp", True, "jobs share the node's /tmp and /dev/shm "
                  "(JobContainerType=job_container/tmpfs, or from Slurm 25.11 NamespaceType=namespace/tmpfs, with "
                  "PrologFlags=Contain; sessions still keep their files in a private folder of their own)", warning=True)


def _is_amount(value: str | None) -> bool:
    return bool(value) and value.isascii() and value.isdigit() and int(value) > 0  # 'UNLIMITED' or '0': no default


def _default_job_memory(config: dict[str, str]) -> Result:
    """What a job that names no memory gets. Without a default Slurm gives it the whole node's
    memory (with CR_*_Memory), and no session fits on that node until the job ends."""
    for name, unit in (("DefMemPerCPU", "per CPU"), ("DefMemPerNode", "per node")):
        if _is_amount(config.get(name)):
            return Result("default job memory", True, f"a job without --mem gets {config[name]} MB {unit} ({name})")
    job_defaults = dict(d.partition("=")[::2] for d in config.get("JobDefaults", "").split(",") if "=" in d)
    # DefMemPerGPU covers jobs with GPUs only: a plain CPU job still got the whole node (tried, Slurm 22.05).
    only_gpu = " DefMemPerGPU covers jobs with GPUs only;" if _is_amount(job_defaults.get("DefMemPerGPU")) else ""
    return Result("default job memory", True, f"no DefMemPerCPU or DefMemPerNode in slurm.conf:{only_gpu} a plain "
                  "sbatch without --mem takes a whole node's memory and blocks every session there (set "
                  "DefMemPerCPU; see docs/how-to/deploy.md)", warning=True)


def _notebook_schedules(config: dict[str, str]) -> Result:
    """Notebooks on a schedule need Slurm's cron: enabled in slurm.conf, and the scrontab command that
    sessions run (Debian bookworm's slurm-client lacks it: scripts/build-scrontab.sh)."""
    enabled = "enable" in config.get("ScronParameters", "").split(",")
    command = shutil.which("scrontab")
    if enabled and command:
        return Result("notebook schedules", True, f"Slurm's cron is enabled (ScronParameters=enable) and {command} "
                      "is here (install it on every compute node too)")
    missing = [what for what, ok in (("ScronParameters=enable in slurm.conf", enabled),
                                     ("the scrontab command (scripts/build-scrontab.sh)", command)) if not ok]
    return Result("notebook schedules", True, "notebooks cannot run on a schedule: no " + " and no ".join(missing),
                  warning=True)


def check_gpu_shares(settings) -> list[Result]:
    """Profiles offering shares of a GPU (gpu_shares): their partition's nodes give that many shards per
    GPU. Slurm 22.05 allocates a GPU and its shards independently: a whole-GPU job can land on a GPU whose
    shares are in use (tried on an H200: bench/results/gpu-shares.md), which only nodes kept apart avoid."""
    results = []
    slurm = SlurmCommands.from_settings(settings)
    for profile in (p for p in settings.profiles if p.gpu_shares):
        try:
            listing = slurm.run([slurm.tool("sinfo"), "-h", "-N", "-p", profile.partition, "-o", "%N %G"])
        except SlurmError as error:
            results.append(Result(f"GPU shares {profile.name}", True, f"not known ({error})", warning=True))
            continue
        counts = {}
        for line in listing.splitlines():
            name, _, gres = line.strip().partition(" ")
            gpus, shards = gpus_and_shards(gres)
            counts[name] = {"gpu": gpus, "shard": shards}
        wrong = [f"{n} ({c['shard']} shards for {c['gpu']} GPUs)" for n, c in sorted(counts.items())
                 if c["gpu"] and c["shard"] != c["gpu"] * profile.gpu_shares]
        if not counts or wrong:
            results.append(Result(f"GPU shares {profile.name}", True, f"partition {profile.partition} should give "
                                  f"{profile.gpu_shares} shards per GPU (gres.conf Name=shard, slurm.conf Gres=shard:N): "
                                  + (", ".join(wrong) if wrong else "no nodes"), warning=True))
            continue
        whole = sorted(p.name for p in settings.profiles if p.partition == profile.partition and any(p.gpu_choices))
        detail = f"{profile.gpu_shares} shares per GPU on {', '.join(sorted(counts))}"
        if whole:
            results.append(Result(f"GPU shares {profile.name}", True, f"{detail}; profiles {', '.join(whole)} give "
                                  "whole GPUs on the same nodes: Slurm 22.05 may place a whole-GPU job on a GPU whose "
                                  "shares are in use (keep shares on nodes of a partition of their own)", warning=True))
        else:
            results.append(Result(f"GPU shares {profile.name}", True, detail))
    return results


def check_confinement(settings) -> list[Result]:
    """What keeps slices that share a node apart beyond files and ports: Slurm's confinement of
    each job (its processes, GPUs, memory, /tmp) and the node's /proc."""
    try:
        config = SlurmCommands.from_settings(settings).config()
    except SlurmError as error:
        results = [Result("job confinement", True, f"not known ({error})", warning=True)]
    else:
        results = [_job_confinement(config), _private_tmp(config), _default_job_memory(config),
                   _notebook_schedules(config)]
    hidepid = proc_hidepid()
    if hidepid in HIDEPID_INVISIBLE:
        results.append(Result("private processes", True, f"/proc has hidepid={hidepid}: users see only their own processes"))
    elif hidepid in ("noaccess", "1"):
        results.append(Result("private processes", True, f"/proc has hidepid={hidepid}: users cannot read others' "
                              "processes but still see that they exist (hidepid=invisible hides them)"))
    else:
        results.append(Result("private processes", True, "users see each other's processes and command lines "
                              "(mount /proc with hidepid=invisible, see docs/how-to/deploy.md)", warning=True))
    return results


def check_accounting(settings) -> Result:
    slurm = SlurmCommands.from_settings(settings)
    try:
        slurm.accounting_since("now-1minutes", ("JobID",), timeout=30)
        problem = ""
    except SlurmError as error:
        problem = str(error) or "no answer"
    backlog = slurm.accounting_backlog()
    held = (f"slurmctld holds {backlog} record(s) for slurmdbd and sends them once it answers (sdiag's DBD Agent "
            "queue)" if backlog else "")
    if problem and backlog:
        return Result("Slurm accounting", True, f"accounting is behind: sacct does not answer "
                      f"({problem.splitlines()[-1]}); {held}. Meanwhile finished jobs show as UNKNOWN once "
                      "slurmctld forgets them and `dsportal usage` has no data; sessions still start "
                      "(slurmdbd; see docs/how-to/deploy.md)", warning=True)
    if problem:
        return Result("Slurm accounting", True, f"sacct does not answer ({problem.splitlines()[-1]}): finished "
                      "jobs show as UNKNOWN once slurmctld forgets them and `dsportal usage` has no data "
                      "(slurmdbd; see docs/how-to/deploy.md)", warning=True)
    if backlog and backlog >= CATCHING_UP:
        return Result("Slurm accounting", True, f"accounting is catching up: {held}; `dsportal usage` may miss the "
                      "latest jobs until they are in", warning=True)
    return Result("Slurm accounting", True, "sacct answers: final states and GPU-hours are kept (dsportal usage)")


def first_portal_user(settings) -> str | None:
    """Some account the mediator would serve (slurm.people_uids), to ask sudo about."""
    low, high = settings.slurm.people_uids
    return next((u.pw_name for u in sorted(pwd.getpwall(), key=lambda u: u.pw_uid) if low <= u.pw_uid <= high), None)


def check_people_uids(settings) -> Result | None:
    """The mediator's installed range (/etc/dsportal/mediator.json) is portal.yaml's slurm.people_uids: a range
    edited there by hand before 0.4 is what the site's people have, and logins now go by portal.yaml's."""
    try:
        installed = json.loads(hubaccount.MEDIATOR_SETTINGS.read_text())
        mediator = (int(installed["min_uid"]), int(installed["max_uid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not installed (yet): check_hub_account says so
    wanted = tuple(settings.slurm.people_uids)
    if mediator == wanted:
        return None
    return Result("people's uids", False, f"{hubaccount.MEDIATOR_SETTINGS} serves uids {mediator[0]} to {mediator[1]}, "
                  f"portal.yaml's slurm.people_uids says {wanted[0]} to {wanted[1]} (logins go by it): set "
                  "slurm.people_uids to your people's range, then dsportal hub install-mediator")


def check_hub_account(settings) -> Result:
    """The hub's own account may do what the portal needs as users (the mediator), and no more."""
    mediator = Path(settings.slurm.mediator)
    if not settings.hub.account:
        installed = mediator.is_file() and mediator.stat().st_uid == 0 and not mediator.stat().st_mode & 0o022
        return Result("hub account", installed, "the hub runs as root (hub.account unset; docs/how-to/deploy.md says "
                      f"how to run it unprivileged); mediator {mediator} " + ("installed" if installed else
                      "missing or not root's: dsportal hub install-mediator"), warning=installed)
    user = first_portal_user(settings)
    if user is None:
        return Result("hub account", False, "no portal user (uid in slurm.people_uids) to check the sudo rule with")
    ok, detail = hubaccount.check_sudo_rules(settings.hub.account, mediator, user)
    return Result("hub account", ok, detail)


def run_checks(config_path=None, production: bool = False) -> tuple[bool, str]:
    """Every check, one line each. ``production`` (`dsportal check`): the demo's settings are refused unless
    DSPORTAL_DEMO=1 (settings.refuse_demo)."""
    try:
        settings = settings_module.load(config_path)
        if production:
            settings_module.refuse_demo(settings)
    except settings_module.SettingsError as error:
        return False, f"  [FAIL] configuration: {error}"
    results = [Result("configuration", True, f"{settings.source} is valid ({len(settings.profiles)} profiles)")]
    results += [Result("configuration", True, notice, warning=True) for notice in settings.notices]
    results += check_slurm(settings)
    results += check_nodes(settings)
    results += check_mpi(settings)
    results.append(check_accounting(settings))
    results.append(check_oidc(settings) if settings.oidc else check_ldap(settings))
    results.append(check_user_environment(settings))
    results += check_tools(settings)
    results += check_templates(settings)
    results += check_images(settings)
    results.append(check_homes())
    results.append(check_firewall())
    hub_ports = check_hub_ports(settings)
    if hub_ports:
        results.append(hub_ports)
    results += check_confinement(settings)
    results += check_gpu_shares(settings)
    results.append(check_hub_account(settings))
    people = check_people_uids(settings)
    if people:
        results.append(people)
    ok = all(r.ok for r in results)
    return ok, "\n".join(r.line() for r in results)
