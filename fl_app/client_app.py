"""ClientApp: builds the chosen method's NumPyClient for this node's partition or data-path,
wrapped in ``NodeClient`` (faults, state mirror, warm-up, timing around the method's fit)."""

from __future__ import annotations

from flwr.client import ClientApp
from flwr.client.mod import fixedclipping_mod
from flwr.common import Context

from fl_app.config import validate_config
from fl_app.node.node_client import NodeClient, match_threads_to_cpu_share
from fl_app.registry import get_method


def node_partition(node_config: dict) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config; (-1, 0) for a ``data-path`` node.

    A node either gets a partition of the run's named dataset (``partition-id`` and
    ``num-partitions``, as in simulation) or brings its own file (``data-path``, read when
    the client first needs data, so a bad path fails that node's round, not the run)."""
    if node_config.get("data-path"):
        return -1, 0
    try:
        return int(node_config["partition-id"]), int(node_config["num-partitions"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"node config {dict(node_config)!r} must set either data-path=\"<parquet file or image"
            " folder>\" or integer partition-id and num-partitions (flower-supernode --node-config)"
        ) from exc


def client_fn(context: Context):
    cfg = validate_config(context.run_config)
    partition_id, num_partitions = node_partition(context.node_config)
    client_cls = get_method(cfg["strategy"]).client
    match_threads_to_cpu_share()  # before the method client builds its model
    return NodeClient(client_cls(cfg, context, partition_id, num_partitions)).to_client()


def dp_clipping_mod(msg, context: Context, call_next):
    """Flower's fixedclipping_mod, only in runs of dp-fedavg with dp-mode "client"."""
    from strategies.dp_fedavg import uses_client_clipping

    if uses_client_clipping(context.run_config):
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


app = ClientApp(client_fn=client_fn, mods=[dp_clipping_mod])
