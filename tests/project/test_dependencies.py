"""Every required dependency in pyproject.toml is imported by the project's code: a declared
package that nothing imports only costs installs (torchvision did, and broke on CPU torch)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("runner", "fl_app", "clients", "strategies", "protocol", "tasks", "scripts", "bench", "run_simulation.py")
# distribution name -> the module it installs, where the two differ
MODULE = {"flwr-datasets": "flwr_datasets", "tomli-w": "tomli_w", "pillow": "PIL"}


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
