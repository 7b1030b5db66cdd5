"""The code's layout holds: imports go downward only, with no circle (docs/explanation/architecture.md, Layout).
No cluster needed."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parent.parent

# Each layer and the layers it may import: a layer is a folder of portal/ (portal/core/, portal/slurm/ ...),
# the spawner package, or portal/cli.py on top. Within a layer modules import each other freely, without a circle.
LAYERS = {
    "core": set(),  # portal.yaml's model, the rules, the session's spec, templating: what every side reads
    "slurm": {"core"},  # the one place that talks to Slurm
    "upstream": {"core"},  # every patch's record and check, and the patches with no feature home
    "session": {"core", "slurm", "upstream"},  # each user's session job
    "spawner": {"core", "slurm"},  # the hub's spawners
    "admin": {"core", "slurm"},  # the admin's commands (not the spawners: they sit above)
    "hub": {"core", "slurm", "upstream", "spawner"},  # the JupyterHub process
    "cli": {"core", "slurm", "upstream", "admin", "hub", "session", "spawner"},
}


def layer(module: str) -> str:
    """A module's layer is its folder: portal.<layer>.*, spawner.*, or portal.cli."""
    parts = module.split(".")
    if parts[0] == "spawner":
        return "spawner"
    if module == "portal.cli":
        return "cli"
    if parts[0] == "portal" and len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    raise AssertionError(f"{module} is in no layer: put it in a folder of portal/ that is a layer (tests/test_layout.py, "
                         "docs/explanation/architecture.md's Layout)")


def modules() -> dict[str, Path]:
    found = {}
    for root in ("portal", "spawner"):
        for path in (REPO / root).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that ``name`` imports at module level or in functions (not under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items() if name not in ("portal", "spawner")}


def test_every_import_goes_down():
    wrong = [f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in graph().items() for b in targets
             if layer(a) != layer(b) and layer(b) not in LAYERS[layer(a)]]
    assert not wrong, "imports that run back up or across:\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    edges = graph()
    circles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_bottom_and_the_packages_import_nothing():
    """defaults.py and sessionvars.py are read by every side (a session's start too), and importing
    any module runs its packages' __init__: they import nothing, not even the standard library."""
    for name, path in modules().items():
        if layer_is_free(name, path):
            tree = ast.parse(path.read_text())
            imports_found = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                             and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
            assert not imports_found, f"{name} imports {imports_found}"


def layer_is_free(name: str, path: Path) -> bool:
    """The bottom modules, and every package (its __init__ runs before any of its modules)."""
    return name in ("portal.core.defaults", "portal.core.sessionvars") or path.name == "__init__.py"


def test_the_folders_are_the_layers_and_the_demo_is_not_installed():
    """Every module of portal/ sits in a layer's folder (or is portal/cli.py); the demo cluster is outside the
    package, and no installed module imports it."""
    assert {p.name for p in (REPO / "portal").iterdir() if p.is_dir() and any(p.rglob("*.py"))} == set(LAYERS) - {
        "spawner", "cli"}
    assert sorted(p.name for p in (REPO / "portal").glob("*.py")) == ["__init__.py", "cli.py"]
    for name in modules():
        if name not in ("portal", "spawner"):  # the packages' own __init__, which import nothing
            layer(name)
    for name, path in modules().items():
        assert "democluster" not in {t.split(".")[0] for t in imports_everything(path)}, f"{name} imports the demo"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert "democluster" not in pyproject.split("packages = [", 1)[1].split("]", 1)[0]


def imports_everything(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
    return found


def test_a_modules_main_block_comes_last():
    """`python -m MODULE` runs the module's __main__ block as it is reached: a definition below it does not
    exist yet when the program runs (the service once crashed so, NameError, on a helper defined below)."""
    late = []
    for name, path in modules().items():
        body = ast.parse(path.read_text()).body
        for index, node in enumerate(body):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'",
                                                                    '__name__ == "__main__"'):
                if index != len(body) - 1:
                    late.append(f"{name}: line {node.lineno}")
    assert not late, "a __main__ block with definitions after it:\n" + "\n".join(late)
