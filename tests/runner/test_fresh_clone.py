"""A fresh clone, as a newcomer first uses it:

- the README's test command without a data folder: tests that need data skip, and no test sets
  ``FL_DATA_DIR`` (to a missing folder or any other) for the tests after it;
- ``.ci/run`` builds its virtual environment in a folder of its own and removes it on exit;
- ``.venv`` (which the README's set-up creates in the checkout) is git-ignored;
- ``run_simulation.py --help`` shows its example as it is typed.

The libraries' warnings a run prints are checked in tests/runner/test_log_noise.py.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.kit import ROOT


# ------------------------------------------------------------------ no data folder
def test_without_a_data_folder_data_tests_skip_and_the_rest_pass(tmp_path):
    """In a pytest of its own where no data folder exists (no
    ``FL_DATA_DIR``, and the folder beside the checkout pointed at a missing path): the
    in-process run that needs MNIST is skipped with the one reason, and the next test, which
    writes a summary.json, is not broken by a ``FL_DATA_DIR`` left behind by the first one's
    fixtures."""
    missing = tmp_path / "no-data"
    code = textwrap.dedent(f"""
        import pathlib, sys, pytest

        class NoFolderBeside:  # every loaded copy of tests/kit.py: the folder beside the checkout is missing
            def pytest_collection_finish(self, session):
                for module in list(sys.modules.values()):
                    if getattr(module, "__file__", None) == {str(ROOT / "tests" / "kit.py")!r}:
                        module.SHARED_DATA = pathlib.Path({str(missing)!r})

        sys.exit(pytest.main(["-q", "-rs", "-n", "0", "-p", "no:cacheprovider", "--basetemp", {str(tmp_path / "bt")!r},
                              "tests/runner/test_reliability.py::test_raising_and_nan_clients_do_not_corrupt_the_run_in_process",
                              "tests/runner/test_results.py::test_rows_summary_and_rejections"],
                             plugins=[NoFolderBeside()]))
    """)
    env = {k: v for k, v in os.environ.items() if k != "FL_DATA_DIR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "1 passed, 1 skipped" in out, out[-4000:]
    assert f"no offline data: {missing} has no mnist/train.parquet" in out, out[-4000:]


def test_no_data_folder_means_no_fl_data_dir(monkeypatch, tmp_path):
    """The simulations the tests start get ``FL_DATA_DIR`` only when the folder holds the data,
    and only in their own environment, never in this process's."""
    import tests.kit as kit
    from tests.kit_runs import local_simulation

    monkeypatch.delenv("FL_DATA_DIR", raising=False)
    monkeypatch.setattr(kit, "SHARED_DATA", tmp_path / "no-data")
    assert kit.data_env() == {}
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    (tmp_path / "data" / "mnist" / "train.parquet").write_bytes(b"")
    monkeypatch.setattr(kit, "SHARED_DATA", tmp_path / "data")
    assert kit.data_env() == {"FL_DATA_DIR": str(tmp_path / "data")}
    sim = local_simulation(home=tmp_path / "home")  # built, not started
    assert sim.env["FL_DATA_DIR"] == str(tmp_path / "data")
    assert "FL_DATA_DIR" not in os.environ


# ------------------------------------------------------------------ CI script
def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("outcome", ["pass", "fail"])
def test_ci_script_venv_is_its_own_and_removed_on_exit(tmp_path, outcome):
    """``.ci/run`` with stand-ins for python3 (its ``-m venv``), pip, pytest, ruff, nginx, apt-get
    and mkdocs:
    two runs build their environments in folders of their own, and each folder is gone after
    the script ends, whether the tests pass or fail.
    When the suite passes, a second environment gets the lowest flwr pyproject.toml allows
    and runs the tests of Flower's interfaces, files that exist; the first gets the
    flwr of .ci/constraints.txt."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    # python3 -m venv DIR: a DIR/bin/activate that puts the stand-ins first on PATH
    _stub(bin_dir, "python3", textwrap.dedent(f"""\
        if [ "$1 $2" = "-m venv" ]; then
          echo "venv $3" >> {log}
          mkdir -p "$3/bin" && echo 'export PATH="{bin_dir}:$PATH"' > "$3/bin/activate"
        fi
    """))
    fail = "exit 1" if outcome == "fail" else "exit 0"
    _stub(bin_dir, "python", textwrap.dedent(f"""\
        [ "$2 $5" = "pip -c" ] && echo "constraints $(grep '^flwr==' "$6")" >> {log}
        [ "$2" = "pytest" ] && {{ echo "pytest $*" >> {log}; {fail}; }}
        exit 0
    """))
    for tool in ("ruff", "mkdocs", "nginx", "apt-get", "sudo"):  # nothing is installed or built
        _stub(bin_dir, tool, "exit 0\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    codes = [subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True,
                            timeout=60).returncode for _ in range(2)]
    assert codes == ([0, 0] if outcome == "pass" else [1, 1])
    lines = log.read_text().splitlines()
    venvs = [line.split(" ", 1)[1] for line in lines if line.startswith("venv ")]
    assert len(venvs) == (4 if outcome == "pass" else 2) and len(set(venvs)) == len(venvs), venvs
    assert all(Path(v).parent == tmp_path and not Path(v).exists() for v in venvs), venvs
    pinned = re.search(r"^flwr==(\S+)", (ROOT / ".ci" / "constraints.txt").read_text(), re.M).group(1)
    lowest = re.search(r'"flwr\[simulation\]>=([0-9.]+)', (ROOT / "pyproject.toml").read_text()).group(1)
    runs = [line.split(" ", 1)[1] for line in lines if line.startswith(("constraints ", "pytest "))]
    if outcome == "fail":
        assert runs == [f"flwr=={pinned}", "-m pytest -q"] * 2, runs
        return
    assert runs[:3] == [f"flwr=={pinned}", "-m pytest -q", f"flwr=={lowest}"], runs
    subset = runs[3].split()[3:]
    assert runs[3].startswith("-m pytest -q tests/") and len(subset) >= 8, runs
    assert all((ROOT / test).is_file() for test in subset), subset


# ------------------------------------------------------------------ .gitignore
def test_the_readme_venv_is_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in (".venv/bin/python", ".flwr_home/config.toml", "results/compare-1/comparison.md"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path


# ------------------------------------------------------------------ run_simulation.py --help
def test_help_shows_the_example_as_it_is_typed():
    """The runner's usage (runner/cli.py's docstring) is argparse's description: a backslash-newline
    in it joined the two lines of the example ('fedavg,fedprox         --dataset'); the help shows
    both lines, the first ending in the shell's line continuation."""
    import ast

    doc = ast.get_docstring(ast.parse((ROOT / "runner" / "cli.py").read_text()), clean=False)
    example = doc.split("Example:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert example[0].endswith("--strategy fedavg,fedprox \\"), example
    assert example[1].strip().startswith("--dataset mnist"), example
