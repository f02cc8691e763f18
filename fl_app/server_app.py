"""ServerApp: validates the run config, builds the chosen method's strategy, records results."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fl_app.config import ConfigError, validate_config
from fl_app.registry import get_method
from fl_app.results.report import read_metrics
from fl_app.server.checkpoint import Checkpoint, load_checkpoint
from fl_app.server.preflight import check_data_dir, loud
from fl_app.server.recording import RecordingStrategy
from fl_app.server.sampling import SeededClientManager
from fl_app.server.startup import ServerStartup
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
    """Centralized evaluation of the global weights on the test split (the validation split held
    out of the training data when ``validation-fraction`` > 0: a tuning run), every round. Its first
    call (round 0, once the nodes are connected) is where the server's start-up completes:
    ``start_up`` holds the steps (``fl_app/server/startup.py``)."""
    device = default_device()
    model = build_model(cfg["model"], input_shape(cfg["dataset"])).to(device)
    test_data: list = []

    def evaluate_fn(server_round: int, arrays: list, config: dict):
        with loud(DataUnavailableError, PartitionError):
            if not test_data:
                return start_up(arrays)
            return evaluate_global(model, test_data, arrays)

    def start_up(arrays: list):
        """Start-up steps 2 and 3 around the initial model's evaluation: ask the nodes for their
        partitions and take the test split, evaluate, then check the partitioning (before
        round 1)."""
        x, y = startup.test_split()
        test_data.extend([x.to(device), y.to(device)])
        result = evaluate_global(model, test_data, arrays)
        startup.ready()
        return result

    return evaluate_fn


def evaluate_global(model, test_data: list, arrays: list) -> tuple[float, dict]:
    """Loss, accuracy, minimum and per-class accuracy of ``arrays`` (the model state first)
    on the server's test split."""
    set_weights(model, arrays[: len(model.state_dict())])
    loss, accuracy, per_class = evaluate(model, *test_data, per_class=True)
    present = per_class[np.isfinite(per_class)]
    min_class = float(present.min()) if present.size else float("nan")
    return loss, {"accuracy": accuracy, "min_class_accuracy": min_class, "per_class_accuracy": per_class.tolist()}


def server_fn(context: Context) -> ServerAppComponents:
    """Config errors are logged as one ``fl-drift:`` ERROR line before anything is written."""
    with loud(ConfigError, DataUnavailableError, PartitionError, KeyError):
        return _server_components(context)


def _server_components(context: Context) -> ServerAppComponents:
    """Validate the run config, set the starting point (fresh or resumed), begin the start-up
    (step 1), build the method's strategy inside the recorder."""
    cfg = validate_config(context.run_config)
    check_data_dir(cfg)
    method = get_method(cfg["strategy"])
    run_dir = Path(cfg["results-dir"]).expanduser() / run_name(cfg)
    checkpoint, weights = starting_point(cfg, run_dir)
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


def starting_point(cfg: dict, run_dir: Path) -> tuple[Checkpoint | None, list]:
    """The run's checkpoint and weights when it resumes one (``resume``), else no checkpoint
    and the seeded initial model's weights."""
    weights = get_weights(build_model(cfg["model"], input_shape(cfg["dataset"]), seed=cfg["seed"]))
    checkpoint = load_checkpoint(run_dir, cfg["model"], [w.shape for w in weights]) if cfg["resume"] else None
    if checkpoint is not None:
        log.info("resuming %s from its checkpoint after round %d", run_dir, checkpoint.round)
        return checkpoint, checkpoint.weights
    return None, weights


app = ServerApp(server_fn=server_fn)
