"""Issue 53, item 2: the app as Flower builds, publishes and runs it, current with Flower.

- the app classes (``ServerApp``, ``ClientApp``, ``Context``, the records, the mods) come from
  the modules Flower's documentation names since 1.21 (``flwr.serverapp``, ``flwr.clientapp``,
  ``flwr.app``), wherever the installed flwr offers them there; the legacy ``Strategy``,
  ``NumPyClient`` and their message types keep their only home;
- ``flwr build`` (the command, as a publisher runs it) makes a FAB with the publisher, the
  license and its file, and that FAB, unpacked, runs on a fresh SuperLink: two rounds, four
  clients, the small model on a small MNIST sample.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import tomllib
import zipfile

from fl_app.common.run_files import read_metrics
from runner.processes import exe
from tests.conftest import ROOT, local_simulation

CODE = ("fl_app", "clients", "strategies", "tasks", "protocol", "runner", "tests", "bench", "scripts",
        "run_simulation.py")
# where Flower's documentation moved the app classes (the old modules still re-export them)
CURRENT = {"flwr.server": "flwr.serverapp", "flwr.client": "flwr.clientapp", "flwr.common": "flwr.app",
           "flwr.client.mod": "flwr.clientapp.mod"}


def old_home_imports() -> list[str]:
    """``file: from <old> import <name>`` for every name imported from an old module although
    the installed flwr offers it in the current one."""
    offered = {old: set(dir(importlib.import_module(new))) for old, new in CURRENT.items()}
    found = []
    for entry in CODE:
        path = ROOT / entry
        for file in [path] if path.is_file() else path.rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module in offered:
                    found += [f"{file.relative_to(ROOT)}: from {node.module} import {alias.name}"
                              for alias in node.names if alias.name in offered[node.module]]
    return found


def test_the_app_classes_come_from_flowers_current_modules():
    assert "ServerApp" in dir(importlib.import_module("flwr.serverapp"))  # the scan sees the new homes
    assert not old_home_imports(), "\n".join(old_home_imports())


def test_flwr_build_makes_a_fab_that_a_fresh_superlink_runs(tmp_path, mnist_sample):
    """The publisher's ``flwr build --app <checkout>``: one FAB, named by the publisher, with
    the license file and a pyproject that says both; unpacked, it is the app a fresh private
    SuperLink runs to the end."""
    built = subprocess.run([exe("flwr"), "build", "--app", str(ROOT)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (fab,) = tmp_path.glob("*.fab")
    assert fab.name.startswith("fl-drift.fl-drift.0-1-0."), fab.name  # <publisher>.<name>.<version>.<hash>
    app = tmp_path / "app"
    with zipfile.ZipFile(fab) as package:
        names = package.namelist()
        package.extractall(app, [n for n in names if not n.startswith(".info/")])
    assert "LICENSE" in names and "fl_app/server_app.py" in names and not any(n.startswith("docs/") for n in names)
    assert (app / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    meta = tomllib.loads((app / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0" and meta["project"]["license-files"] == ["LICENSE"]
    assert meta["tool"]["flwr"]["app"]["publisher"] == "fl-drift"
    cfg = {"strategy": "fedavg", "dataset": "mnist", "model": "cnn-small", "num-server-rounds": 2,
           "partitioner": "iid", "fraction-fit": 1.0, "data-dir": str(mnist_sample(600, 200)),
           "results-dir": str(tmp_path / "results"), "run-name": "fab"}
    lines: list[str] = []
    with local_simulation(app_dir=app) as sim:
        assert sim.run(cfg, num_supernodes=4, on_line=lines.append) == 0, "\n".join(lines[-40:])
    rows = read_metrics(tmp_path / "results" / "fab")
    assert [r["round"] for r in rows] == [1, 2] and all(r["num_clients"] == 4 for r in rows), "\n".join(lines[-40:])
