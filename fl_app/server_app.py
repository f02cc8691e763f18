"""ServerApp: validates the run config, builds the chosen method's strategy, records results."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fl_app.config import validate_config
from fl_app.recording import RecordingStrategy
from fl_app.registry import get_method
from fl_app.sampling import SeededClientManager
from strategies.base import fedavg_kwargs
from tasks.data import PartitionSpec, input_shape, load_test
from tasks.models import build_model, default_device, get_weights, set_weights
from tasks.train import evaluate


def run_name(cfg: dict) -> str:
    """The configured run name, else <strategy>-<dataset>-<partitioner>-seed<seed>-<time>."""
    if cfg["run-name"]:
        return cfg["run-name"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{cfg['strategy']}-{cfg['dataset']}-{cfg['partitioner']}-seed{cfg['seed']}-{stamp}"


def make_evaluate_fn(cfg: dict, client_manager: SeededClientManager):
    """Centralized evaluation of the global weights on the test split, every round."""
    device = default_device()
    model = build_model(cfg["model"], input_shape(cfg["dataset"])).to(device)
    test_data: list = []

    def evaluate_fn(server_round: int, arrays: list, config: dict):
        if not test_data:
            num_partitions = 1
            if cfg["dataset"] == "synthetic":  # its test split pools every device's share
                client_manager.wait_for(cfg["min-available-clients"])
                client_manager.learn_partitions()
                num_partitions = client_manager.num_partitions or client_manager.num_available()
            spec = PartitionSpec.from_config(cfg, num_partitions)
            x, y = load_test(spec)
            test_data.extend([x.to(device), y.to(device)])
        set_weights(model, arrays[: len(model.state_dict())])
        loss, accuracy = evaluate(model, *test_data)
        return loss, {"accuracy": accuracy}

    return evaluate_fn


def server_fn(context: Context) -> ServerAppComponents:
    cfg = validate_config(context.run_config)
    method = get_method(cfg["strategy"])
    model = build_model(cfg["model"], input_shape(cfg["dataset"]), seed=cfg["seed"])
    initial = ndarrays_to_parameters(get_weights(model))
    client_manager = SeededClientManager(cfg["seed"])
    inner = method.strategy.from_config(
        cfg, **fedavg_kwargs(cfg, initial, make_evaluate_fn(cfg, client_manager))
    )
    run_dir = Path(cfg["results-dir"]).expanduser() / run_name(cfg)
    strategy = RecordingStrategy(inner, cfg, run_dir, cfg["num-server-rounds"])
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(num_rounds=cfg["num-server-rounds"]),
        client_manager=client_manager,
    )


app = ServerApp(server_fn=server_fn)
