"""ClientApp: builds the chosen method's NumPyClient for this node's partition."""

from __future__ import annotations

from flwr.client import ClientApp
from flwr.common import Context

from fl_app.config import validate_config
from fl_app.registry import get_method


def client_fn(context: Context):
    cfg = validate_config(context.run_config)
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    client_cls = get_method(cfg["strategy"]).client
    return client_cls(cfg, context, partition_id, num_partitions).to_client()


app = ClientApp(client_fn=client_fn)
