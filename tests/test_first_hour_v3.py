"""Issue 45 ("the first hour v3"): the newcomer's defects, each checked as the newcomer met it.

- the README's test command on a fresh clone without a data folder: tests that need data skip,
  and no test sets ``FL_DATA_DIR`` (to a missing folder or any other) for the tests after it;
- ``.ci/run`` builds its virtual environment in a folder of its own and removes it on exit;
- ``.venv`` (which the README's set-up creates in the checkout) is git-ignored;
- ``run_simulation.py --help`` shows its example as it is typed;
- library warnings and Flower/Ray/MLflow lines stay hidden unless ``--verbose``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT


# ------------------------------------------------------------------ no data folder
def test_without_a_data_folder_data_tests_skip_and_the_rest_pass(tmp_path):
    """The issue's reproduction, in a pytest of its own where no data folder exists (no
    ``FL_DATA_DIR``, and the folder beside the checkout pointed at a missing path): the
    simulation test that needs MNIST is skipped with the one reason, and the next test, which
    writes a summary.json, is not broken by a ``FL_DATA_DIR`` left behind by the first one's
    fixtures (before the fix: 1 failed, 1 skipped)."""
    missing = tmp_path / "no-data"
    code = textwrap.dedent(f"""
        import pathlib, sys, pytest

        class NoFolderBeside:  # every loaded copy of conftest.py: the folder beside the checkout is missing
            def pytest_collection_finish(self, session):
                for module in list(sys.modules.values()):
                    if getattr(module, "__file__", None) == {str(ROOT / "tests" / "conftest.py")!r}:
                        module.SHARED_DATA = pathlib.Path({str(missing)!r})

        sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "--basetemp", {str(tmp_path / "bt")!r},
                              "tests/test_reliability.py::test_raising_and_nan_clients_do_not_corrupt_the_run",
                              "tests/test_results.py::test_rows_summary_and_rejections"],
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
    import tests.conftest as conftest

    monkeypatch.delenv("FL_DATA_DIR", raising=False)
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path / "no-data")
    assert conftest.data_env() == {}
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    (tmp_path / "data" / "mnist" / "train.parquet").write_bytes(b"")
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path / "data")
    assert conftest.data_env() == {"FL_DATA_DIR": str(tmp_path / "data")}
    sim = conftest.local_simulation(home=tmp_path / "home")  # built, not started
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
    two runs build their environments in two different folders, and each folder is gone after
    the script ends, whether the tests pass or fail (before the fix: one fixed folder, left)."""
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
    _stub(bin_dir, "python", f'[ "$2" = "pytest" ] && {fail}\nexit 0\n')
    for tool in ("ruff", "mkdocs", "nginx", "apt-get", "sudo"):  # nothing is installed or built
        _stub(bin_dir, tool, "exit 0\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    codes = [subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True,
                            timeout=60).returncode for _ in range(2)]
    assert codes == ([0, 0] if outcome == "pass" else [1, 1])
    venvs = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert len(venvs) == 2 and venvs[0] != venvs[1], venvs
    assert all(Path(v).parent == tmp_path and not Path(v).exists() for v in venvs), venvs


# ------------------------------------------------------------------ .gitignore
def test_the_readme_venv_is_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in (".venv/bin/python", ".flwr_home/config.toml", "results/compare-1/comparison.md"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path
