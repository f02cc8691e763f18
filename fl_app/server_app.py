"""ServerApp: validates the run config, builds the chosen method's strategy, records results."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fl_app.checkpoint import load_checkpoint
from fl_app.config import ConfigError, validate_config
from fl_app.preflight import check_data_dir, loud
from fl_app.recording import RecordingStrategy
from fl_app.registry import get_method
from fl_app.report import read_metrics
from fl_app.sampling import SeededClientManager
from fl_app.startup import ServerStartup
from strategies.base import fedavg_kwargs
from tasks.datasets import DataUnavailableError, PartitionError, input_shape
from tasks.models import build_model, default_device, get_weights, set_weights
from tasks.train import evaluate

log = logging.getLogger("flwr.fl_drift")


def run_name(cfg: dict) -> str:
    """The configured run name, else <strategy>-<dataset>-<partitioner>-seed<seed>-<time>."""
    if cfg["run-name"]:
        return cfg["run-name"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{cfg['strategy']}-{cfg['dataset']}-{cfg['partitioner']}-seed{cfg['seed']}-{stamp}"


def make_evaluate_fn(cfg: dict, startup: ServerStartup):
    """Centralized evaluation of the global weights on the test split, every round. Round 0's
    evaluation is where the server's start-up completes (``fl_app/startup.py``)."""
    device = default_device()
    model = build_model(cfg["model"], input_shape(cfg["dataset"])).to(device)
    test_data: list = []

    def evaluate_fn(server_round: int, arrays: list, config: dict):
        with loud(DataUnavailableError, PartitionError):
            return _evaluate(arrays)

    def _evaluate(arrays: list):
        first = not test_data
        if first:  # start-up step 2: ask the nodes for their partitions, take the test split
            x, y = startup.test_split()
            test_data.extend([x.to(device), y.to(device)])
        set_weights(model, arrays[: len(model.state_dict())])
        loss, accuracy, per_class = evaluate(model, *test_data, per_class=True)
        if first:  # start-up step 3: the partitioning is checked before round 1
            startup.ready()
        present = per_class[np.isfinite(per_class)]
        min_class = float(present.min()) if present.size else float("nan")
        return loss, {"accuracy": accuracy, "min_class_accuracy": min_class, "per_class_accuracy": per_class.tolist()}

    return evaluate_fn


def server_fn(context: Context) -> ServerAppComponents:
    """Config errors are logged as one ``fl-drift:`` ERROR line before anything is written."""
    with loud(ConfigError, DataUnavailableError, PartitionError, KeyError):
        return _server_components(context)


def _server_components(context: Context) -> ServerAppComponents:
    cfg = validate_config(context.run_config)
    check_data_dir(cfg)
    method = get_method(cfg["strategy"])
    run_dir = Path(cfg["results-dir"]).expanduser() / run_name(cfg)
    weights = get_weights(build_model(cfg["model"], input_shape(cfg["dataset"]), seed=cfg["seed"]))
    checkpoint = load_checkpoint(run_dir, cfg["model"], [w.shape for w in weights]) if cfg["resume"] else None
    if checkpoint is not None:
        log.info("resuming %s from its checkpoint after round %d", run_dir, checkpoint.round)
        weights = checkpoint.weights
    client_manager = SeededClientManager(cfg["seed"], wait_seconds=cfg["wait-for-nodes"])
    if checkpoint is not None:
        client_manager.draws = checkpoint.sampler_draws
    startup = ServerStartup(cfg, client_manager)
    startup.begin()  # start-up step 1: decode the test split while the nodes start
    inner = method.strategy.from_config(
        cfg, **fedavg_kwargs(cfg, ndarrays_to_parameters(weights), make_evaluate_fn(cfg, startup))
    )
    strategy = RecordingStrategy(
        inner, cfg, run_dir, cfg["num-server-rounds"], resume_from=checkpoint,
        previous_rows=read_metrics(run_dir) if checkpoint is not None else None,
    )
    done = checkpoint.round if checkpoint is not None else 0
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(
            num_rounds=max(cfg["num-server-rounds"] - done, 0),
            round_timeout=cfg["round-timeout"] or None,
        ),
        client_manager=client_manager,
    )


app = ServerApp(server_fn=server_fn)
