"""The demo's Slurm: munge, fake GPUs, slurm.conf and its friends, slurmctld and one slurmd per node."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from democluster.accounting import DBD_PORT, directory, ensure_accounting, ensure_slurm_associations
from democluster.base import (
    CONFIGLESS,
    SLURM_RELEASE,
    DemoError,
    alive,
    paths,
    recorded_release,
    release_file,
    render,
    run,
    say,
    slurm_build,
    slurm_daemon,
    slurm_env,
    slurm_prefix,
    stop_pid,
    wait_for,
    write_if_changed,
)
from democluster.mta import MAIL_PROGRAM, mail_domain
from democluster.network import LOGIN_ADDRESS, NODES, address, in_node, node_names

GPUS_PER_NODE = 4  # node1 and node2: whole GPUs (partitions gpu and cpu)
# node3 is a node of GPU shares alone (partition share: Slurm's shard GRES, several jobs on one GPU):
# the class-gpu profile's "¼ GPU" (portal.yaml gpu_shares). Slurm 22.05 allocates a GPU and its shards
# independently, so shares keep to nodes no whole-GPU job reaches (dsportal check says so). 28 GPUs
# give 112 shares: a class of 100 at once, each share with its 2 cores and 12 GB.
SHARE_NODE, SHARE_NODE_GPUS, SHARDS_PER_GPU = "node3", 28, 4
SHARE_NODE_CPUS = SHARE_NODE_GPUS * SHARDS_PER_GPU * 2
SHARE_NODE_MEM_MB = SHARE_NODE_GPUS * SHARDS_PER_GPU * 12 * 1024 + 16_384
# Declared, not this machine's (slurmd's config_overrides; jobs run under SCHED_IDLE on its 2 cores):
# what a department's sessions need. 32 cores for a full 4-GPU slice (4 x 8) beside 64 for the cpu
# partition (its MaxCPUsPerNode), so the cpu partition holds a class of 100 one-core sessions on two
# nodes (with fewer cores per node, much of such a class waits in the queue).
CPUS_PER_NODE = 96
# 4 x 48 GB for the GPU slices + 64 x 4 GB for the cpu partition's cores (cpu profile: 4 cores, 16 GB),
# and above slurm.conf's DefMemPerCPU x CPUS_PER_NODE (6000 MB x 96). Each job's own memory limit is
# enforced (cgroup.conf): a session's processes get what it asked for, however much is declared here.
MEM_MB_PER_NODE = 600_000
GPU_MAJOR = 195  # the NVIDIA driver's character-device major: the demo's GPUs are 195:0, 195:1, ... in node order
CTLD_PORT, SLURMD_PORT = 6817, 6818  # Slurm's own: each node has its own addresses
SLURM_CONF_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "job_container.conf")


# The compute nodes' jobs run on the CPU the login node's services (hub, proxy, slurmctld, slapd)
# leave, as on machines of their own. With cgroup v1's cpu controller, each node's slurmd, and so
# every job, starts in one cpu cgroup weighted as a sixteenth of one ordinary task (cpu.shares 64
# of 1024): a class of 100 starting at once weighs that little against the hub, which keeps
# answering while they start, and the class is ready no later (bench/results/session-start.md).
# Tasks outside the root cgroup are not autogrouped, so the weight holds.
# Elsewhere (cgroup v2, where slurmd places its steps itself) slurmd runs under SCHED_IDLE, as
# before: jobs inherit it (PropagatePrioProcess=0), but the kernel's autogroup weighs each job's
# session as one ordinary task (bench/results/session-start.md). A nice value is not enough: 30 sessions starting at
# nice 10 together outweigh the hub (CFS weights 30 x 110 against 1024).
NODES_CPU_CGROUP = Path("/sys/fs/cgroup/cpu/dsportal-demo-nodes")
NODES_CPU_SHARES = 64


def nodes_cpu_cgroup() -> Path | None:
    """The nodes' cpu cgroup (made and weighted), or None without cgroup v1's cpu controller or
    where it cannot be written (a read-only cgroup mount, as in some containers)."""
    if not (NODES_CPU_CGROUP.parent / "cpu.shares").is_file():
        return None
    try:
        NODES_CPU_CGROUP.mkdir(exist_ok=True)
        (NODES_CPU_CGROUP / "cpu.shares").write_text(str(NODES_CPU_SHARES))
    except OSError as error:
        say(f"the nodes' jobs run under SCHED_IDLE instead ({NODES_CPU_CGROUP}: {error})")
        return None
    return NODES_CPU_CGROUP


def jobs_yield() -> list[str]:
    """What a node's slurmd is started under so that its jobs yield (above)."""
    cgroup = nodes_cpu_cgroup()
    if cgroup:
        return ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "slurmd-in-cgroup"]
    return ["chrt", "--idle", "0"]


def make_running_slurmd_yield(pid: int) -> None:
    """A slurmd started by an earlier make demo: its next jobs yield as above."""
    cgroup = nodes_cpu_cgroup()
    if cgroup:
        (cgroup / "cgroup.procs").write_text(str(pid))
        subprocess.run(["chrt", "--all-tasks", "--other", "--pid", "0", str(pid)], capture_output=True)
    else:
        subprocess.run(["chrt", "--all-tasks", "--idle", "--pid", "0", str(pid)], capture_output=True)


def ensure_munge() -> None:
    p = paths()
    key_dir, run_dir = p.munge / "key", p.munge / "run"
    if alive(run_dir / "munged.pid"):
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
    run([
        "runuser", "-u", "munge", "--", "/usr/sbin/munged",
        f"--key-file={key}", f"--socket={run_dir}/munge.socket", f"--pid-file={run_dir}/munged.pid",
        f"--log-file={key_dir}/munged.log", f"--seed-file={key_dir}/munged.seed",
    ])
    wait_for(lambda: (run_dir / "munge.socket").exists(), "munged")
    say("munged started")
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
    minor = 0
    for node in node_names():
        for index in range(gpus_of(node)):
            device = gpus / f"{node}-gpu{index}"
            number = os.makedev(GPU_MAJOR, minor)
            minor += 1
            if device.exists() and device.stat().st_rdev != number:
                device.unlink()  # an earlier demo's device (all were 1:3, /dev/null's number)
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, number)
            os.chmod(device, 0o666)


def gpus_of(node: str) -> int:
    return SHARE_NODE_GPUS if node == SHARE_NODE else GPUS_PER_NODE


def node_line(node: str) -> dict:
    """A node of slurm.conf: its name, address, CPUs, memory and GRES."""
    gpus = gpus_of(node)
    if node == SHARE_NODE:
        cpus, mem, gres = SHARE_NODE_CPUS, SHARE_NODE_MEM_MB, f"gpu:{gpus},shard:{gpus * SHARDS_PER_GPU}"
    else:
        cpus, mem, gres = CPUS_PER_NODE, MEM_MB_PER_NODE, f"gpu:{gpus}"
    return {"name": node, "address": address(node), "cpus": cpus, "mem_mb": mem, "gres": gres}


def write_slurm_conf() -> bool:
    p = paths()
    for folder in (p.slurm / "state", p.slurm / "spool", p.log, p.run):
        folder.mkdir(parents=True, exist_ok=True)
    os.chmod(p.root, 0o755)
    os.chmod(p.slurm, 0o755)
    # slurmd's spool (each job's folder, named after its id, and its script): a user may reach her
    # job's folder, which Slurm makes hers, but not list the others (ids, owners).
    for spool in (p.slurm / "spool", *(p.slurm / "spool" / node for node in node_names())):
        spool.mkdir(exist_ok=True)
        os.chmod(spool, 0o711)
    nodes = [node_line(name) for name in node_names()]
    conf = render(
        "slurm.conf.j2",
        hostname=socket.gethostname(),
        login_address=LOGIN_ADDRESS,
        state=p.root,
        ctld_port=CTLD_PORT,
        slurmd_port=SLURMD_PORT,
        dbd_port=DBD_PORT,
        nodes=nodes,
        node_list=",".join(n for n in node_names() if n != SHARE_NODE),
        share_node=SHARE_NODE,
        mail_program=MAIL_PROGRAM,
        mail_domain=mail_domain(),
        configless=CONFIGLESS,
        plugin_dir=slurm_build().get("plugin_dir", ""),
        # job_container/tmpfs is namespace/tmpfs from Slurm 25.11 on (NamespaceType; its job_container.conf stays)
        namespace_tmpfs=bool(SLURM_RELEASE) and tuple(map(int, SLURM_RELEASE.split("."))) >= (25, 11),
    )
    # The share node's GPUs each give SHARDS_PER_GPU shares, spread evenly over them (Slurm wants the
    # shards on the files of the node's gpu GRES).
    gres = ""
    for node in node_names():
        files = f"{p.gpus}/{node}-gpu[0-{gpus_of(node) - 1}]"
        gres += f"NodeName={node} Name=gpu File={files}\n"
        if node == SHARE_NODE:
            gres += f"NodeName={node} Name=shard Count={gpus_of(node) * SHARDS_PER_GPU} File={files}\n"
    cgroup = render("cgroup.conf.j2")
    job_container = render("job_container.conf.j2", nodes=nodes, base=p.root / "jobtmp")
    write_node_confs(conf)
    written = [write_if_changed(p.slurm / name, text, 0o644)
               for name, text in zip(SLURM_CONF_FILES, (conf, gres, cgroup, job_container), strict=True)]
    return any(written)


def node_conf(node: str) -> Path:
    return paths().slurm / node / "slurm.conf"


def write_node_confs(conf: str) -> None:
    """Each node's slurmd reads a slurm.conf of its own, the cluster's plus TmpFS: the node's own
    temporary folder. One machine has one /tmp, where Slurm's PMIx plugin keeps a folder per step
    (spmix_appdir_<uid>_<job>.<step>) that the second node of a job would find taken. The other
    files (gres.conf, cgroup.conf, ...) are the cluster's (links)."""
    p = paths()
    for node in node_names():
        folder = p.slurm / node
        tmp = p.root / "nodes" / node / "tmp"
        for made in (folder, tmp):
            made.mkdir(parents=True, exist_ok=True)
        # root's alone (slurmstepd makes each step's PMIx folder there and gives it to the job's
        # user): a user who could write here could take another user's next folder name first.
        os.chmod(tmp, 0o755)
        for name in SLURM_CONF_FILES[1:]:
            link = folder / name
            if not link.is_symlink():
                link.unlink(missing_ok=True)
                link.symlink_to(p.slurm / name)
        write_if_changed(folder / "slurm.conf", f"{conf}\n# This node's own temporary folder (the demo's nodes "
                         f"share one machine's /tmp)\nTmpFS={tmp}\n", 0o644)


# Where sackd, the login node's daemon of a configless cluster (Slurm 23.02 on), keeps the configuration it
# fetches from slurmctld: Slurm's commands look there when neither SLURM_CONF nor their own default file names one.
CONFIGLESS_CACHE = Path("/run/slurm/conf")


def release_name(release: str) -> str:
    return f"Slurm {release} ({slurm_prefix(release)})" if release else "Debian's Slurm (/usr)"


def switch_release() -> bool:
    """The demo's Slurm state is of one release: another (make demo SLURM=...) starts from a clean Slurm.
    slurmctld and slurmdbd read their state only from a release or two before their own, and a client talks
    only to a controller of its own release or older: the old release's daemons stop, with its jobs cancelled
    by its own commands; then its state (the queue, the job ids, the accounting database) goes. The people,
    the images, the hub and its database stay."""
    p = paths()
    recorded = recorded_release() or ""
    if recorded == SLURM_RELEASE or not (p.slurm / "state").exists():
        return recorded != SLURM_RELEASE
    slurm_build()  # the release asked for is installed (its stamp), before anything of the old one goes
    if not Path(slurm_daemon("slurmctld")).exists():
        raise DemoError(f"{release_name(SLURM_RELEASE)} has no slurmctld: make demo SLURM={SLURM_RELEASE or '22.05'} "
                        "installs it first")
    if recorded and not (slurm_prefix(recorded) / "sbin" / "slurmctld").exists():
        raise DemoError(f"the demo's Slurm state is of {recorded}, which is not installed in {slurm_prefix(recorded)}: "
                        "make clean first")
    say(f"{release_name(SLURM_RELEASE)} instead of {release_name(recorded)}: the old release's jobs, queue and "
        "accounting go")
    stop_slurm(recorded)
    stop_pid(p.run / "slurmdbd.pid", "slurmdbd")
    for folder in (p.slurm / "state", *(p.slurm / "spool" / node for node in node_names())):
        shutil.rmtree(folder, ignore_errors=True)
    return True


def ensure_sackd(env: dict[str, str]) -> None:
    """A configless login node's sackd (--conf-server: slurmctld), whose cache the hub's and the users'
    Slurm commands read: no slurm.conf of the login node's own."""
    pidfile = paths().run / "sackd.pid"
    if alive(pidfile):
        return
    login_env = {name: value for name, value in env.items() if name != "SLURM_CONF"}
    CONFIGLESS_CACHE.parent.mkdir(mode=0o755, exist_ok=True)  # sackd makes conf/ in it (systemd's RuntimeDirectory)
    shutil.rmtree(CONFIGLESS_CACHE, ignore_errors=True)  # a killed sackd's copy is not this one's
    command = [slurm_daemon("sackd"), "-D", f"--conf-server={LOGIN_ADDRESS}:{CTLD_PORT}"]
    plugin_dir = slurm_build().get("plugin_dir")
    if plugin_dir:
        # Debian's packages unpacked beside Debian's own Slurm (scripts/unpack-slurm.sh): until sackd has the
        # configuration (and its PluginDir) it loads its auth plugin from the folder Debian compiled in, which holds
        # the installed release's plugins: in a mount namespace of its own, that folder is its release's.
        compiled_in = f"/usr/lib/{os.uname().machine}-linux-gnu/slurm-wlm"
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sackd-with-its-plugins", plugin_dir, compiled_in,
                   *command]
    with open(paths().log / "sackd.log", "ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=login_env, start_new_session=True, cwd="/")
    pidfile.write_text(f"{process.pid}\n")
    wait_for(lambda: (CONFIGLESS_CACHE / "slurm.conf").exists(), f"sackd (log: {paths().log / 'sackd.log'})",
             timeout=30)
    say(f"sackd started: the login node's Slurm configuration comes from slurmctld ({CONFIGLESS_CACHE})")


def stop_sackd() -> None:
    """sackd stopped, and its copy of the configuration gone with it (only the demo's: none where it ran none)."""
    pidfile = paths().run / "sackd.pid"
    if pidfile.exists():
        stop_pid(pidfile, "sackd")
        pidfile.unlink(missing_ok=True)
        shutil.rmtree(CONFIGLESS_CACHE, ignore_errors=True)


def ensure_slurm() -> None:
    p = paths()
    switched = switch_release()
    ensure_gpus()
    write_slurm_conf()
    ensure_accounting(fresh=switched)
    release_file().write_text(f"{SLURM_RELEASE}\n")
    env = slurm_env()
    # The cluster is in the accounting database before slurmctld registers with it, and so are the QoS
    # a partition names (slurm.conf's share partition: slurmctld refuses to start without it); their
    # limits follow once slurmctld has registered its TRES (ensure_slurm_associations).
    subprocess.run(["sacctmgr", "-i", "add", "cluster", "dsportal"], env=env, capture_output=True, text=True)
    for qos in directory()["slurm_qos"]:
        subprocess.run(["sacctmgr", "-i", "add", "qos", qos["name"]], env=env, capture_output=True, text=True)
    ctld_pidfile = p.run / "slurmctld.pid"
    newest_conf = max((p.slurm / name).stat().st_mtime for name in SLURM_CONF_FILES)
    if alive(ctld_pidfile) and newest_conf > ctld_pidfile.stat().st_mtime:
        # A new slurm.conf (e.g. accounting turned on): restart the daemons; running jobs are kept.
        stop_pid(p.run / "slurmctld.pid", "slurmctld")
        for node in node_names():
            stop_pid(p.run / f"slurmd-{node}.pid", f"slurmd {node}")
        stop_sackd()
    if not alive(p.run / "slurmctld.pid"):
        run([slurm_daemon("slurmctld")], env=env)
        say(f"slurmctld started ({release_name(SLURM_RELEASE)})")
    wait_for(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout.count("UP"),
              "slurmctld", timeout=30)
    ensure_slurm_associations()
    if CONFIGLESS:
        ensure_sackd(env)
    else:
        stop_sackd()
    restarted_at = None
    build = slurm_build()
    stepd = ["-d", build["slurmstepd"]] if "slurmstepd" in build else []  # Debian's unpacked packages: theirs
    for node in node_names():
        pid = alive(p.run / f"slurmd-{node}.pid")
        if not pid:
            restarted_at = restarted_at or time.time()
            run(in_node(node, [*jobs_yield(), slurm_daemon("slurmd"), "-N", node, "-f", str(node_conf(node)), *stepd]),
                env=env)
            say(f"slurmd {node} started on {address(node)}")
        else:
            make_running_slurmd_yield(pid)

    def nodes_ready():
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        bad = {n: s for n, s in states.items() if s.rstrip("*~#") not in ("idle", "mix", "alloc", "comp")}
        if bad:
            for node in bad:  # a node left down by an earlier run comes back
                subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, capture_output=True)
            return False
        return len(states) == NODES

    wait_for(nodes_ready, "the slurmd nodes", timeout=60, interval=1)
    if restarted_at:
        reap_orphaned_jobs(env, before=restarted_at)


def reap_orphaned_jobs(env: dict[str, str], before: float) -> None:
    """Cancel jobs Slurm still counts as running whose processes died with the machine's.

    All demo nodes share this machine's processes: when the slurmds had to be started again (the processes were
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
        say(f"job {job_id} of {user} had no processes left after a restart: cancelled")


def stop_slurm(release: str | None = None) -> None:
    """Cancel every job (waiting for them to end, with ``release``'s commands: by default the release the
    demo's state is of), then stop the slurmd of each node, sackd and slurmctld."""
    p = paths()
    if release is None:
        release = recorded_release()
        release = SLURM_RELEASE if release is None else release
    env = slurm_env(release)
    if alive(p.run / "slurmctld.pid"):
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], env=env, capture_output=True)
            say(f"cancelled {len(jobs)} job(s)")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and subprocess.run(
                ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True
            ).stdout.strip():
                time.sleep(0.5)
    for node in node_names():
        stop_pid(p.run / f"slurmd-{node}.pid", f"slurmd {node}")
    stop_sackd()
    stop_pid(p.run / "slurmctld.pid", "slurmctld")


def stop_munge() -> None:
    stop_pid(paths().munge / "run" / "munged.pid", "munged")


def slurm_status() -> dict[str, bool]:
    p = paths()
    result = {"munged": bool(alive(p.munge / "run" / "munged.pid")), "slurmctld": bool(alive(p.run / "slurmctld.pid"))}
    if CONFIGLESS:
        result["sackd"] = bool(alive(p.run / "sackd.pid"))
    for node in node_names():
        result[f"slurmd {node}"] = bool(alive(p.run / f"slurmd-{node}.pid"))
    return result

