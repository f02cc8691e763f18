"""Shared test fixtures: the offline data folder and tiny client builders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from flwr.app import RecordDict
from flwr.common import Context

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fl_app.config import validate_config  # noqa: E402
from fl_app.tooling.inprocess import InProcessProxy  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"


def find_data_dir() -> Path:
    """$FL_DATA_DIR when set, else the data folder beside the checkout."""
    configured = os.environ.get("FL_DATA_DIR")
    return Path(configured).expanduser().resolve() if configured else SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Tests (and the simulations they start) keep fl-drift's disk cache to themselves."""
    os.environ["FL_DRIFT_CACHE"] = str(tmp_path_factory.mktemp("fl-drift-cache"))


@pytest.fixture
def shared_data() -> Path:
    """The offline data folder (MNIST and CIFAR-10 parquet): $FL_DATA_DIR, else beside the checkout."""
    found = find_data_dir()
    if not (found / "mnist" / "train.parquet").exists():
        pytest.skip(f"offline data not found at {found} (set FL_DATA_DIR)")
    return found


def fake_context(run_config: dict | None = None) -> Context:
    return Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config or {})


def make_client(client_cls, overrides: dict, x: torch.Tensor, y: torch.Tensor, context: Context | None = None):
    """A client on in-memory data (no dataset is loaded)."""
    cfg = validate_config({"dataset": "synthetic", "model": "logreg", **overrides})
    client = client_cls(cfg, context or fake_context(), partition_id=0, num_partitions=1)
    client._data = (x, y)
    return client


Proxy = InProcessProxy  # hands the FitIns to a real NumPyClient, as Flower's transport would
