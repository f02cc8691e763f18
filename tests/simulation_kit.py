"""Shared by the end-to-end tests that run the app through Flower (`flwr run`, the ServerApp on
Flower's loop) and by those that run README's commands: the methods run end to end and their
configs (``NEEDS``, ``SIMULATED``, ``SUPERNODES``, ``simulated_config``), a tiny MNIST parquet
folder (``tiny_parquet``), and README's tested blocks with the helpers that run them in a copy of
the checkout (``readme_block``, ``shrink``, ``copy_checkout``, ``base_env``, ``processes_with_env``,
``stop_pids``).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fl_app.common import procfs
from tests.conftest import ROOT

# Methods whose client needs something the synthetic/logreg default lacks.
NEEDS = {
    # lenet-bn: the smallest BN model (the BN entries stay on the clients); cnn-bn trains 4-5x slower
    "fedbn": {"dataset": "mnist", "model": "lenet-bn", "batch-size": 64},
    "moon": {"model": "mlp"},
    "fedpgvc": {"model": "mlp"},  # masks the last two Linear layers
    "feddecorr": {"model": "mlp"},  # logreg has no body: its representation term would act on nothing
    # Adaptive server optimisers move each coordinate by about eta per round (m / sqrt(v) ~ +-1),
    # so Flower's default eta = 0.01 leaves logreg at chance after 2 rounds (FedAdam: 0.108):
    # the test's "learns in 2 rounds" needs eta = 0.1, the upper end of Reddi et al.'s grid.
    "fedadam": {"fedopt-eta": 0.1},
    "fedyogi": {"fedopt-eta": 0.1},
    "fedadagrad": {"fedopt-eta": 0.1},
}


# Through Flower's transport and Ray, one method of each kind: plain FedAvg, client state
# (SCAFFOLD's c_i in context.state), client-local BN entries (FedBN), Flower's DP wrappers with
# their ClientApp mod, and Flower's server optimisers. Every method also trains two rounds in
# process (tests/methods/test_every_method.py), at a fraction of the start-up cost.
# The second wave of methods (issue 55), each once through Flower's transport: slow (about 20 s of start-up
# each); in the default run they train two rounds in process (tests/methods/test_every_method.py).
SECOND_WAVE_METHODS = ("fedrs", "fedlc", "feddecorr", "fedacg", "fedexp", "feddc", "fedspeed")
SIMULATED = ("fedavg", "scaffold", "fedbn", "dp-fedavg", "fedyogi", *SECOND_WAVE_METHODS)
SUPERNODES = 4
# The fedavg and scaffold runs are also the resume test's uninterrupted runs, against which it
# makes the same-seed check too (tests/runner/test_reliability.py), and the fedavg run is the one that
# tests/project/test_flower_app.py finds the FAB of `flwr build` installed and run: they go 6 rounds,
# not 2 (a synthetic round after the first takes about 0.3 s; a run's start about 20 s).
ROUNDS = {"fedavg": 6, "scaffold": 6}


def simulated_config(method: str, request) -> dict:
    """The end-to-end run of ``method``: synthetic data and logreg unless ``NEEDS`` says
    otherwise; MNIST runs read the session's MNIST sample (``small_mnist`` in conftest.py)."""
    cfg = {"strategy": method, "dataset": "synthetic", "model": "logreg", "num-server-rounds": ROUNDS.get(method, 2),
           "fraction-fit": 0.5, "learning-rate": 0.05, **NEEDS.get(method, {})}
    if cfg["dataset"] == "mnist":
        cfg["data-dir"] = str(request.getfixturevalue("small_mnist"))
    return cfg


# ------------------------------------------------------------------------------ data
def tiny_parquet(folder, columns=("image", "label"), rows=20):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(buf, format="PNG")
    data = {columns[0]: [{"bytes": buf.getvalue(), "path": None}] * rows, columns[1]: [i % 10 for i in range(rows)]}
    (folder / "mnist").mkdir(parents=True)
    for split in ("train", "test"):
        pq.write_table(pa.table(data), folder / "mnist" / f"{split}.parquet")
    return folder


# ------------------------------------------------------------------------------ README's commands
# Every fenced block of README.md is marked <!-- test: NAME --> with one of these names, and a test
# of tests/project/test_readme.py runs it (tests/project/test_docs.py checks that no other block exists).
TESTED_BLOCKS = ("setup", "run-flwr", "run-runner", "docs")


SHRINK = {
    "run-flwr": {"num-server-rounds=2": "num-server-rounds=1", "num-supernodes=4": "num-supernodes=2"},
    "run-runner": {"--rounds 6": "--rounds 1", "--clients 50": "--clients 2", "--fraction 0.2": "--fraction 1",
                   "--seeds 0 1 2": "--seeds 0"},
}


def readme_block(name: str) -> str:
    """The fenced bash block that follows ``<!-- test: name`` in README.md."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- test: {re.escape(name)}\b[^>]*-->\s*```bash\n(.*?)```", text, re.DOTALL)
    assert match, f"README.md has no bash block marked <!-- test: {name} -->"
    return match.group(1)


def shrink(name: str) -> str:
    block = readme_block(name)
    for old, new in SHRINK.get(name, {}).items():
        assert old in block, f"README's {name} block no longer contains {old!r}"
        block = block.replace(old, new)
    return block


def copy_checkout(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of the checkout."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def processes_with_env(marker: str) -> list[int]:
    """PIDs (of this user) whose environment contains ``marker`` (``NAME=value``)."""
    name, _, value = marker.partition("=")
    return procfs.processes_with_env(name, value)


def stop_pids(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FLWR_HOME") and not k.startswith("FLWR_LOCAL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
