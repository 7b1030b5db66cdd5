"""The embedded one-machine cluster: munge, slurmctld, slurmd per node, slapd, demo users, hub.

Every daemon is real and started by this module; all of their state lives under one
directory (``$DSPORTAL_DEMO_DIR``, default /var/lib/dsportal-demo). ``up`` is idempotent:
what already runs is left alone. Outside that directory it touches only /etc/hosts (node
names) and the demo users' Unix accounts, which must match LDAP for jobs to run as them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2
import yaml

from . import settings as settings_module

STATE = Path(os.environ.get("DSPORTAL_DEMO_DIR", "/var/lib/dsportal-demo"))
NODES = 2
GPUS_PER_NODE = 4
CPUS_PER_NODE = 32      # 4 GPUs x 8 cores: a full 4-GPU slice fits one node
MEM_MB_PER_NODE = 200_000  # 4 x 48 GB + room (each job's own memory limit is enforced, cgroup.conf)
GPU_MAJOR = 195  # the NVIDIA driver's character-device major: node N's GPU k is 195:(N-1)*4+k
CTLD_PORT, SLURMD_PORT, FIRST_NODE_PORT = 6817, 6818, 17001
DBD_PORT, MARIADB_PORT = 17819, 17306  # slurmdbd and its MariaDB, on 127.0.0.1 only
SLURM_CONF_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "job_container.conf")


class DemoError(RuntimeError):
    pass


def _demo_file(name: str) -> Path:
    checkout = Path(__file__).resolve().parent.parent / "config" / "demo" / name
    return checkout if checkout.exists() else Path(str(resources.files("dsportal_config.demo") / name))


def _render(name: str, **context) -> str:
    return jinja2.Template(_demo_file(name).read_text(), undefined=jinja2.StrictUndefined).render(**context)


def directory() -> dict:
    return yaml.safe_load(_demo_file("users.yaml").read_text())


def ssha(password: str) -> str:
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise DemoError(f"{' '.join(argv)} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}")
    return result


def _alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    # A recycled pid of some other program is not our daemon.
    try:
        if Path(f"/proc/{pid}/status").read_text().startswith("Name:\tzombie"):
            return None
    except OSError:
        return None
    return pid


def _stop_pid(pidfile: Path, name: str, wait: float = 10.0) -> None:
    pid = _alive(pidfile)
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and _alive(pidfile):
        time.sleep(0.2)
    if _alive(pidfile):
        os.kill(pid, signal.SIGKILL)
    _say(f"stopped {name}")
    pidfile.unlink(missing_ok=True)


def _wait_for(check, what: str, timeout: float = 30.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as error:  # noqa: BLE001 - any failure means "not yet"
            last_error = error
        time.sleep(interval)
    raise DemoError(f"{what} did not come up within {timeout:.0f} s" + (f": {last_error}" if last_error else ""))


@dataclass(frozen=True)
class Paths:
    root: Path

    def __getattr__(self, name):  # state.munge, state.slurm, state.ldap, state.log, state.run, state.gpus
        return self.root / name


def paths() -> Paths:
    return Paths(STATE)


# ----------------------------------------------------------------------------- pieces
def ensure_hosts() -> None:
    names = [f"node{i}" for i in range(1, NODES + 1)]
    text = Path("/etc/hosts").read_text()
    known = {word for line in text.splitlines() if not line.lstrip().startswith("#") for word in line.split()[1:]}
    missing = [n for n in names if n not in known]
    if missing:
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(missing)}  # dsportal demo nodes\n")
        _say(f"/etc/hosts: {' '.join(missing)} -> 127.0.0.1")


def ensure_munge() -> None:
    p = paths()
    key_dir, run_dir = p.munge / "key", p.munge / "run"
    if _alive(run_dir / "munged.pid"):
        link_default_munge_socket()
        return
    for folder, mode in ((p.munge, 0o755), (key_dir, 0o700), (run_dir, 0o755)):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, mode)
    key = key_dir / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    shutil.chown(p.munge, "munge", "munge")
    for path in (key_dir, run_dir, key):
        shutil.chown(path, "munge", "munge")
    os.chmod(key, 0o400)
    _run([
        "runuser", "-u", "munge", "--", "/usr/sbin/munged",
        f"--key-file={key}", f"--socket={run_dir}/munge.socket", f"--pid-file={run_dir}/munged.pid",
        f"--log-file={key_dir}/munged.log", f"--seed-file={key_dir}/munged.seed",
    ])
    _wait_for(lambda: (run_dir / "munge.socket").exists(), "munged")
    _say("munged started")
    link_default_munge_socket()


def link_default_munge_socket() -> None:
    """sacct and sacctmgr authenticate to slurmdbd through munge's default socket, whatever
    slurm.conf's AuthInfo says: point it at the demo's munged where no system munged runs."""
    default = Path("/run/munge/munge.socket.2")
    ours = paths().munge / "run" / "munge.socket"
    if default.is_symlink() and not default.exists():
        default.unlink()  # left from an earlier demo
    if not default.exists():
        default.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(default.parent, 0o755)
        default.symlink_to(ours)


def ensure_gpus() -> None:
    """Fake GPUs: character devices with the NVIDIA driver's numbers (no driver behind them, so
    opening one gives ENXIO). Each has its own number, as real GPUs do, so Slurm's device cgroup
    can let a job open its own GPUs and refuse the others (EPERM): on a shared node a user who
    unsets CUDA_VISIBLE_DEVICES still cannot reach another slice's GPU."""
    gpus = paths().gpus
    gpus.mkdir(parents=True, exist_ok=True)
    os.chmod(gpus, 0o755)
    for node in range(1, NODES + 1):
        for index in range(GPUS_PER_NODE):
            device = gpus / f"node{node}-gpu{index}"
            number = os.makedev(GPU_MAJOR, (node - 1) * GPUS_PER_NODE + index)
            if device.exists() and device.stat().st_rdev != number:
                device.unlink()  # an earlier demo's device (all were 1:3, /dev/null's number)
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, number)
            os.chmod(device, 0o666)


def slurm_conf_path() -> Path:
    return paths().slurm / "slurm.conf"


def write_slurm_conf() -> bool:
    p = paths()
    for folder in (p.slurm / "state", p.slurm / "spool", p.log, p.run):
        folder.mkdir(parents=True, exist_ok=True)
    os.chmod(p.root, 0o755)
    os.chmod(p.slurm, 0o755)
    nodes = [{"name": f"node{i}", "port": FIRST_NODE_PORT + i - 1} for i in range(1, NODES + 1)]
    conf = _render(
        "slurm.conf.j2",
        hostname=socket.gethostname(),
        state=p.root,
        ctld_port=CTLD_PORT,
        slurmd_port=SLURMD_PORT,
        dbd_port=DBD_PORT,
        nodes=nodes,
        node_list=f"node[1-{NODES}]",
        cpus_per_node=CPUS_PER_NODE,
        mem_mb_per_node=MEM_MB_PER_NODE,
        gpus_per_node=GPUS_PER_NODE,
    )
    gres = "".join(
        f"NodeName=node{i} Name=gpu File={p.gpus}/node{i}-gpu[0-{GPUS_PER_NODE - 1}]\n" for i in range(1, NODES + 1)
    )
    cgroup = _render("cgroup.conf.j2")
    job_container = _render("job_container.conf.j2", nodes=nodes, base=p.root / "jobtmp")
    changed = False
    for name, text in zip(SLURM_CONF_FILES, (conf, gres, cgroup, job_container)):
        target = p.slurm / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            os.chmod(target, 0o644)
            changed = True
    return changed


def ensure_accounting() -> None:
    """Slurm accounting: a private MariaDB (127.0.0.1 only) and slurmdbd, so `sacct` keeps every job's
    final state and usage (GPU-hours) after slurmctld forgets it."""
    p = paths()
    # MariaDB runs as mysql: its socket, pid file and log live in a folder of its own.
    data_dir, run_dir = p.root / "mariadb", p.root / "mariadb-run"
    socket_path, pidfile = run_dir / "mariadb.sock", run_dir / "mariadb.pid"
    run_dir.mkdir(exist_ok=True)
    shutil.chown(run_dir, "mysql", "mysql")
    password_file = p.slurm / "dbd-password"
    if not password_file.exists():
        password_file.write_text(os.urandom(18).hex())
        os.chmod(password_file, 0o600)
    password = password_file.read_text().strip()
    if not (data_dir / "mysql").exists():
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        shutil.chown(data_dir, "mysql", "mysql")
        _run(["mariadb-install-db", "--user=mysql", f"--datadir={data_dir}", "--auth-root-authentication-method=socket",
              "--skip-test-db"])
        _say("MariaDB for Slurm accounting created")
    if not _alive(pidfile):
        subprocess.Popen(
            ["/usr/sbin/mariadbd", "--user=mysql", f"--datadir={data_dir}", f"--socket={socket_path}",
             f"--port={MARIADB_PORT}", "--bind-address=127.0.0.1", f"--pid-file={pidfile}",
             f"--log-error={run_dir / 'mariadb.log'}", "--skip-name-resolve", "--innodb-buffer-pool-size=64M"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_for(lambda: socket_path.exists() and _alive(pidfile), f"MariaDB (log: {run_dir / 'mariadb.log'})",
                  timeout=60)
        _say(f"MariaDB started on 127.0.0.1:{MARIADB_PORT}")
    sql = ("CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
           f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
    _run(["mariadb", f"--socket={socket_path}", "-e", sql])
    conf = _render("slurmdbd.conf.j2", state=p.root, dbd_port=DBD_PORT, db_port=MARIADB_PORT, password=password)
    target = p.slurm / "slurmdbd.conf"
    if not target.exists() or target.read_text() != conf:
        target.write_text(conf)
    os.chmod(target, 0o600)  # slurmdbd refuses a readable one: it holds the database password
    env = slurm_env()
    if not _alive(p.run / "slurmdbd.pid"):
        _run(["/usr/sbin/slurmdbd"], env=env)
        _wait_for(lambda: socket.create_connection(("127.0.0.1", DBD_PORT), timeout=1).close() or True,
                  "slurmdbd", timeout=60)
        _say(f"slurmdbd started on 127.0.0.1:{DBD_PORT}")


def ensure_slurm_associations() -> None:
    """What slurm.conf's AccountingStorageEnforce asks for: the QoS with their limits and an
    association (account + user) for each demo user, from users.yaml. Idempotent."""
    env = slurm_env()
    data = directory()

    def sacctmgr(*args: str) -> None:
        result = subprocess.run(["sacctmgr", "-i", *args], env=env, capture_output=True, text=True)
        if result.returncode != 0 and not ("Nothing new added" in result.stdout or "already exists" in result.stdout):
            raise DemoError(f"sacctmgr {' '.join(args)} failed: {(result.stderr or result.stdout).strip()}")

    for qos in data["slurm_qos"]:
        sacctmgr("add", "qos", qos["name"])
        # A limit on gres/gpu needs that TRES in the database, which slurmctld adds when it first
        # registers (AccountingStorageTRES): on a fresh machine that is a moment after it starts.
        _wait_for(lambda: sacctmgr("modify", "qos", "where", f"name={qos['name']}", "set",
                                   f"Description={qos['description']}", f"MaxTRESPerUser={qos['max_tres_per_user']}",
                                   f"Flags={qos['flags']}") or True,
                  f"the limits of QoS {qos['name']}", timeout=60, interval=1)
    for account in data["slurm_accounts"]:
        users = ",".join(account["users"])
        sacctmgr("add", "account", account["name"], f"Description={account['description']}", "Organization=dsportal")
        sacctmgr("add", "user", users, f"Account={account['name']}")
        if account.get("qos"):
            sacctmgr("modify", "user", "where", f"name={users}", f"account={account['name']}", "set",
                     f"QOS={','.join(account['qos'])}", "DefaultQOS=normal")


def slurm_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(slurm_conf_path())}


def ensure_slurm() -> None:
    p = paths()
    ensure_gpus()
    write_slurm_conf()
    ensure_accounting()
    env = slurm_env()
    # The cluster is in the accounting database before slurmctld registers with it.
    subprocess.run(["sacctmgr", "-i", "add", "cluster", "dsportal"], env=env, capture_output=True, text=True)
    ctld_pidfile = p.run / "slurmctld.pid"
    newest_conf = max((p.slurm / name).stat().st_mtime for name in SLURM_CONF_FILES)
    if _alive(ctld_pidfile) and newest_conf > ctld_pidfile.stat().st_mtime:
        # A new slurm.conf (e.g. accounting turned on): restart the daemons; running jobs are kept.
        _stop_pid(p.run / "slurmctld.pid", "slurmctld")
        for i in range(1, NODES + 1):
            _stop_pid(p.run / f"slurmd-node{i}.pid", f"slurmd node{i}")
    if not _alive(p.run / "slurmctld.pid"):
        _run(["/usr/sbin/slurmctld"], env=env)
        _say("slurmctld started")
    _wait_for(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.count("UP"),
              "slurmctld", timeout=30)
    ensure_slurm_associations()
    restarted_at = None
    for i in range(1, NODES + 1):
        if not _alive(p.run / f"slurmd-node{i}.pid"):
            restarted_at = restarted_at or time.time()
            _run(["/usr/sbin/slurmd", "-N", f"node{i}"], env=env)
            _say(f"slurmd node{i} started")

    def nodes_ready():
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        bad = {n: s for n, s in states.items() if s.rstrip("*~#") not in ("idle", "mix", "alloc", "comp")}
        if bad:
            for node in bad:  # a node left down by an earlier run comes back
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, capture_output=True)
            return False
        return len(states) == NODES

    _wait_for(nodes_ready, "the slurmd nodes", timeout=60, interval=1)
    if restarted_at:
        reap_orphaned_jobs(env, before=restarted_at)


def reap_orphaned_jobs(env: dict[str, str], before: float) -> None:
    """Cancel jobs Slurm still counts as running whose processes died with the machine's.

    All demo "nodes" are this host: when the slurmds had to be started again (the processes were
    killed, not the host rebooted, so Slurm sees no node reboot), a job started earlier with no
    slurmstepd left is gone. Without this the hub would wait http_timeout on each such session.
    """
    out = subprocess.run(["squeue", "-h", "-t", "R,CG", "-o", "%i %S %u"], env=env,
                         capture_output=True, text=True).stdout
    live = subprocess.run(["pgrep", "-a", "slurmstepd"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        job_id, start, user = line.split()
        try:
            started = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            continue
        if started >= before or f"[{job_id}." in live:
            continue
        subprocess.run(["scancel", job_id], env=env, capture_output=True)
        _say(f"job {job_id} of {user} had no processes left after a restart: cancelled")


def ensure_accounts() -> None:
    """Unix accounts matching the LDAP entries: jobs must run as the user who logged in."""
    data = directory()
    for user in data["users"]:
        name, uid = user["name"], int(user["uid"])
        try:
            existing = pwd.getpwnam(name)
            if existing.pw_uid != uid:
                raise DemoError(f"Unix account {name} exists with uid {existing.pw_uid}, LDAP says {uid}")
        except KeyError:
            if subprocess.run(["getent", "group", name], capture_output=True).returncode != 0:
                _run(["groupadd", "-g", str(uid), name])
            _run(["useradd", "-m", "-u", str(uid), "-g", str(uid), "-s", "/bin/bash", "-c", user["full_name"], name])
            _say(f"Unix account {name} (uid {uid})")
        # Private homes: the demo's users share its nodes like strangers share a GPU node.
        os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
    for group in data["groups"]:
        if subprocess.run(["getent", "group", group["name"]], capture_output=True).returncode != 0:
            _run(["groupadd", "-g", str(group["gid"]), group["name"]])
        for member in group["members"]:
            _run(["usermod", "-a", "-G", group["name"], member])


def ensure_firewall() -> None:
    """The node firewall with the demo's accounts as portal users (see portal/firewall.py)."""
    from . import firewall

    uids = [int(u["uid"]) for u in directory()["users"]]
    try:
        if firewall.users() != sorted(uids):
            firewall.up(uids)
            _say(f"node firewall: TCP services of the {len(uids)} demo users are their own")
    except firewall.FirewallUnavailable as error:
        _say(f"node firewall unavailable ({error}): users' TCP ports stay reachable from other users' "
             "processes (sessions' /proxy/ and files are still private)")


def ensure_private_processes() -> None:
    """/proc with hidepid=invisible: a user sees only their own processes (with their command
    lines and working folders), as on a machine of their own; root (slurmd, the hub) sees all.
    A node setting, like the firewall; a cluster puts it in /etc/fstab (docs/admin.md)."""
    from .check import HIDEPID_INVISIBLE, proc_hidepid

    if proc_hidepid() in HIDEPID_INVISIBLE:
        return
    result = subprocess.run(["mount", "-o", "remount,hidepid=invisible", "/proc"], capture_output=True, text=True)
    if result.returncode == 0:
        _say("/proc: users see only their own processes (hidepid=invisible)")
    else:
        _say(f"/proc could not be remounted with hidepid=invisible ({(result.stderr or '').strip()}): "
             "users see each other's processes and command lines (files, ports and GPUs stay private)")


def ensure_ldap() -> None:
    p = paths()
    data = directory()
    ldap = p.ldap
    config_dir, data_dir = ldap / "slapd.d", ldap / "data"
    if not (config_dir / "cn=config.ldif").exists():
        shutil.rmtree(ldap, ignore_errors=True)
        for folder in (config_dir, data_dir, p.run):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(ldap, 0o700)
        users = [{**u, "password_hash": ssha(u["password"])} for u in data["users"]]
        (ldap / "config.ldif").write_text(
            _render("slapd-config.ldif.j2", state=p.root, base_dn=data["base_dn"],
                    root_password_hash=ssha(os.urandom(16).hex()))
        )
        (ldap / "directory.ldif").write_text(
            _render("directory.ldif.j2", base_dn=data["base_dn"], users=users, groups=data["groups"])
        )
        _run(["slapadd", "-n", "0", "-F", str(config_dir), "-l", str(ldap / "config.ldif")])
        _run(["slapadd", "-n", "1", "-F", str(config_dir), "-l", str(ldap / "directory.ldif")])
        _say("LDAP directory created")
    if not _alive(p.run / "slapd.pid"):
        url = f"ldap://127.0.0.1:{data['ldap_port']}/"
        _run(["/usr/sbin/slapd", "-h", url, "-F", str(config_dir)])
        _wait_for(lambda: socket.create_connection(("127.0.0.1", data["ldap_port"]), timeout=1).close() or True,
                  "slapd")
        _say(f"slapd started on {url}")


def ensure_images(config_path: Path | None = None) -> None:
    """The demo's container image(s) and the shared dataset folder bound into kernels."""
    from . import images

    settings = settings_module.load(config_path)
    for mount in settings.data_mounts:
        folder = Path(mount.source)
        if not folder.exists():
            folder.mkdir(parents=True)
            (folder / "README.txt").write_text("Shared datasets of the dsportal demo (read-only in kernels).\n")
            os.chmod(folder, 0o755)
    for image in images.unbuilt_demo_images(settings):
        images.build(image, [m.target for m in settings.data_mounts], force=False)


def ensure_courses(config_path: Path | None = None) -> None:
    """Course folders of the demo's instructors (template sources with an owner): created once,
    seeded from config/demo/courses/<name>/, then the instructor's own to edit."""
    settings = settings_module.load(config_path)
    for source in settings.templates.sources:
        folder = Path(source.path)
        if not source.owner or folder.exists():
            continue
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(folder.parent, 0o755)
        seed = _demo_file("courses") / source.name
        if seed.is_dir():
            shutil.copytree(seed, folder)
        else:
            folder.mkdir()
        entry = pwd.getpwnam(source.owner)
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        _say(f"course folder {folder} (owner {source.owner})")


def hub_running(settings) -> bool:
    try:
        with urllib.request.urlopen(f"{settings.hub.bind_url.rstrip('/')}/hub/api", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def hub_pidfile() -> Path:
    return paths().run / "dsportal-hub.pid"


def code_fingerprint() -> str:
    """Hash of the installed portal code and the config: a change means the hub must restart."""
    import spawner

    digest = hashlib.sha256()
    roots = [Path(__file__).parent, Path(spawner.__file__).parent]
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".j2", ".yaml") and path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_hub(config_path: Path | None = None) -> None:
    settings = settings_module.load(config_path)
    fingerprint = f"{code_fingerprint()}-{hashlib.sha256(settings.source.read_bytes()).hexdigest()[:8]}"
    stamp = paths().run / "dsportal-hub.code"
    if _alive(hub_pidfile()) and hub_running(settings):
        if stamp.exists() and stamp.read_text() == fingerprint:
            return
        # New code or config: restart the hub. Sessions are Slurm jobs and survive it.
        _say("portal code or config changed: restarting JupyterHub (running sessions are kept)")
        stop_hub()
    log_path = paths().log / "hub.log"
    env = {**os.environ, settings_module.CONFIG_ENV: str(settings.source)}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dsportal"), "hub"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    hub_pidfile().write_text(str(process.pid))
    stamp.write_text(fingerprint)

    def up():
        if process.poll() is not None:
            raise DemoError(f"the hub exited ({process.returncode}); see {log_path}")
        return hub_running(settings)

    try:
        _wait_for(up, "JupyterHub", timeout=60)
    except DemoError as error:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise DemoError(f"{error}\n{tail}") from None
    _say(f"JupyterHub started (log {log_path})")


# ------------------------------------------------------------------------- commands
def up(config_path: Path | None = None, with_hub: bool = True) -> None:
    if os.geteuid() != 0:
        raise DemoError("the demo cluster runs its daemons as root: run it as root (sudo make demo)")
    STATE.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE, 0o755)
    (STATE / "run").mkdir(exist_ok=True)
    (STATE / "log").mkdir(exist_ok=True)
    ensure_hosts()
    ensure_munge()
    ensure_accounts()  # Unix accounts first: Slurm's associations name them
    ensure_slurm()
    ensure_firewall()
    ensure_private_processes()
    ensure_ldap()
    ensure_images(config_path)
    ensure_courses(config_path)
    if with_hub:
        ensure_hub(config_path)


def stop_hub() -> None:
    _stop_pid(hub_pidfile(), "JupyterHub")
    settings = None
    try:
        settings = settings_module.load()
    except settings_module.SettingsError:
        pass
    if settings:
        _stop_pid(Path(settings.hub.data_dir) / "proxy.pid", "configurable-http-proxy")


def down() -> None:
    p = paths()
    stop_hub()
    env = slurm_env()
    if _alive(p.run / "slurmctld.pid"):
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
            _say(f"cancelled {len(jobs)} job(s)")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and subprocess.run(
                ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True
            ).stdout.strip():
                time.sleep(0.5)
    for i in range(1, NODES + 1):
        _stop_pid(p.run / f"slurmd-node{i}.pid", f"slurmd node{i}")
    _stop_pid(p.run / "slurmctld.pid", "slurmctld")
    _stop_pid(p.run / "slurmdbd.pid", "slurmdbd")
    _stop_pid(p.root / "mariadb-run" / "mariadb.pid", "MariaDB", wait=30)
    _stop_pid(p.run / "slapd.pid", "slapd")
    _stop_pid(p.munge / "run" / "munged.pid", "munged")


def status() -> dict[str, bool]:
    p = paths()
    result = {"munged": bool(_alive(p.munge / "run" / "munged.pid")),
              "slurmctld": bool(_alive(p.run / "slurmctld.pid")),
              "slurmdbd": bool(_alive(p.run / "slurmdbd.pid")),
              "MariaDB": bool(_alive(p.root / "mariadb-run" / "mariadb.pid"))}
    for i in range(1, NODES + 1):
        result[f"slurmd node{i}"] = bool(_alive(p.run / f"slurmd-node{i}.pid"))
    result["slapd"] = bool(_alive(p.run / "slapd.pid"))
    result["hub"] = bool(_alive(hub_pidfile()))
    return result


def banner(settings) -> str:
    data = directory()
    lines = [
        "",
        f"dsportal is up: open {settings.hub.bind_url}",
        "",
        "Demo accounts (LDAP):",
    ]
    for user in data["users"]:
        lines.append(f"  {user['name']:<8} password {user['password']:<14} {user['role']}")
    lines += ["", f"State: {STATE}   Stop: make stop   Logs: {STATE}/log/"]
    return "\n".join(lines)
