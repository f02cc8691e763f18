"""ClientApp: builds the one ``DriftClient`` running the chosen method's ``LocalUpdate`` for this
node's partition or data-path,
wrapped in ``NodeClient`` (faults, the client-state store, warm-up, timing around the method's
fit); on a cohort run's node, a ``CohortClient`` (its virtual clients trained together)."""

from __future__ import annotations

import functools

from flwr.app import Context
from flwr.client.mod import make_ffn
from flwr.clientapp import ClientApp

from fl_app.common.verbosity import quiet_by_default
from fl_app.node.cohort_client import CohortClient
from fl_app.node.drift_client import DriftClient
from fl_app.node.node_client import NodeClient, match_threads_to_cpu_share
from fl_app.registry import resolve
from tasks.models import set_cuda_precision


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
    quiet_by_default()  # the hub's retries at Flower's debug level only (fl_app/common/verbosity.py)
    cfg, method = resolve(context.run_config)
    partition_id, num_partitions = node_partition(context.node_config)
    match_threads_to_cpu_share()  # before the method client builds its model
    set_cuda_precision(cfg["cuda-tf32"])
    if cfg.get("num-virtual-clients"):  # a cohort run (fl_app.common.execution_path): this node hosts virtual clients
        return CohortClient(cfg, context, method.update, partition_id, num_partitions).to_client()
    return NodeClient(DriftClient(method.update, cfg, context, partition_id, num_partitions)).to_client()


@functools.lru_cache(maxsize=8)
def _declared_mods(run_config: frozenset) -> tuple:
    """The client mods of a run's method (``LocalUpdate.client_mods``), resolved once per run
    config (per process), not on every message: resolving validates the whole config."""
    config = dict(run_config)
    _, method = resolve(config)
    return tuple(method.update.client_mods(config))


def method_mods(msg, context: Context, call_next):
    """The Flower mods the run's method declares (``client_mods(run_config)``: DP-FedAvg's
    client-side clipping, say), around this message; none for most methods."""
    mods = _declared_mods(frozenset(context.run_config.items()))
    return make_ffn(call_next, list(mods))(msg, context)


app = ClientApp(client_fn=client_fn, mods=[method_mods])
