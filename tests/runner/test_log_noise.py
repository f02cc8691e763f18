"""The runner's output: Flower's History printout hidden line by line, colour codes only on a
terminal, and the libraries' warnings and log lines hidden unless ``--verbose``, while
fl-drift's own warnings and errors still show (runner/quiet.py)."""

from __future__ import annotations

import io
import os

import pytest

from runner.quiet import for_output, is_noise

INFO = "\x1b[92mINFO \x1b[0m:      "
# The tail of a real `flwr run --stream` output (MNIST, 3 rounds), as the runner received it.
HISTORY_TAIL = [
    "\t 'min_class_accuracy': [(0, 0.0),",
    "\t                        (1, 0.045174537987679675),",
    "\t                        (2, 0.21765913757700206),",
    "\t                        (3, 0.319755600814664)]}",
    "\t{'accuracy': [(0, 0.1135), (1, 0.69),",
    "\t\tround 2: 0.293863037109375",
    "\t              (3, nan)]}",
]


def test_every_line_of_the_history_printout_is_noise():
    for line in HISTORY_TAIL:
        assert is_noise(INFO + line), line


def test_progress_and_errors_are_not_noise():
    assert not is_noise(INFO + "round 1/3: test accuracy 0.6900, test loss 1.7216, clients 5, failures 0, 219.6s")
    assert not is_noise(INFO + "initial model: test accuracy 0.1135, loss 2.3026")
    assert not is_noise("\x1b[91mERROR \x1b[0m:     (0, 1.5)")  # an ERROR line is always shown


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_codes_only_on_a_terminal():
    line = INFO + "round 1/3: test accuracy 0.6900"
    assert for_output(line, io.StringIO()) == "INFO :      round 1/3: test accuracy 0.6900"
    assert for_output(line, _Terminal()) == line
    assert "\x1b" not in for_output(line, object())  # a stream that cannot tell: plain


# ------------------------------------------------------------------ library noise
# Lines a run with tracking = "mlflow" and partitioner = "shard" prints from its libraries.
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
    """The warning ``--check`` printed: flwr-datasets' shard partitioner sorts with
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
    """Ray's accelerator FutureWarning (every run) and flwr-datasets' Dirichlet redraw
    UserWarning (``--check``, a run's split) say nothing to the user. ``UNHELPFUL_WARNINGS`` are ignored
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
