"""The code's layout holds: imports go downward only, with no circle (docs/explanation/architecture.md, Layout).
No cluster needed."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parent.parent

# Each layer and the layers it may import. Within a layer modules import each other freely, without a circle.
LAYERS = {
    "base": set(),  # names and defaults every side reads, imports nothing
    "core": {"base"},  # portal.yaml's model, the Slurm adapter, the image catalogue's state
    "shared": {"base", "core"},  # the rules, batch script rendering, template sources, the upstream patches' checker
    "session": {"base", "core", "shared"},  # each user's session job
    "spawner": {"base", "core", "shared"},  # the hub's spawners
    "admin": {"base", "core", "shared"},  # the admin's commands and the demo cluster (not the spawners: they sit above)
    "hub": {"base", "core", "shared", "spawner"},  # the JupyterHub process
    "cli": {"base", "core", "shared", "admin", "hub", "session", "spawner"},
}


def layer(module: str) -> str:
    if module in ("portal.defaults", "portal.sessionvars", "portal.wholefile", "portal.userjson"):
        return "base"
    if module in ("portal.settings", "portal.cluster.slurmparse", "portal.cluster.slurmclient",
                  "portal.cluster.images"):
        return "core"
    if module in ("portal.rules", "portal.sessionspec", "portal.settingtraits", "portal.templating",
                  "portal.templatesources", "portal.patchcheck",
                  "portal.hubdatabase", "portal.ldapconnect", "portal.settingsdoc", "portal.notebookcells"):
        return "shared"
    for prefix, name in (("portal.session", "session"), ("spawner", "spawner"), ("portal.hub", "hub"),
                         ("portal.cluster", "admin"), ("portal.cli", "cli")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    raise AssertionError(f"{module} is in no layer: add it to tests/test_layout.py and the Layout of "
                         "docs/explanation/architecture.md")


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
    return {name: imports(name, path, known) for name, path in known.items()}


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
    """The bottom modules, and the packages that hold modules of more than one layer."""
    return name in ("portal.defaults", "portal.sessionvars", "portal", "portal.cluster", "portal.hub", "portal.session",
                    "spawner")
