"""The install: every required dependency in pyproject.toml is imported by the project's code (a
declared package that nothing imports only costs installs: torchvision did, and broke on CPU
torch); and the lean install (``pip install -e .``, no extra) runs every method: a plain run's code
imports no package the base dependencies do not name, an extra's (the trackers, the docs tools)
only inside the function that uses it, and every module imports, and a run runs, with the extras'
packages blocked. What this does not check: a real fresh environment with only the base install
(its resolver's choices); tests/project/test_readme.py (slow) runs README's install lines."""

from __future__ import annotations

import ast
import os
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("runner", "fl_app", "clients", "strategies", "protocol", "tasks", "scripts", "bench", "run_simulation.py")
# distribution name -> the module it installs, where the two differ
MODULE = {"flwr-datasets": "flwr_datasets", "tomli-w": "tomli_w", "pillow": "PIL", "flwr[simulation]": "flwr"}


def required() -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() for d in deps]


def imported_modules() -> set[str]:
    """Top-level module names of every import statement in the code (any depth: lazy imports count)."""
    found: set[str] = set()
    for entry in CODE:
        path = ROOT / entry
        for file in [path] if path.is_file() else path.rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


def test_every_required_dependency_is_imported():
    names = imported_modules()
    assert {"flwr", "torch", "numpy"} <= names  # the scan sees imports
    unused = [d for d in required() if MODULE.get(d, d) not in names]
    assert not unused, f"required dependencies that nothing imports: {', '.join(unused)}"


# ---- a lean install: `pip install -e .` runs every method ------------------------------------------------

RUNTIME = ("runner", "fl_app", "clients", "strategies", "protocol", "tasks", "run_simulation.py")  # a plain run's code
OURS = {"runner", "fl_app", "clients", "strategies", "protocol", "tasks", "run_simulation", "tests"}
# what only an extra installs -> the extra; imported only inside the functions that use them
# (fl_app/server/tracking.py), so that a lean install imports every module
EXTRA_MODULES = {"tensorboard": "tensorboard", "torch.utils.tensorboard": "tensorboard", "mlflow": "mlflow",
                 "wandb": "wandb", "mkdocs": "docs", "mkdocstrings": "docs", "material": "docs"}


def extra_of(module: str) -> str | None:
    return next((extra for name, extra in EXTRA_MODULES.items() if module == name or module.startswith(name + ".")),
                None)


def runtime_imports() -> list[tuple[str, str, bool]]:
    """(file, module, at module level) of every import of a third-party module in a plain run's code."""
    import sys

    found = []
    for entry in RUNTIME:
        path = ROOT / entry
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            tree = ast.parse(file.read_text(encoding="utf-8"))
            top_level = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] not in sys.stdlib_module_names | OURS:
                        found.append((str(file.relative_to(ROOT)), name, id(node) in top_level))
    return found


def test_a_plain_run_imports_only_base_dependencies_and_the_extras_only_where_they_are_used():
    """Every third-party module a plain run's code imports is a base dependency's, or an extra's
    imported inside the function that needs it (never at module level, where a lean install
    would fail to import the module)."""
    base = {MODULE.get(d, d) for d in required()}
    found = runtime_imports()
    assert any(m == "torch" for _, m, _ in found) and any(extra_of(m) for _, m, _ in found)  # the scan sees both
    undeclared = sorted({(f, m) for f, m, _ in found if not extra_of(m) and m.split(".")[0] not in base})
    assert not undeclared, f"imports of packages no base dependency names: {undeclared}"
    eager = sorted({(f, m) for f, m, top in found if extra_of(m) and top})
    assert not eager, f"an extra's module imported at module level: {eager}"


BLOCKED = """
import importlib, importlib.abc, pkgutil, sys
BLOCKED = {blocked!r}
def blocked(name):
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)
class NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ModuleNotFoundError(f"No module named {{name!r}} (an extra, blocked)", name=name)
sys.meta_path.insert(0, NoExtras())
for name in [m for m in sys.modules if blocked(m)]:
    del sys.modules[name]
for package in {packages!r}:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
importlib.import_module("run_simulation")
assert not [m for m in sys.modules if blocked(m)]

from pathlib import Path
from fl_app.common.run_files import read_metrics
from tests.kit import serve_in_process
out = Path(sys.argv[1])
for method in ("fedavg", "scaffold"):  # the default tracking ("tensorboard") without its package
    serve_in_process({{"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": 2,
                      "results-dir": str(out), "run-name": method}}, 2)
    assert [r["round"] for r in read_metrics(out / method)] == [1, 2], method
    assert not (out / method / "tensorboard").exists()
print("lean", flush=True)
"""


def test_every_module_imports_and_a_run_runs_with_no_extra_installed(tmp_path):
    """In a process where no extra's package can be imported (the trackers, the docs tools), every
    module of the app, the methods and the runner imports, and a run with the default config's
    tracking (TensorBoard) runs: a lean install (``pip install -e .``) runs every method. The test
    tools are not blocked (the run is ``tests.kit``'s); the scan above shows no runtime module
    imports them."""
    import subprocess
    import sys

    code = BLOCKED.format(blocked=sorted(EXTRA_MODULES), packages=["fl_app", "clients", "strategies", "tasks", "runner", "protocol"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("lean"), done.stdout[-2000:] + done.stderr[-4000:]
