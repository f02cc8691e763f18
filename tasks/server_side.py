"""The model and data side of the ServerApp, built from the run config in one call.

``fl_app.server_app`` asks for all of it at once, after its own checks of the config and
before it assembles the server's parts: the server's steps then run on its own layer, with
one trip down to the model and data code instead of one per part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.datasets import input_shape, local_parquet_files, resolve_data_dir
from tasks.models import Classifier, build_model, get_weights, set_cuda_precision


@dataclass(frozen=True)
class ServerSide:
    weights: list[np.ndarray]  # the seeded initial model's (``seed``): a fresh run's starting point
    evaluation_model: Classifier  # the model the central evaluation loads each round's weights into
    data_dir: str  # the data folder in use (``data-dir``, else ``$FL_DATA_DIR``; '' = the hub)


def server_side(cfg: dict) -> ServerSide:
    """Set the CUDA precision (``cuda-tf32``) before any model is built; check that an explicit
    ``data-dir`` holds both splits of the dataset (``DataUnavailableError`` naming the missing
    file; whether the folder exists is the ServerApp's config check, before this); build the
    seeded initial weights, then the evaluation model."""
    set_cuda_precision(cfg["cuda-tf32"])
    data_dir = checked_data_dir(cfg)
    shape = input_shape(cfg["dataset"])
    weights = get_weights(build_model(cfg["model"], shape, seed=cfg["seed"]))
    return ServerSide(weights, build_model(cfg["model"], shape), data_dir)


def checked_data_dir(cfg: dict) -> str:
    """The data folder in use (``data-dir``, else ``$FL_DATA_DIR``; '' = the hub). An explicit
    ``data-dir`` must hold both splits of the dataset (``DataUnavailableError`` naming the
    missing file), never a silent fall back to the hub."""
    data_dir = resolve_data_dir(cfg.get("data-dir", ""))
    if cfg.get("data-dir") and cfg.get("dataset") != "synthetic":
        local_parquet_files(cfg["dataset"], data_dir)  # both splits, or refused
    return data_dir
