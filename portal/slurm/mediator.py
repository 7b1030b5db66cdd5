#!/usr/bin/python3 -IS
"""dsportal's mediator: everything the hub does as a user, and nothing else.

The hub runs it as the user, through sudo (an unprivileged hub: ``dsportal hub sudoers`` writes the one
rule it needs) or runuser (a hub run as root):

  mediator submit              stdin: {"script", "env", "log_dir"} (JSON): the session's batch script,
                               submitted with sbatch into her private log folder; prints the job id
  mediator cancel JOBID        scancel one of her jobs (Slurm lets a user cancel only her own)
  mediator certs FOLDER        stdin: lines "NAME BASE64": the session's certificates, written mode 600
                               into FOLDER, below her ~/.dsportal/certs
  mediator start FOLDER        stdin: a submission (as submit) with "certs": {NAME: BASE64}: the
                               certificates written as by certs, then the script submitted as by
                               submit: a session's start in one run (one sudo and one Python, not two)
  mediator tail PATH [SINCE]   the last 64 KiB of a file she can read; nothing if it was last
                               written before SINCE (a Unix time): a log of an earlier job

``dsportal hub install-mediator`` copies this file to /usr/local/libexec/dsportal/mediator
(root's, 0755) with its settings in /etc/dsportal/mediator.json (root's). It is standalone: the
system Python in isolated mode (-I: no user site, no PYTHON* variables; -S: no site-packages, no .pth
files), its standard library only, nothing the hub's account could change. It becomes sbatch or
scancel (execve) rather than running them as a child: one process less, and no subprocess module,
for the ~100 starts of a class. It refuses to run as root or as any account outside
the settings' uid range (system accounts, and package accounts such as slurm, whose jobs Slurm trusts).
"""

import binascii
import json
import os
import pwd
import re
import stat
import sys

SETTINGS = "/etc/dsportal/mediator.json"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
TAIL_BYTES = 64 * 1024
MAX_INPUT = 4 * 1024 * 1024  # a batch script and its environment, or a session's certificates
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What would change how sbatch itself runs, not what the job gets: never taken from the hub.
_UNSAFE_ENV = re.compile(r"^(LD_|PYTHON|BASH_ENV$|ENV$|IFS$|PATH$|SLURM_CONF$)")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Refused(Exception):
    """What the mediator will not do; its message goes to the hub's log and the user's page."""


def load_settings(path: str = SETTINGS) -> dict:
    """Root's settings file, refused if anyone else could have written it."""
    try:
        info = os.stat(path)
        with open(path) as handle:
            settings = json.load(handle)
    except (OSError, ValueError) as error:
        raise Refused(f"cannot read {path}: {error}") from None
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused(f"{path} must be root's and writable by root only")
    return settings


def calling_user(settings: dict) -> pwd.struct_passwd:
    """Who runs it: a portal user, whose uid is in the settings' range (Debian's for people: not root,
    not the system accounts below 1000, not those of packages from 60000 up, such as slurm's)."""
    me = pwd.getpwuid(os.getuid())
    low, high = int(settings.get("min_uid", 1000)), int(settings.get("max_uid", 59999))
    if os.geteuid() == 0 or not low <= me.pw_uid <= high:
        raise Refused(f"runs only as a portal user (uid {low}-{high}), not as {me.pw_name} (uid {me.pw_uid})")
    return me


def below(home: str, path: str, *, inside: str = "") -> str:
    """``path`` as an absolute, normalised path below ``home``/``inside``, else refused."""
    root = os.path.normpath(os.path.join(home, inside)) if inside else os.path.normpath(home)
    target = os.path.normpath(path)
    if not os.path.isabs(path) or os.path.commonpath([root, target]) != root or target == root:
        raise Refused(f"{path!r} is not below {root}")
    return target


def private_folder(home: str, folder: str) -> None:
    """mkdir -p, each folder it makes below the home 0700, and the path's folders below the home made
    0700 if they were not (a folder made before is fixed)."""
    os.umask(0o077)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    current = folder
    while os.path.normpath(current) != os.path.normpath(home):
        if not os.path.islink(current):
            os.chmod(current, stat.S_IMODE(os.stat(current).st_mode) & 0o700)
        current = os.path.dirname(current)


def read_input() -> str:
    data = sys.stdin.buffer.read(MAX_INPUT + 1)
    if len(data) > MAX_INPUT:
        raise Refused(f"input longer than {MAX_INPUT} bytes")
    return data.decode()


def slurm_first(bin_dir, path: str) -> str:
    """``path`` with the folder of the cluster's Slurm commands first, unless it is on it already: the
    commands a job or a script runs by name (srun, scontrol) are then the cluster's release, not another
    the node may also have (a site's /opt/slurm/bin beside a distribution's /usr/bin). Here, in the
    standalone mediator, for the hub's client (slurmclient.py) too."""
    return path if str(bin_dir) in path.split(":") else f"{bin_dir}:{path}"


def slurm_env(settings: dict) -> dict[str, str]:
    """What a Slurm command needs of the environment: a safe PATH with the cluster's own Slurm commands
    first (sbatch's job gets it: its srun must be the cluster's release), the settings' slurm.conf (none
    on a configless cluster)."""
    conf = {"SLURM_CONF": settings["slurm_conf"]} if settings.get("slurm_conf") else {}
    return {"PATH": slurm_first(settings.get("bin_dir", "/usr/bin"), SAFE_PATH), **conf}


def slurm_tool(settings: dict, name: str) -> str:
    return os.path.join(settings.get("bin_dir", "/usr/bin"), name)


def submission() -> dict:
    try:
        request = json.loads(read_input())
    except ValueError as error:
        raise Refused(f"a submission is JSON with script, env and log_dir ({error})") from None
    if not isinstance(request, dict):
        raise Refused("a submission is a JSON object with script, env and log_dir")
    return request


def submit(settings: dict, me: pwd.struct_passwd, request: dict | None = None):  # becomes sbatch
    request = submission() if request is None else request
    try:
        script, env, log_dir = request["script"], request.get("env", {}), request["log_dir"]
    except (KeyError, TypeError, AttributeError) as error:
        raise Refused(f"a submission is JSON with script, env and log_dir ({error})") from None
    if not isinstance(script, str) or not isinstance(env, dict) or not isinstance(log_dir, str):
        raise Refused("script and log_dir are text, env an object")
    for name, value in env.items():
        if not (isinstance(name, str) and _ENV_NAME.match(name) and isinstance(value, str)) or "\0" in value:
            raise Refused(f"environment variable {name!r} is not NAME=text")
    private_folder(me.pw_dir, below(me.pw_dir, log_dir))
    job_env = {name: value for name, value in env.items() if not _UNSAFE_ENV.match(name)}
    job_env.update(slurm_env(settings), HOME=me.pw_dir, USER=me.pw_name, LOGNAME=me.pw_name)
    become([slurm_tool(settings, "sbatch"), "--parsable"], job_env, stdin=script.encode(), cwd=me.pw_dir)


def cancel(settings: dict, me: pwd.struct_passwd, job_id: str):  # becomes scancel
    if not (job_id.isascii() and job_id.isdigit()):
        raise Refused(f"{job_id!r} is not a job id")
    become([slurm_tool(settings, "scancel"), job_id], slurm_env(settings))


def become(command: list[str], env: dict[str, str], stdin: bytes | None = None, cwd: str | None = None):
    """Replace this process with ``command`` (execve): what it prints and its exit status are the
    hub's answer. ``stdin`` is handed to it as a file in memory. Raises OSError if it cannot start."""
    if stdin is not None:
        held = readable(stdin)
        os.dup2(held, 0)  # the copy on 0 stays open across execve
        os.close(held)
    if cwd is not None:
        os.chdir(cwd)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)


def readable(data: bytes) -> int:
    """A descriptor to read ``data`` from: a file in memory; a pipe where the kernel refuses those
    (vm.memfd_noexec=2), as long as a pipe can hold it (a batch script is a few KiB)."""
    try:
        held = os.memfd_create("dsportal-stdin")
    except OSError:
        import fcntl

        held, feed = os.pipe()
        capacity = fcntl.fcntl(feed, 1031, 1 << 20)  # F_SETPIPE_SZ: as much as the kernel lets us
        if len(data) > capacity:
            raise Refused(f"input of {len(data)} bytes is more than a pipe holds ({capacity})") from None
    else:
        feed = held
    view = memoryview(data)
    while view:
        view = view[os.write(feed, view):]
    if feed == held:
        os.lseek(held, 0, os.SEEK_SET)
    else:
        os.close(feed)
    return held


def certs(me: pwd.struct_passwd, folder: str, encoded: dict | None = None) -> int:
    """The certificates (name: base64; from the input's lines "NAME BASE64" when not given) into
    ``folder`` below her ~/.dsportal/certs, each mode 600, never through a link."""
    folder = below(me.pw_dir, folder, inside=".dsportal/certs")
    if encoded is None:
        encoded = dict(line.partition(" ")[::2] for line in read_input().splitlines())
    if not isinstance(encoded, dict):
        raise Refused("certs is an object of NAME: BASE64")
    files = {}
    for name, data in encoded.items():
        if not isinstance(name, str) or not _FILE_NAME.match(name) or not isinstance(data, str):
            raise Refused(f"{name!r} is not a certificate file name")
        files[name] = binascii.a2b_base64(data.encode("ascii"), strict_mode=True)  # base64.b64decode(validate=True)
    private_folder(me.pw_dir, folder)
    for name, content in files.items():
        path = os.path.join(folder, name)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(handle, "wb") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(content)
    return 0


def tail(path: str, since: str = "") -> int:
    if not os.path.isabs(path):
        raise Refused(f"{path!r} is not an absolute path")
    with open(path, "rb") as handle:  # her rights: a file she cannot read stays closed
        info = os.fstat(handle.fileno())
        if since and info.st_mtime < float(since) - 1:
            return 0
        handle.seek(max(0, info.st_size - TAIL_BYTES))
        sys.stdout.buffer.write(handle.read(TAIL_BYTES))
    return 0


def main(argv: list[str]) -> int:
    verb, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    try:
        settings = load_settings()
        me = calling_user(settings)
        if verb == "submit" and not args:
            return submit(settings, me)
        if verb == "cancel" and len(args) == 1:
            return cancel(settings, me, args[0])
        if verb == "certs" and len(args) == 1:
            return certs(me, args[0])
        if verb == "start" and len(args) == 1:
            request = submission()
            certs(me, args[0], request.pop("certs", None) or {})
            return submit(settings, me, request)
        if verb == "tail" and len(args) in (1, 2):
            return tail(*args)
        raise Refused("usage: mediator submit | cancel JOBID | certs FOLDER | start FOLDER | tail PATH [SINCE]")
    except Refused as error:
        print(f"dsportal mediator: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        print(f"dsportal mediator: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
