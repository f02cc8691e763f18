"""The app as Flower builds, publishes and runs it, current with Flower.

- the app classes (``ServerApp``, ``ClientApp``, ``Context``, the records, the mods) come from
  the modules Flower's documentation names since 1.21 (``flwr.serverapp``, ``flwr.clientapp``,
  ``flwr.app``), wherever the installed flwr offers them there; the legacy ``Strategy``,
  ``NumPyClient`` and their message types keep their only home;
- ``flwr build`` (the command, as a publisher runs it) makes a FAB with the publisher, the
  license and its file; unpacked, that FAB builds again to the same bytes, the bytes that
  ``flwr run`` ships from the checkout: the app that the session's shared FedAvg run
  (``simulated`` in conftest.py) ran to the end on its private SuperLink.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

from fl_app.common.run_files import read_metrics
from runner.processes import exe
from tests.kit import ROOT

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


def flwr_build(app: Path, out: Path) -> Path:
    """``flwr build --app <app>`` run in ``out``, as a publisher runs it; the FAB it made."""
    out.mkdir(parents=True, exist_ok=True)
    built = subprocess.run([exe("flwr"), "build", "--app", str(app)], cwd=out, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (fab,) = out.glob("*.fab")
    return fab


def test_flwr_build_makes_the_fab_that_flwr_run_ships_and_runs(tmp_path, simulated, request):
    """The publisher's ``flwr build --app <checkout>``: one FAB, named by the publisher, with
    the license file and a pyproject that says both. Unpacked, it is a Flower app that builds
    to the same bytes again (what ``flwr run <unpacked>`` would ship), and those bytes, by
    their SHA-256 in the name Flower installs an app under, are the app that the session's
    shared FedAvg run installed on its private SuperLink and ran to the end (a run of its own
    would run the same bytes at the cost of another simulation's start, about 30 s)."""
    from tests.kit_runs import SUPERNODES, simulated_config

    fab = flwr_build(ROOT, tmp_path / "checkout")
    digest = hashlib.sha256(fab.read_bytes()).hexdigest()
    assert fab.name == f"fl-drift.fl-drift.0-1-0.{digest[:8]}.fab", fab.name  # <publisher>.<name>.<version>.<hash>
    app = tmp_path / "app"
    with zipfile.ZipFile(fab) as package:
        names = package.namelist()
        package.extractall(app, [n for n in names if not n.startswith(".info/")])
    assert "LICENSE" in names and "fl_app/server_app.py" in names and not any(n.startswith("docs/") for n in names)
    assert (app / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    meta = tomllib.loads((app / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0" and meta["project"]["license-files"] == ["LICENSE"]
    assert meta["tool"]["flwr"]["app"]["publisher"] == "fl-drift"
    assert flwr_build(app, tmp_path / "unpacked").read_bytes() == fab.read_bytes()

    run = simulated("fedavg", simulated_config("fedavg", request), SUPERNODES)
    assert run.rc == 0, "\n".join(run.lines[-30:])
    installed = [m.group(1) for line in run.lines if (m := re.search(r"Successfully installed \S+ to (\S+?)\.?$", line))]
    assert [Path(folder).name for folder in installed] == [f"fl-drift.fl-drift.0.1.0.{digest[:8]}"], run.lines[:20]
    rows = read_metrics(run.run_dir)
    assert len(rows) == simulated_config("fedavg", request)["num-server-rounds"] and all(r["num_clients"] for r in rows)
