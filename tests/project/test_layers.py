"""The packages import one way, every arrow down:

    tasks <- protocol <- (clients, strategies) <- fl_app <- runner

Every import is counted, including imports inside functions, by reading the source (AST), so
a cycle cannot hide behind a lazy import. Allowed edges, with no exception:

- ``tasks`` (datasets, models, training: no method's protocol) imports nothing of ours but
  ``tasks``;
- ``protocol`` (the methods' wire protocol: the run-config key declarations ``protocol.keys``,
  which every layer imports downwards, and ``protocol.layout``, which entries travel as what)
  imports ``tasks`` and itself;
- ``clients`` and ``strategies`` import ``protocol``, ``tasks`` and their own package; never
  each other: what both sides of a method must agree on lives in ``protocol``;
- ``fl_app`` (what runs inside a Flower run: the ServerApp, the ClientApp and their parts)
  imports anything below it and never ``runner``; inside it the rooms import one way too
  (``FL_APP_LAYERS``, top to bottom): the entry points (``server_app``, ``client_app``) ->
  ``fl_app.registry`` (the method catalogue, the whole run-config schema and ``resolve``, the
  one look-up of a method by its name) -> ``config`` (the general keys and the checks, naming
  no method) -> ``fl_app.server`` (the server's round loop and its parts) beside ``fl_app.node``
  (what a node does around a method's client; neither imports the other: the cohort wire they
  share is ``protocol.cohort``) -> ``fl_app.common`` (the ``Method`` pair type,
  shared I/O and background helpers, the run folder's files and their schema, the parsing of
  ``inject-faults`` and ``tracking``, the checks of ``execution`` and ``screening`` against a
  method, and the decision of a run's path: what the ClientApp needs, so it loads no server
  module). A room imports its own modules and the rooms below it, never one above or beside it;
- ``runner`` (outside a Flower run: launches runs and deployments, writes reports) reaches what
  lies below it through fl_app's public entry ``fl_app.api`` and the run-config schema
  (``fl_app.registry``, ``fl_app.config``) only (``RUNNER_MAY_IMPORT``); ``runner.results``
  (reading finished runs) imports no other part of the runner.

Within one package the module graph must be acyclic, and a method module never borrows from a
sibling method module except through the package's shared modules.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runner", "fl_app", "strategies", "clients", "protocol", "tasks")
KEYS = "protocol.keys"
FL_APP_LAYERS = (
    ("fl_app.server_app", "fl_app.client_app", "fl_app"),
    ("fl_app.registry",),
    ("fl_app.config",),
    ("fl_app.server", "fl_app.node"),  # beside each other: what both speak is protocol.cohort
    ("fl_app.common",),
)
RUNNER_LAYERS = (
    ("runner",),
    ("runner.results",),
)
ALLOWED = {
    "tasks": {"tasks"},
    "protocol": {"protocol", "tasks"},
    "clients": {"clients", "protocol", "tasks"},
    "strategies": {"strategies", "protocol", "tasks"},
    "fl_app": {"fl_app", "clients", "strategies", "protocol", "tasks"},
    "runner": set(PACKAGES),
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def our_imports(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # "from pkg.mod import obj" names pkg.mod.obj: keep the longest prefix that is a module
        targets = set()
        for imported in our_imports(path):
            while imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported in modules and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_no_upward_or_sideways_imports():
    bad = []
    for module, targets in import_graph().items():
        package = module.split(".")[0]
        for target in targets:
            if target.split(".")[0] in ALLOWED[package]:
                continue
            bad.append(f"{module} imports {target}")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def room_of(module: str, layers: tuple) -> tuple[int, str]:
    """(layer index, room) of a module: the longest room name of ``layers`` that prefixes it."""
    rooms = [(i, room) for i, layer in enumerate(layers) for room in layer
             if module == room or module.startswith(room + ".")]
    return max(rooms, key=lambda r: len(r[1]))


def rooms_importing_upwards(package: str, layers: tuple) -> list[str]:
    """The imports of ``package``'s modules into a room of it above or beside their own."""
    bad = []
    for module, targets in import_graph().items():
        if module.split(".")[0] != package:
            continue
        layer, room = room_of(module, layers)
        for target in targets:
            if target.split(".")[0] != package:
                continue
            t_layer, t_room = room_of(target, layers)
            if t_room != room and t_layer <= layer:
                bad.append(f"{module} ({room}) imports {target} ({t_room})")
    return sorted(bad)


def test_fl_app_rooms_import_downwards():
    """Inside fl_app: a module imports its own room or a room in a lower layer."""
    bad = rooms_importing_upwards("fl_app", FL_APP_LAYERS)
    assert not bad, "fl_app rooms importing upwards or sideways:\n" + "\n".join(bad)


def test_runner_results_import_no_launcher():
    """Reading finished runs (runner.results) needs nothing of the runner that launches them."""
    bad = rooms_importing_upwards("runner", RUNNER_LAYERS)
    assert not bad, "runner rooms importing upwards:\n" + "\n".join(bad)


def test_every_fl_app_module_has_a_room():
    """A new module or folder under fl_app/ is placed in the room order on purpose."""
    mods = [m for m in import_graph() if m.startswith("fl_app")]
    assert mods and all(room_of(m, FL_APP_LAYERS) for m in mods)


CLIENT_SIDE = """
import json, sys
from flwr.common import Context, RecordDict
from fl_app.client_app import client_fn
loaded = {"import": sorted(m for m in sys.modules if m.startswith("fl_app.server"))}
for path, extra in (("per-client", {}), ("cohort", {"execution": "cohort", "num-virtual-clients": 4})):
    config = {"dataset": "synthetic", "model": "logreg", "strategy": "scaffold", **extra}
    node = {"partition-id": 0, "num-partitions": 2}
    client_fn(Context(run_id=0, node_id=0, node_config=node, state=RecordDict(), run_config=config))
    loaded[path] = sorted(m for m in sys.modules if m.startswith("fl_app.server"))
print(json.dumps(loaded))
"""


def test_the_client_app_loads_no_server_module():
    """A node runs the ClientApp only: importing it, and building a client through its
    ``client_fn`` (one client, and a cohort node's), loads no module of ``fl_app.server``. Run in
    a fresh interpreter, since this one has imported the server already."""
    done = subprocess.run([sys.executable, "-c", CLIENT_SIDE], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"import": [], "per-client": [], "cohort": []}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def third_party_names(tree: ast.AST) -> set[str]:
    """The names a module binds by importing a package that is not ours (``torch``, ``nn``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] not in PACKAGES}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES:
                names |= {a.asname or a.name for a in node.names}
    return names


def test_no_module_imports_a_private_name():
    """A module imports another's public names only (``from m import _x`` is a reach into its
    inside): the product packages, the scripts and the benchmarks."""
    files = [p for pkg in (*PACKAGES, "scripts", "bench") for p in sorted((ROOT / pkg).rglob("*.py"))]
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}"
                        for a in node.names if private(a.name)]
    assert not bad, "private names imported:\n" + "\n".join(bad)


def test_no_product_code_reaches_into_another_objects_private_attributes():
    """``x._name`` only on ``self`` or ``cls`` (a class's own state, ``DriftServer``'s client
    manager included: it asks Flower's public ``client_manager()``), or on a library module
    (``torch._foreach_norm``); never on another object of ours."""
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            libraries = third_party_names(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and private(node.attr)):
                    continue
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not own and not (isinstance(root, ast.Name) and root.id in libraries):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "private attributes reached from outside:\n" + "\n".join(bad)


def test_key_declarations_are_a_leaf():
    """protocol.keys sits below every module that declares or validates a key."""
    assert import_graph()[KEYS] == set()


def test_no_import_cycle():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_method_modules_do_not_borrow_from_sibling_methods():
    """A method module may import its package's shared modules, not another method's."""
    shared = {
        "strategies": {"strategies.base", "strategies.arrays", "strategies.server_opt", "strategies.parts",
                       "strategies.control_variates", "strategies.declared", "strategies.momentum"},
        # the terms the client methods share (each written once, with explicit coefficients)
        "clients": {"tasks.optim", "clients.control_variates", "clients.dynamic", "clients.gam",
                    "clients.sharpness", "clients.momentum", "clients.swa"},
    }
    graph = import_graph()
    bad = []
    for package, allowed in shared.items():
        for module, targets in graph.items():
            if not module.startswith(package + ".") or module in allowed:
                continue
            for target in targets:
                if target.startswith(package + ".") and target not in allowed:
                    bad.append(f"{module} imports {target}")
    # A method composes shared parts (clients.control_variates, .dynamic, .gam, .sharpness, .momentum, .swa and
    # tasks.functional.terms on the client; strategies.parts, strategies.control_variates,
    # strategies.momentum and strategies.declared on the server) and imports no other method: no exception.
    assert sorted(bad) == []


def test_no_function_over_50_lines():
    """Every function of the product packages fits on a screen (docstring included); a longer
    one is split into named steps."""
    long = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > 50:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, "functions over 50 lines:\n" + "\n".join(long)


# What the runner may import of the packages below it: fl_app's public entry and its run-config
# schema; the process table (a leaf that imports nothing of ours, kept out of fl_app.api's weight
# so that the runner's watchdog starts without torch and Flower); the apps' list of third-party
# warnings to ignore (a leaf as well, which runner/quiet.py applies to the runner's own process
# before anything heavy is imported); the plain catalogue of data sets (read before torch is
# imported, runner/early.py).
RUNNER_MAY_IMPORT = ("fl_app.api", "fl_app.registry", "fl_app.config", "fl_app.common.procfs",
                     "fl_app.common.verbosity", "tasks.catalogue")


def test_the_runner_reaches_fl_app_through_its_public_entry():
    """No module of ``runner`` imports fl_app's rooms (``fl_app.server``, ``fl_app.common``,
    ``fl_app.node``, the Flower apps) or ``tasks``, ``protocol``, ``strategies``, ``clients``
    directly: what it needs of them comes through ``fl_app.api`` (or the run-config schema), so
    fl_app's rooms can move without the runner noticing."""
    bad = []
    for module, targets in import_graph().items():
        if module.split(".")[0] != "runner":
            continue
        for target in targets:
            if target.split(".")[0] != "runner" and target not in RUNNER_MAY_IMPORT:
                bad.append(f"{module} imports {target}")
    assert not bad, "the runner reaching past fl_app.api:\n" + "\n".join(sorted(bad))
