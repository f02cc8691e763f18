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
import re
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
                              "tests/runner/test_reliability.py::test_raising_and_nan_clients_do_not_corrupt_the_run",
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
    two runs build their environments in folders of their own, and each folder is gone after
    the script ends, whether the tests pass or fail (before the fix: one fixed folder, left).
    When the suite passes, a second environment gets the lowest flwr pyproject.toml allows
    (issue 53) and runs the tests of Flower's interfaces, files that exist; the first gets the
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


# ------------------------------------------------------------------ library noise
# Lines a run with tracking = "mlflow" and partitioner = "shard" printed before the fix.
LIBRARY_NOISE = [
    "/work/venv/lib/python3.11/site-packages/pyarrow/compute.py:231: FutureWarning: Specifying null_placement in "
    "SortOptions is deprecated as of 25.0.0. Specify null_placement per sort_key instead.",
    "  return options_class(*args, **kwargs)",
    "/work/venv/lib/python3.11/site-packages/mlflow/store/tracking/sqlalchemy_store.py:327: SADeprecationWarning: "
    "The ``noload`` loader strategy is deprecated and will be removed in a future release.",
    "  sqlalchemy.orm.configure_mappers()",
    "2026/11/25 16:36:47 INFO mlflow.store.db.utils: Creating initial MLflow database tables...",
    "2026/11/25 16:36:47 INFO mlflow.store.db.utils: Updating database tables",
    "INFO  [alembic.runtime.migration] Context impl SQLiteImpl.",
]


def test_library_warnings_and_mlflow_lines_are_noise():
    from runner.quiet import is_noise

    for line in LIBRARY_NOISE:
        assert is_noise(line), line
    # what stays: fl-drift's own warnings (its files are not in site-packages), a library's
    # other warnings, fl-drift's lines, the MLflow run fl-drift names, errors
    assert not is_noise("/work/main/fl_app/server/recording.py:10: FutureWarning: ours")
    assert not is_noise("/x/site-packages/torch/cuda/__init__.py:5: UserWarning: CUDA initialization failed")
    assert not is_noise("\x1b[92mINFO \x1b[0m:      mlflow: run fc6835 in sqlite:////tmp/runs/mlflow.db")
    assert not is_noise("2026/11/25 16:36:47 ERROR mlflow.store: the store is locked")


def test_the_runner_hides_library_warnings_unless_verbose(monkeypatch):
    """``quiet_libraries``: a library's FutureWarning is ignored, fl-drift's is not; with
    ``--verbose`` nothing is hidden. run_simulation.main applies it before anything else."""
    import warnings

    import run_simulation
    from runner.quiet import quiet_libraries

    def shown(verbose: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_libraries(verbose)
            for module in ("pyarrow.compute", "mlflow.store.tracking.sqlalchemy_store", "fl_app.server.recording"):
                warnings.warn_explicit("w", FutureWarning, "f.py", 1, module=module)
        return [str(w.filename) + ":" + str(w.message) for w in caught]

    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    assert len(shown(verbose=True)) == 3 and "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ
    assert len(shown(verbose=False)) == 1  # fl-drift's own
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"

    called = []
    monkeypatch.setattr(run_simulation, "quiet_libraries", called.append)
    assert run_simulation.main(["--list", "models"]) == 0
    assert run_simulation.main(["--list", "models", "--verbose"]) == 0
    assert called == [False, True]


def test_the_shard_split_future_warning_is_hidden():
    """The warning the issue saw with ``--check``: flwr-datasets' shard partitioner sorts with
    pyarrow options deprecated in pyarrow 25; hidden by ``quiet_libraries``."""
    import warnings

    from datasets import Dataset
    from flwr_datasets.partitioner import ShardPartitioner

    from runner.quiet import quiet_libraries

    def warned(quiet: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if quiet:
                quiet_libraries(False)
            partitioner = ShardPartitioner(num_partitions=2, partition_by="label", num_shards_per_partition=2)
            partitioner.dataset = Dataset.from_dict({"label": [i % 3 for i in range(40)]})
            partitioner.load_partition(0)
        return [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]

    if not warned(quiet=False):
        pytest.skip("this pyarrow/datasets pair warns no more")
    assert warned(quiet=True) == []


def test_third_party_warnings_that_say_nothing_are_hidden_and_the_others_are_not(monkeypatch):
    """Issue 70: Ray's accelerator FutureWarning (every run) and flwr-datasets' Dirichlet redraw
    UserWarning (``--check``, a run's split) reached the user. ``UNHELPFUL_WARNINGS`` are ignored
    in the runner's process (``quiet_libraries``) and the apps' (``quiet_by_default``) and hidden
    in a streamed run output; another UserWarning of the same library, a torch UserWarning and
    fl-drift's own warnings still show, and ``--verbose`` shows them all."""
    import warnings

    import numpy as np
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    from fl_app.common.verbosity import quiet_by_default
    from runner.quiet import is_noise, quiet_libraries

    for name, value in (("HF_HUB_VERBOSITY", "error"), ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")):
        monkeypatch.setenv(name, value)  # as the runner sets them: this test's calls change no variable

    def shown(quiet) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet()
            warnings.warn_explicit("Tip: In future versions of Ray, Ray will no longer override", FutureWarning,
                                   "worker.py", 1, module="ray._private.worker")
            warnings.warn_explicit("other", UserWarning, "d.py", 1, module="flwr_datasets.partitioner.x")
            warnings.warn_explicit("CUDA initialization failed", UserWarning, "c.py", 1, module="torch.cuda")
            warnings.warn_explicit("ours", UserWarning, "r.py", 1, module="fl_app.server.recording")
            # the real partitioner: 30 examples into 6 partitions of at least 4 at alpha 0.05 redraws
            partitioner = DirichletPartitioner(num_partitions=6, partition_by="label", alpha=0.05,
                                               min_partition_size=4, seed=0)
            partitioner.dataset = Dataset.from_dict({"label": list(np.arange(30) % 3)})
            try:
                partitioner.load_partition(0)
            except ValueError:
                pass  # 10 failed draws: fl-drift's own error says it
        return [str(w.message)[:20] for w in caught]

    everything = shown(lambda: quiet_libraries(True))  # --verbose: nothing hidden
    assert "Tip: In future versi" in everything and "The specified min_pa" in everything
    kept = ["other", "CUDA initialization ", "ours"]
    assert shown(lambda: quiet_libraries(False)) == kept
    assert shown(quiet_by_default) == kept

    ray = ("/v/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of"
           " Ray, Ray will no longer override accelerator visible devices env var if num_gpus=0")
    dirichlet = ("    /v/lib/python3.11/site-packages/flwr_datasets/partitioner/dirichlet_partitioner.py:301: UserWarning:"
                 " The specified min_partition_size (10) was not satisfied for alpha ([np.float64(0.05)])")
    assert is_noise(ray) and is_noise(dirichlet)
    assert not is_noise("/v/site-packages/flwr_datasets/partitioner/x.py:3: UserWarning: other")
