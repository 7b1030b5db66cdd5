"""The portal's rules: what a user may ask for, in one place for the hub, the session and the admin.

- profiles and who may use them (by the user's Unix groups): :func:`may_use`;
- the slice a session or a job's node gets (GPUs, and CPUs and memory per GPU, walltime): :func:`slice_for`;
- how long a field may be, measured before anything reads or stores it: :func:`check_length`;
- a spawn request (the form or the hub REST API's ``user_options``), judged once into a frozen
  :class:`SessionRequest`: :func:`judge_request`;
- what a user may launch from her session (:class:`LaunchPolicy`: the profiles, images and data
  mounts that are hers, handed by the hub to the session) and a multi-node job request, typed
  (:class:`JobRequest`) and checked against it (:func:`plan_job`).

Every message is meant for the user and reaches her as it is.
"""

from __future__ import annotations

import json
import keyword
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from portal.core import defaults
from portal.core.settings import (
    DataMount,
    Image,
    Profile,
    described,
    format_walltime,
    parse_memory_mb,
    parse_walltime,
    shown,
    whole_number,
)


class RequestError(ValueError):
    """A request the rules do not allow; the message is meant for the user."""



# ------------------------------------------------------------------------------ how long a field may be
# Every field a user sends is measured before it is read or stored: int() of more than 4,300 digits is
# an error, not a number, and the hub keeps a start's options in a TEXT column (64 KB on MariaDB).
MAX_FIELD = 256  # characters of one field, but for the longer ones of a job below
MAX_CODE = 1_000_000  # a job's Python source
MAX_PATH = 4096  # a job's script: a file name (Linux's PATH_MAX)
MAX_ITEMS = 256  # a job's args, or its environment variables
MAX_ITEM = 4096  # characters of one of a job's args, or of an environment variable's name or value


def check_length(name: str, value, most: int = MAX_FIELD) -> None:
    """Refuse, naming the field, text longer than ``most`` characters, and a list or object of more
    than MAX_ITEMS entries or with such text in it. Anything else is left to the field's own rules."""
    if isinstance(value, str):
        if len(value) > most:
            raise RequestError(f"{name} is {len(value):,} characters long; at most {most:,} are allowed")
        return
    if not isinstance(value, (list, dict)):
        return
    if len(value) > MAX_ITEMS:
        raise RequestError(f"{name} has {len(value):,} entries; at most {MAX_ITEMS} are allowed")
    for text in [*value, *value.values()] if isinstance(value, dict) else value:
        if isinstance(text, str) and len(text) > most:
            raise RequestError(f"{name} holds text of {len(text):,} characters; at most {most:,} are allowed "
                               "in each")


# ------------------------------------------------------------------------------ who may use what
def may_use(profile: Profile, user_groups: set[str]) -> bool:
    return not profile.groups or bool(user_groups & set(profile.groups))


# ------------------------------------------------------------------------------ the slice
@dataclass(frozen=True)
class SessionSlice:
    """What one node of a request holds: its GPUs, and the CPUs and memory that follow them."""

    profile: Profile
    gpus: int
    cpus: int
    mem_mb: int
    walltime: str
    shares: int = 0  # shares of one GPU (Slurm's shard GRES) instead of whole GPUs: profile.gpu_shares per GPU

    def describe(self) -> str:
        if self.shares:
            gpus = f"{share_name(self.profile.gpu_shares)}, "
        else:
            gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}, " if self.gpus else ""
        return f"{gpus}{self.cpus} CPUs, {self.mem_mb // 1024} GB, {self.walltime} on {self.profile.partition}"

    @property
    def idle_limit(self) -> int | None:
        return self.profile.idle_limit(self.gpus or self.shares)  # a share goes back to the queue as a GPU does


FRACTIONS = {2: "½", 3: "⅓", 4: "¼", 5: "⅕", 6: "⅙", 8: "⅛"}
SHARE_REQUEST = re.compile(r"1/([0-9]{1,2})")
COUNT = re.compile(r"[0-9]+")


def share_name(per_gpu: int) -> str:
    """'¼ GPU' for one of 4 shares of a GPU."""
    return f"{FRACTIONS.get(per_gpu, f'1/{per_gpu}')} GPU"


def share_of(profile: Profile, gpus) -> bool:
    """Whether ``gpus`` asks for one share of a GPU ("1/4"); RequestError if the profile offers no such share."""
    if not isinstance(gpus, str) or not re.fullmatch(r"\s*[0-9]+\s*/\s*[0-9]+\s*", gpus):
        return False  # not a fraction: judged as a GPU count
    found = SHARE_REQUEST.fullmatch(gpus.strip())
    if not profile.gpu_shares:
        raise RequestError(f"{shown(gpus)} GPU: {profile.display_name} offers whole GPUs only")
    if not found or int(found.group(1)) != profile.gpu_shares:
        raise RequestError(f"{shown(gpus)} GPU is not offered on {profile.display_name}: a share there is "
                           f"\"1/{profile.gpu_shares}\" ({share_name(profile.gpu_shares)})")
    return True


def slice_for(profile: Profile, gpus=None, walltime=None, per: str = "") -> SessionSlice:
    """The exact Slurm slice for ``gpus`` GPUs (``per`` node, for a job) on ``profile``: CPUs and memory follow the GPUs.
    ``gpus`` is a number or the text of one (the form's), read here: the count goes from a request to its slice in
    this one function."""
    if gpus in (None, "") and profile.default_share:
        gpus = f"1/{profile.gpu_shares}"
    shares = share_of(profile, gpus)
    if shares:
        gpus = 0
    elif gpus in (None, ""):
        gpus = profile.default_gpus
    elif not isinstance(gpus, int) or isinstance(gpus, bool):
        text = gpus.strip() if isinstance(gpus, str) else ""
        if not COUNT.fullmatch(text):  # digits 0-9 only, as whole_number: int() takes '٢' (Arabic-Indic) as 2
            raise RequestError(f"GPU count must be a whole number (digits 0-9), not {described(gpus)}")
        gpus = int(text)
    if not shares and gpus not in profile.gpu_choices:
        choices = ", ".join(map(str, profile.gpu_choices))
        if profile.gpu_shares and not per:  # a session may hold a share; a job's nodes hold whole GPUs
            choices += f", or a share: \"1/{profile.gpu_shares}\" ({share_name(profile.gpu_shares)})"
        raise RequestError(f"{shown(gpus)} GPUs{per} is not offered on {profile.display_name}: choose one of {choices}")
    walltime = profile.default_walltime if walltime in (None, "") else str(walltime).strip()
    try:
        seconds = parse_walltime(walltime)
    except ValueError as error:
        raise RequestError(f"walltime {error}") from None
    if seconds <= 0:
        raise RequestError("walltime must be longer than zero")
    if seconds > parse_walltime(profile.max_walltime):
        raise RequestError(f"walltime {walltime} is longer than the {profile.max_walltime} allowed on {profile.display_name}")
    if shares:  # a GPU's CPUs and memory, shared as the GPU is
        cpus = max(1, profile.cpus_per_gpu // profile.gpu_shares)
        mem_mb = max(1, parse_memory_mb(profile.mem_per_gpu) // profile.gpu_shares)
    elif gpus:
        cpus, mem_mb = gpus * profile.cpus_per_gpu, gpus * parse_memory_mb(profile.mem_per_gpu)
    else:
        cpus, mem_mb = profile.cpus_without_gpu, parse_memory_mb(profile.mem_without_gpu)
    return SessionSlice(profile=profile, gpus=gpus, cpus=cpus, mem_mb=mem_mb, walltime=format_walltime(seconds),
                        shares=int(shares))


# ------------------------------------------------------------------------------ a spawn request
OPTIONS = ("profile", "gpus", "walltime", "mail", "shared")
# A plain address: it lands on an #SBATCH line (--mail-user) and on the mail program's command line,
# so it starts with a letter or digit (never an option like -oQ).
PLAIN_MAIL_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*")


@dataclass(frozen=True)
class SessionRequest:
    """A spawn request, judged: the slice the session holds and what else it asked for. Made once, where the
    request enters the hub (the form, the REST API: spawner.partitionspawner.PartitionSpawner.judged), and
    handed on as it is to the job's script and the session."""

    slice: SessionSlice
    mail: bool = False  # Slurm mails her when the session starts
    shared: bool = False  # started shareable (portal.session.sharing)
    mail_user: str = ""  # her address (from the directory), once looked up: the job's --mail-user

    @property
    def profile(self) -> Profile:
        return self.slice.profile


def judge_request(options: dict, profiles: list[Profile], user_groups: set[str], default_profile: str,
                  sharing_groups: list[str]) -> SessionRequest:
    """The one judge of a spawn request (the form's fields read into options, or the REST API's
    ``user_options``): a :class:`SessionRequest`, or RequestError with the reason. The options go from here
    straight to slice_for (which a job's nodes share), through no helper of their own: the GPU count's path
    from the form to the job's script stays short (test_spawner_life.py measures it)."""
    if not isinstance(options, dict):
        raise RequestError("options must be an object like {'profile': 'gpu', 'gpus': 1}")
    unknown = sorted(str(k) for k in options if k not in OPTIONS)
    if unknown:
        raise RequestError(f"unknown option(s) {', '.join(map(shown, unknown))}: allowed are {', '.join(OPTIONS)}")
    for key in OPTIONS:
        check_length(key, options.get(key))
    for key in ("profile", "walltime"):
        if key in options and not isinstance(options[key], str):
            raise RequestError(f"{key} must be text, not {described(options[key])}")
    if "gpus" in options and options["gpus"] is None:
        raise RequestError("gpus must be a whole number, not null (leave it out for the profile's default)")
    mail, shared = wants_mail(options), wants_sharing(options)
    name = options.get("profile") or default_profile
    by_name = {p.name: p for p in profiles}
    if name not in by_name:
        offered = ", ".join(p.name for p in profiles if may_use(p, user_groups))
        raise RequestError(f"unknown partition profile {shown(name)}: choose one of {offered}")
    profile = by_name[name]
    if not may_use(profile, user_groups):
        raise RequestError(f"{profile.display_name} is reserved for members of {', '.join(profile.groups)}")
    chosen = slice_for(profile, options.get("gpus"), options.get("walltime"))
    if shared and not user_groups & set(sharing_groups):
        raise RequestError("you may not share sessions: your admin allows sharing only within "
                           f"{', '.join(sharing_groups) or 'no group'}; start it without sharing")
    return SessionRequest(slice=chosen, mail=mail, shared=shared)


def wants_mail(options: dict) -> bool:
    """Whether the request asks for Slurm's e-mail when the session starts (option ``mail``: true/false)."""
    asked = options.get("mail", False)
    if not isinstance(asked, bool):
        raise RequestError(f"mail must be true or false (an e-mail when the session starts), not {described(asked)}")
    return asked


def wants_sharing(options: dict) -> bool:
    """Whether the session is started shareable (option ``shared``: true/false): its owner may share it
    with colleagues, and it loads live co-editing (portal.session.sharing)."""
    asked = options.get("shared", False)
    if not isinstance(asked, bool):
        raise RequestError(f"shared must be true or false (a session you may share with colleagues), not {described(asked)}")
    return asked


def plain_mail_address(address) -> str:
    """The user's address from the directory, if it is a plain one Slurm may be given."""
    text = address if isinstance(address, str) else ""
    if not PLAIN_MAIL_ADDRESS.fullmatch(text) or len(text) > 254:
        raise RequestError(f"your e-mail address in the directory, {shown(address)}, is not a plain address "
                           "(letters, digits and ._+- around one @): Slurm cannot mail it; ask your admin to fix it")
    return text


# ------------------------------------------------------------------------------ what a session may launch
class LaunchPolicy(BaseModel):
    """What this user may launch from her session: written by the hub into the session's environment."""

    model_config = ConfigDict(extra="forbid")

    profiles: list[Profile]
    default_profile: str
    images: list[Image] = []
    data_mounts: list[DataMount] = []
    environment: str = defaults.ENVIRONMENT
    node_gpus: dict[str, int] = {}  # partition -> most GPUs any one of its nodes has (from sinfo)
    node_count: dict[str, int] = {}  # partition -> usable nodes

    def to_env(self) -> str:
        return self.model_dump_json(exclude_defaults=False)

    def profile(self, name: str | None) -> Profile:
        wanted = name or self.default_profile
        for profile in self.profiles:
            if profile.name == wanted:
                return profile
        offered = ", ".join(p.name for p in self.profiles)
        raise RequestError(f"unknown or not permitted partition profile {shown(wanted)}: choose one of {offered}")

    def images_for(self, profile: Profile) -> list[Image]:
        """The images a profile offers (an image naming no profiles is everybody's)."""
        return [i for i in self.images if not i.profiles or profile.name in i.profiles]


# ------------------------------------------------------------------------------ a job request
REQUEST_FIELDS = ("script", "code", "notebook", "args", "nodes", "gpus_per_node", "tasks_per_node", "image",
                  "walltime", "profile", "env", "name", "launcher", "parameters", "grid", "max_running", "mail")
NOTEBOOK_ONLY = ("parameters", "grid", "max_running")  # fields of a notebook run as a job
MAX_PARAMETERS = 64  # names in a notebook job's parameters, or in its grid
MAX_VALUES = 100  # values of one list: one parameter's, or one name's in a grid
MAX_VALUE_CHARS = 1000  # characters of one text value of a parameter
LAUNCHERS = ("mpi", "torchrun")  # mpi: the profile's MPI launcher (srun --mpi=... or mpirun)
LONGEST = {"code": MAX_CODE, "script": MAX_PATH, "notebook": MAX_PATH, "args": MAX_ITEM, "env": MAX_ITEM,
           "parameters": MAX_VALUE_CHARS, "grid": MAX_VALUE_CHARS}  # others: MAX_FIELD
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV = re.compile(r"^(SLURM_|SBATCH_|SRUN_|OMPI_|PMIX_|PMI_|TORCHELASTIC_)")
# Set by torchrun for each process of a torchrun job (and RANK names each rank's log file).
_TORCHRUN_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}


def _whole(request: dict, name: str) -> int | None:
    """A whole-number field (a number, or digits as text from a form); None when left out."""
    if name not in request or request[name] == "":
        return None
    value = request[name]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = whole_number(value)  # digits 0-9 only: '²' and '٢' are refused in words
    if number is None:
        raise RequestError(f"{name} must be a whole number (digits 0-9), not {described(value)}")
    return number


def _text(request: dict, name: str) -> str | None:
    """A text field; None when left out or empty. Anything but text (null included) is refused."""
    if name not in request:
        return None
    value = request[name]
    if not isinstance(value, str):
        raise RequestError(f"{name} must be text, not {described(value)}")
    return value or None


def _environment(overrides) -> dict[str, str]:
    if not isinstance(overrides, dict):
        raise RequestError(f"env must be an object of NAME: value, not {described(overrides)}")
    for key, value in overrides.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise RequestError(f"environment variable name {shown(key)} is not valid (letters, digits, _)")
        if _RESERVED_ENV.match(key) or key in _TORCHRUN_ENV:
            raise RequestError(f"{key} is set by Slurm/MPI/torchrun for each rank and cannot be overridden")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or "\n" in str(value) or "\0" in str(value):
            raise RequestError(f"the value of {key} must be one line of text")
    return {k: str(v) for k, v in overrides.items()}


RESULT_COLUMNS = ("run", "state", "output")  # the results table's own columns: no parameter may take them


def _parameter_name(name) -> str:
    if (not isinstance(name, str) or not name.isascii() or not name.isidentifier() or keyword.iskeyword(name)
            or name.startswith("__") or len(name) > 64):
        raise RequestError(f"parameter name {shown(name)} is not a Python name (ASCII letters, digits, _; at most 64)")
    if name in RESULT_COLUMNS:
        raise RequestError(f"parameter name {name} is taken by the results table: choose another")
    return name


def _parameter_value(name: str, value, in_list: bool = False):
    """A JSON value a notebook's parameter may take: null, true/false, a number, text of one line or
    more (at most MAX_VALUE_CHARS), or a list of those (at most MAX_VALUES)."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RequestError(f"parameter {name} must be a finite number, not {value}")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS or "\0" in value:
            raise RequestError(f"parameter {name} is text of {len(value):,} characters; at most {MAX_VALUE_CHARS:,} "
                               "without NUL are allowed")
        return value
    if isinstance(value, list) and not in_list:
        if len(value) > MAX_VALUES:
            raise RequestError(f"parameter {name} is a list of {len(value):,} values; at most {MAX_VALUES} are allowed")
        return [_parameter_value(name, v, in_list=True) for v in value]
    raise RequestError(f"parameter {name} must be null, true/false, a number, text or a list of those, not "
                       f"{described(value)}")


MAX_PARAMETERS_JSON = 64 * 1024  # characters of a job's parameters, and of its grid, as JSON


def _bounded(name: str, raw) -> None:
    size = len(json.dumps(raw, default=str))
    if size > MAX_PARAMETERS_JSON:
        raise RequestError(f"{name} is {size:,} characters of JSON; at most {MAX_PARAMETERS_JSON:,} are allowed")


def _parameters(raw) -> dict:
    if not isinstance(raw, dict):
        raise RequestError(f"parameters must be an object of name: value, not {described(raw)}")
    _bounded("parameters", raw)
    if len(raw) > MAX_PARAMETERS:
        raise RequestError(f"parameters has {len(raw)} names; at most {MAX_PARAMETERS} are allowed")
    return {_parameter_name(name): _parameter_value(name, value) for name, value in raw.items()}


def _grid(raw) -> dict[str, list]:
    if not isinstance(raw, dict) or not raw:
        raise RequestError(f"grid must be an object of name: [values], e.g. {{'lr': [0.001, 0.0003], 'seed': [1, 2]}}, "
                           f"not {described(raw)}")
    if len(raw) > MAX_PARAMETERS:
        raise RequestError(f"grid has {len(raw)} names; at most {MAX_PARAMETERS} are allowed")
    _bounded("grid", raw)
    grid = {}
    for name, values in raw.items():
        name = _parameter_name(name)
        if not isinstance(values, list) or not values:
            raise RequestError(f"grid's {name} must be a list of one value or more, not {described(values)}")
        if len(values) > MAX_VALUES:
            raise RequestError(f"grid's {name} has {len(values):,} values; at most {MAX_VALUES} are allowed")
        grid[name] = [_parameter_value(name, v, in_list=True) for v in values]
    return grid


def grid_points(grid: dict[str, list]) -> list[dict]:
    """Every combination of a grid's values, the last name varying fastest: {'a': [1, 2], 'b': [3]} ->
    [{'a': 1, 'b': 3}, {'a': 2, 'b': 3}]."""
    points = [{}]
    for name, values in grid.items():
        points = [{**point, name: value} for point in points for value in values]
    return points


def grid_size(grid: dict[str, list]) -> int:
    size = 1
    for values in grid.values():
        size *= len(values)
    return size


@dataclass(frozen=True)
class JobRequest:
    """A multi-node job request (REST body, magic options, Python API), read into typed fields.
    None: left out (the profile's default). A field of the wrong type is kept as a problem, raised
    when :func:`plan_job` reaches that field: a request with several faults is told the same
    first one, whatever order its fields are read in."""

    profile: str | None = None
    launcher: str = "mpi"
    nodes: int = 1
    gpus_per_node: int | None = None
    tasks_per_node: int | None = None  # None: one rank per GPU
    walltime: str | None = None
    image: str | None = None
    script: str | None = None  # a file of the user's
    code: str | None = None  # or Python source
    notebook: str | None = None  # or a notebook of the user's, run headless (its parameters, or a grid of them)
    parameters: dict = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    max_running: int | None = None  # of a grid's tasks at once
    mail: bool = False  # Slurm's e-mail when the job ends or fails
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    problems: dict[str, str] = field(default_factory=dict)  # field -> why it was refused

    def check(self, *names: str) -> None:
        """Raise the problem of the first of ``names`` that has one."""
        for name in names:
            if name in self.problems:
                raise RequestError(self.problems[name])

    @classmethod
    def parse(cls, raw) -> JobRequest:
        if not isinstance(raw, dict):
            raise RequestError("a job request is an object like {'script': 'train.py', 'nodes': 2}")
        unknown = sorted(str(k) for k in raw if k not in REQUEST_FIELDS)
        if unknown:
            raise RequestError(f"unknown field(s) {', '.join(map(shown, unknown))}: allowed are "
                               f"{', '.join(REQUEST_FIELDS)}")
        for name in REQUEST_FIELDS:
            check_length(name, raw.get(name), LONGEST.get(name, MAX_FIELD))
        problems: dict[str, str] = {}

        def read(name, reader, *args):
            try:
                return reader(*args)
            except RequestError as error:
                problems[name] = str(error)
                return None

        launcher = raw.get("launcher", "")
        launcher = "mpi" if launcher == "" else launcher  # left out: the profile's MPI launcher
        if not isinstance(launcher, str) or launcher not in LAUNCHERS:
            problems["launcher"] = f"launcher must be one of {', '.join(LAUNCHERS)}, not {described(launcher)}"
        script, code = read("script", _text, raw, "script"), read("code", _text, raw, "code")
        notebook = read("notebook", _text, raw, "notebook")
        if sum(source is not None for source in (script, code, notebook)) != 1:
            problems["source"] = ("give one of 'script' (a Python file), 'code' (Python source) or 'notebook' (a "
                                  ".ipynb file to run as a job)")
        elif script is not None and ("\0" in script or "\n" in script):
            problems["source"] = f"script must be a file name, not {shown(script)}"
        elif notebook is not None and ("\0" in notebook or "\n" in notebook or not notebook.endswith(".ipynb")):
            problems["source"] = f"notebook must be the name of a .ipynb file, not {shown(notebook)}"
        parameters = read("parameters", _parameters, raw.get("parameters", {})) or {}
        grid = read("grid", _grid, raw["grid"]) if raw.get("grid") not in (None, {}) else {}
        max_running = read("max_running", _whole, raw, "max_running")
        mail = raw.get("mail", False)
        if not isinstance(mail, bool):
            problems["mail"] = f"mail must be true or false (an e-mail when the job ends), not {described(mail)}"
        if notebook is None and "source" not in problems:
            for name in NOTEBOOK_ONLY:
                if raw.get(name) not in (None, {}, ""):
                    problems["source"] = f"{name} is for a notebook run as a job ('notebook'), not for a script"
        if grid and parameters and "grid" not in problems and set(grid) & set(parameters):
            both = ", ".join(sorted(set(grid) & set(parameters)))
            problems["grid"] = f"{both} is given both in parameters and in grid: give each name once"
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
            problems["args"] = f"args must be a list of text, not {described(args)}"
        name = read("name", _text, raw, "name")
        if name is not None and not _NAME.match(name):
            problems["name"] = f"job name {shown(name)} may hold only letters, digits, '_', '.', '-' (at most 64)"
        nodes = read("nodes", _whole, raw, "nodes")
        return cls(profile=read("profile", _text, raw, "profile"), launcher=launcher if "launcher" not in problems else "mpi",
                   nodes=1 if nodes is None else nodes, gpus_per_node=read("gpus_per_node", _whole, raw, "gpus_per_node"),
                   tasks_per_node=read("tasks_per_node", _whole, raw, "tasks_per_node"),
                   walltime=read("walltime", _text, raw, "walltime"), image=read("image", _text, raw, "image"),
                   script=script, code=code, notebook=notebook, parameters=parameters, grid=grid or {},
                   max_running=max_running, mail=mail is True, args=tuple(args) if "args" not in problems else (),
                   env=read("env", _environment, raw.get("env", {})) or {}, name=name, problems=problems)


@dataclass(frozen=True)
class JobPlan:
    """A job request the rules allow, with everything the batch script needs."""

    profile: Profile
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    mem_mb_per_node: int
    walltime: str
    image: Image | None
    script: str | None  # a file of the user's; None when ``code`` is given
    code: str | None
    args: list[str]
    env: dict[str, str]
    name: str
    launcher: str = "srun"  # srun | mpirun | torchrun | notebook
    notebook: str | None = None  # a notebook run headless: each point's parameters, one Slurm array task each
    points: tuple[dict, ...] = ()  # a grid's points ({} for one run), each over ``parameters``
    parameters: dict = field(default_factory=dict)
    max_running: int | None = None
    mail: bool = False  # --mail-type=END,FAIL: Slurm mails <user>@MailDomain (slurm.conf) when it ends

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def array(self) -> bool:
        return len(self.points) > 1

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else ""
        where = f"image {self.image.name}" if self.image else "the session's Python"
        if self.notebook is not None:
            runs = (f"{len(self.points)} runs (a Slurm array, at most {self.max_running} at once)" if self.array
                    else "one run")
            return (f"notebook {Path(self.notebook).name}, {runs}, {self.cpus_per_task} CPU(s){gpus.replace(' per node', '')} "
                    f"on {self.profile.partition}, {where}, walltime {self.walltime} each")
        return (f"{self.nodes} node(s) x {self.tasks_per_node} rank(s){gpus} on {self.profile.partition}, "
                f"{where}, {self.launcher}, walltime {self.walltime}")


def plan_job(request: JobRequest, policy: LaunchPolicy, base_dir: str | os.PathLike,
             image_status: Callable[[Image], tuple[str, str]] | None = None) -> JobPlan:
    """The job a request asks for, if the user's policy allows it (else RequestError, in words).
    ``image_status`` (the image catalogue's, on a cluster) refuses an image that is not built."""
    request.check("profile")
    profile = policy.profile(request.profile)
    request.check("launcher")
    if request.launcher == "torchrun" and not profile.jobs.torchrun:
        raise RequestError(f"{profile.display_name} does not offer torchrun jobs")
    launcher = profile.jobs.launcher if request.launcher == "mpi" else request.launcher

    request.check("nodes")
    nodes = request.nodes
    if request.notebook is not None and (nodes != 1 or request.tasks_per_node not in (None, 1) or request.args
                                         or request.launcher != "mpi"):
        raise RequestError("a notebook runs as one job on one node, in one kernel: leave out nodes, tasks_per_node, "
                           "args and launcher")
    if nodes < 1:
        raise RequestError(f"a job needs at least 1 node, not {nodes}")
    most_nodes = profile.jobs.max_nodes or policy.node_count.get(profile.partition)
    if most_nodes and nodes > most_nodes:
        raise RequestError(f"{nodes} nodes is more than {profile.display_name} allows for one job ({most_nodes})")

    request.check("gpus_per_node")
    gpus = profile.default_gpus if request.gpus_per_node is None else request.gpus_per_node
    node_gpus = policy.node_gpus.get(profile.partition)
    if gpus < 0:
        raise RequestError(f"gpus_per_node cannot be negative ({gpus})")
    if node_gpus is not None and gpus > node_gpus:
        raise RequestError(f"{gpus} GPUs per node is more than a node of partition {profile.partition} has "
                           f"({node_gpus})")
    request.check("walltime")
    chosen = slice_for(profile, gpus, request.walltime or profile.jobs.default_walltime, per=" per node")

    request.check("tasks_per_node")
    tasks = (gpus or 1) if request.tasks_per_node is None else request.tasks_per_node
    if not 1 <= tasks <= chosen.cpus:
        raise RequestError(f"tasks_per_node must be between 1 and the {chosen.cpus} CPUs of the slice, not {tasks}")

    request.check("image")
    image = _image(request.image, policy, profile, image_status)
    request.check("script", "code", "notebook", "source")
    script = None if request.script is None else _script_file(request.script, base_dir)
    notebook, points, max_running = None, (), None
    if request.notebook is not None:
        notebook = _script_file(request.notebook, base_dir, "notebook")
        request.check("parameters", "grid", "max_running")
        size = grid_size(request.grid)
        most = profile.jobs.max_array_tasks
        if size > most:
            raise RequestError(f"the grid makes {size:,} runs; {profile.display_name} allows at most {most} in one "
                               "array: fewer values, or several arrays")
        points = tuple(grid_points(request.grid))  # each run's own values, over the parameters they share
        max_running = min(size, profile.jobs.max_running if request.max_running is None else request.max_running)
        if max_running < 1:
            raise RequestError("max_running must be at least 1")
        launcher, tasks = "notebook", 1
    request.check("args", "env", "name", "mail")
    return JobPlan(
        profile=profile, nodes=nodes, gpus_per_node=gpus, tasks_per_node=tasks,
        cpus_per_task=max(1, chosen.cpus // tasks), mem_mb_per_node=chosen.mem_mb, walltime=chosen.walltime,
        image=image, script=script, code=request.code, args=list(request.args),
        env={**profile.jobs.env, **request.env}, name=request.name or _default_name(script or notebook, launcher),
        launcher=launcher, notebook=notebook, points=points, parameters=dict(request.parameters),
        max_running=max_running, mail=request.mail,
    )


def _image(name: str | None, policy: LaunchPolicy, profile: Profile, image_status) -> Image | None:
    if not name:
        return None
    allowed = {i.name: i for i in policy.images_for(profile)}
    if name not in allowed:
        offered = ", ".join(allowed) or "none"
        raise RequestError(f"unknown image {shown(name)} for {profile.display_name}: choose one of {offered}")
    image = allowed[name]
    status, detail = image_status(image) if image_status else ("built", "")
    if status == "building":
        raise RequestError(f"image {image.name} is {detail}: launch the job again once it is ready")
    if status != "built":
        raise RequestError(f"image {image.name} is unavailable ({status}: {detail}); ask your admin to build it")
    return image


def _script_file(script: str, base_dir: str | os.PathLike, kind: str = "script") -> str:
    """The file a job request names, relative to ``base_dir``, as an absolute path. Any file the user can
    read may run (it runs as her): her own, and outside her home the packaged examples and her courses'
    templates. A refusal names the path as resolved, and says so when it is outside her home."""
    path = Path(os.path.expanduser(script))
    path = path if path.is_absolute() else Path(base_dir) / path
    shown_path = Path(os.path.normpath(path))  # "..", "." and "//" gone; links are not followed for the words
    home = Path(os.path.expanduser("~"))
    where = "" if shown_path.is_relative_to(home) else f" (outside your home {home})"
    try:
        is_file = path.is_file()
    except OSError as error:  # a folder she may not enter (another user's home): EACCES, not "no such file"
        raise RequestError(f"{kind} {shown_path}{where} cannot be read: {error.strerror}") from None
    if not is_file:
        raise RequestError(f"no such {kind}: {shown_path}{where}")
    if not os.access(path, os.R_OK):
        raise RequestError(f"{kind} {shown_path}{where} is not readable")
    return str(path.resolve())


def _default_name(script: str | None, launcher: str) -> str:
    stem = Path(script).stem if script else "cell"
    prefix = {"torchrun": "ddp-", "notebook": "nb-"}.get(launcher, "hvd-")
    return prefix + (re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:40] or "job")
