"""ServerApp: validates the run config and resolves its method once (``fl_app.registry.resolve``),
assembles fl-drift's ``DriftServer`` (``fl_app/server/server.py``), which runs the method and
records results, then builds the method's strategy and hands it to the server."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context
from flwr.common import ndarrays_to_parameters  # the legacy Strategy's Parameters: no newer home
from flwr.server import ServerAppComponents, ServerConfig  # the legacy server_fn's parts: likewise
from flwr.serverapp import ServerApp

from fl_app.common.execution_path import server_execution
from fl_app.common.run_files import SUMMARY_FILE, read_metrics
from fl_app.common.verbosity import quiet_by_default
from fl_app.config import ConfigError
from fl_app.node.client_state import check_state_files
from fl_app.registry import resolve
from fl_app.server.checkpoint import CHECKPOINT, Checkpoint, load_checkpoint
from fl_app.server.data_source import this_superlink
from fl_app.server.preflight import check_data_folder, loud
from fl_app.server.sampling import CohortClientManager, SeededClientManager
from fl_app.server.server import DriftServer
from fl_app.server.startup import ServerStartup
from strategies.base import build_strategy
from tasks.datasets import DataUnavailableError, PartitionError
from tasks.models import default_device, set_weights
from tasks.server_side import server_side
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
    run), every round it is asked, in ``model`` (built by ``tasks.server_side``). The split is
    handed in once, by the server's start-up (``load``), before round 0's evaluation."""

    def __init__(self, model):
        self.device = default_device()
        self.model = model.to(self.device)
        self.test_data: list = []

    def load(self, x, y) -> None:
        self.test_data[:] = [x.to(self.device), y.to(self.device)]

    def __call__(self, server_round: int, arrays: list, config: dict):
        if not self.test_data:
            raise RuntimeError("the server's test split is not loaded: the start-up (load) runs before round 0")
        return evaluate_global(self.model, self.test_data, arrays)


def evaluate_global(model, test_data: list, arrays: list) -> tuple[float, dict]:
    """Loss, accuracy, minimum and per-class accuracy of ``arrays`` (the model state first)
    on the server's test split."""
    set_weights(model, arrays[: len(model.state_dict())])
    loss, accuracy, per_class = evaluate(model, *test_data, per_class=True)
    present = per_class[np.isfinite(per_class)]
    min_class = float(present.min()) if present.size else float("nan")
    return loss, {"accuracy": accuracy, "min_class_accuracy": min_class, "per_class_accuracy": per_class.tolist()}


def server_fn(context: Context) -> ServerAppComponents:
    """Config errors are logged as one ``fl-drift:`` ERROR line before anything is written;
    Flower's traceback of a reported error and the hub's retries are printed only at Flower's
    debug level (``fl_app/common/verbosity.py``)."""
    quiet_by_default()
    this_superlink()  # noted now, so that the next run knows this SuperLink served an earlier one
    with loud(ConfigError, DataUnavailableError, PartitionError, KeyError):
        return _server_components(context)


def _server_components(context: Context) -> ServerAppComponents:
    """Assemble the run in three stretches, each on one layer, so that the run config goes
    down to the lower layers twice instead of once per part:

    1. the run config validated and its method resolved, the data folder checked, the run
       folder named: the server's own checks, which need nothing built;
    2. one call to the model and data side (``tasks.server_side``: CUDA precision, the data
       files, the seeded initial weights, the evaluation model), then what needs it: the
       starting point (fresh or resumed), the central evaluation, the execution path;
    3. the method's strategy, built once: its refusals come before anything is written, and
       the ``DriftServer`` that runs it writes the run folder, so it is built last, with the
       client manager and the start-up (step 1 begun) that it is given.

    The config refusals keep their order: config, data folder, data files, checkpoint,
    execution path, the method's own."""
    cfg, method = resolve(context.run_config)
    check_data_folder(cfg)
    run_dir = Path(cfg["results-dir"]).expanduser() / run_name(cfg)
    side = server_side(cfg)
    checkpoint, weights = starting_point(cfg, run_dir, side.weights)
    evaluation = CentralEvaluation(side.evaluation_model)
    execution = server_execution(cfg, method, torch.cuda.is_available())
    strategy = build_strategy(method.strategy, cfg, ndarrays_to_parameters(weights), evaluation)
    if execution.cohort:  # the nodes host num-virtual-clients virtual clients (fl_app/server/cohort_routing.py)
        client_manager = CohortClientManager(cfg["seed"], cfg["num-virtual-clients"],
                                             wait_seconds=cfg["wait-for-nodes"])
    else:
        client_manager = SeededClientManager(cfg["seed"], wait_seconds=cfg["wait-for-nodes"])
    if checkpoint is not None:
        client_manager.draws = checkpoint.sampler_draws
    startup = ServerStartup(cfg, client_manager, side.data_dir)
    startup.begin()  # start-up step 1: decode the test split while the nodes start
    server = DriftServer(
        client_manager=client_manager, cfg=cfg, run_dir=run_dir, strategy=strategy, method_class=method.strategy,
        unbatched=method.update.unbatched, startup=startup, evaluation=evaluation, resume_from=checkpoint,
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


def starting_point(cfg: dict, run_dir: Path, initial: list) -> tuple[Checkpoint | None, list]:
    """The run's checkpoint and weights when it resumes one (``resume``; the checkpoint must
    match the shapes of the ``initial`` weights, and every client-state file it continues must be
    readable: ``check_state_files``), else no checkpoint and the ``initial``
    weights (the seeded initial model's). A resume of a finished run that kept no checkpoint is
    refused (``ConfigError``): starting it over would overwrite its results."""
    checkpoint = load_checkpoint(run_dir, cfg["model"], [w.shape for w in initial]) if cfg["resume"] else None
    if checkpoint is not None:
        check_state_files(run_dir, run_dir / CHECKPOINT, checkpoint.round)  # the clients' state it continues
        log.info("resuming %s from its checkpoint after round %d", run_dir, checkpoint.round)
        return checkpoint, checkpoint.weights
    if cfg["resume"] and (run_dir / SUMMARY_FILE).exists():  # starting over would overwrite a kept result
        raise ConfigError(f"run-config key 'resume' = true is invalid: {run_dir} holds a finished run ({SUMMARY_FILE})"
                          f" and no {CHECKPOINT} (keep-checkpoint = false or checkpoint-every = 0): it cannot be"
                          " continued or extended; give this run another run-name")
    return None, initial


app = ServerApp(server_fn=server_fn)
