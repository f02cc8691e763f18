"""ServerApp: validates the run config and resolves its method once (``fl_app.config.resolve``),
assembles fl-drift's ``DriftServer`` (``fl_app/server/server.py``), which runs the method and
records results, then builds the method's strategy and hands it to the server."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fl_app.common.run_files import read_metrics
from fl_app.config import ConfigError, resolve
from fl_app.server.checkpoint import Checkpoint, load_checkpoint
from fl_app.server.cohort import server_execution
from fl_app.server.preflight import check_data_dir, loud
from fl_app.server.sampling import CohortClientManager, SeededClientManager
from fl_app.server.server import DriftServer
from fl_app.server.startup import ServerStartup
from strategies.base import build_strategy
from tasks.datasets import DataUnavailableError, PartitionError, input_shape
from tasks.models import build_model, default_device, get_weights, set_cuda_precision, set_weights
from tasks.train import evaluate

log = logging.getLogger("flwr.fl_drift")


def run_name(cfg: dict) -> str:
    """The configured run name, else <strategy>-<dataset>-<partitioner>-seed<seed>-<time>."""
    if cfg["run-name"]:
        return cfg["run-name"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{cfg['strategy']}-{cfg['dataset']}-{cfg['partitioner']}-seed{cfg['seed']}-{stamp}"


class CentralEvaluation:
    """The method strategy's ``evaluate_fn``: the global weights on the server's test split (the
    validation split held out of the training data when ``validation-fraction`` > 0: a tuning
    run), every round it is asked. The split is handed in once, by the server's start-up
    (``load``), before round 0's evaluation."""

    def __init__(self, cfg: dict):
        self.device = default_device()
        self.model = build_model(cfg["model"], input_shape(cfg["dataset"])).to(self.device)
        self.test_data: list = []

    def load(self, x, y) -> None:
        self.test_data[:] = [x.to(self.device), y.to(self.device)]

    def __call__(self, server_round: int, arrays: list, config: dict):
        if not self.test_data:
            raise RuntimeError("the server's test split is not loaded: the start-up (load) runs before round 0")
        return evaluate_global(self.model, self.test_data, arrays)


def start_up_steps(startup: ServerStartup, evaluation: CentralEvaluation):
    """Start-up steps 2 and 3 (``fl_app/server/startup.py``) around the initial model's
    evaluation, as one call for the server's start-up: ask the nodes for their partitions and
    load the test split, evaluate round 0 (``evaluate_initial``; None on resume), then check
    the partitioning (before round 1). Data and partition errors are one ``fl-drift:`` line."""

    def complete(evaluate_initial) -> None:
        with loud(DataUnavailableError, PartitionError):
            evaluation.load(*startup.test_split())
            if evaluate_initial is not None:
                evaluate_initial()
            startup.ready()

    return complete


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
    """Validate the run config and resolve its method; the server's own inputs: the starting
    point (fresh or resumed), the central evaluation, the execution path; the method's
    strategy, built once (its refusals come before anything is written); last the start-up
    (step 1 begun) and the ``DriftServer`` that runs the strategy."""
    cfg, method = resolve(context.run_config)
    set_cuda_precision(cfg["cuda-tf32"])  # before the server's evaluation model is built
    check_data_dir(cfg)
    run_dir = Path(cfg["results-dir"]).expanduser() / run_name(cfg)
    checkpoint, weights = starting_point(cfg, run_dir)
    evaluation = CentralEvaluation(cfg)
    execution = server_execution(cfg, method, torch.cuda.is_available())
    strategy = build_strategy(method.strategy, cfg, ndarrays_to_parameters(weights), evaluation)
    if execution.cohort:  # the nodes host num-virtual-clients virtual clients (fl_app/server/cohort.py)
        client_manager = CohortClientManager(cfg["seed"], cfg["num-virtual-clients"],
                                             wait_seconds=cfg["wait-for-nodes"])
    else:
        client_manager = SeededClientManager(cfg["seed"], wait_seconds=cfg["wait-for-nodes"])
    if checkpoint is not None:
        client_manager.draws = checkpoint.sampler_draws
    startup = ServerStartup(cfg, client_manager)
    startup.begin()  # start-up step 1: decode the test split while the nodes start
    server = DriftServer(
        client_manager=client_manager, cfg=cfg, run_dir=run_dir, strategy=strategy, method_class=method.strategy,
        start_up=start_up_steps(startup, evaluation), resume_from=checkpoint,
        previous_rows=read_metrics(run_dir) if checkpoint is not None else None, execution=execution,
    )
    done = checkpoint.round if checkpoint is not None else 0
    return ServerAppComponents(
        server=server,
        config=ServerConfig(
            num_rounds=max(cfg["num-server-rounds"] - done, 0),
            round_timeout=cfg["round-timeout"] or None,
        ),
        client_manager=client_manager,  # the server's own (Flower uses the server's)
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
