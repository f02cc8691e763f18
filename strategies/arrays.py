"""Array helpers shared by several strategies: N (``total_clients``), aggregation, checkpointed
state, and the arrays that travel after the model's, by the names ``protocol.traffic`` gives them
(``send_with_extras``: SCAFFOLD's c, FedSMOO's s; the replies are split by
``strategies.declared.DeclaredStrategy.split``)."""

from __future__ import annotations

import numpy as np
from flwr.common import FitIns, Parameters, ndarrays_to_parameters, parameters_to_ndarrays

from protocol.traffic import append_groups


def total_clients(client_manager) -> int | None:
    """N, the number of clients in the federation: the one definition the strategies, the run's
    summary and data fingerprint (``fl_app.server.recording``) and the start-up's partition check
    (``fl_app.server.startup``) read.

    The partition count the client manager learnt from the nodes (``num_partitions``: a
    ``SeededClientManager`` once it asked them, a ``CohortClientManager``'s virtual clients from
    the start), else the nodes it has connected (``num_available()``: nodes that bring their own
    ``data-path`` report no partition count); None without a client manager or without any node,
    where a reader falls back on what it has (a strategy: the clients that replied)."""
    if client_manager is None:
        return None
    return int(getattr(client_manager, "num_partitions", None) or client_manager.num_available()) or None


def restored_like(saved: list, current: list[np.ndarray], dtype, what: str) -> list[np.ndarray]:
    """Checkpointed server state as ``dtype`` arrays, refused unless shaped like ``current``."""
    arrays = [np.asarray(a, dtype=dtype) for a in saved]
    if [a.shape for a in arrays] != [a.shape for a in current]:
        raise ValueError(f"checkpointed {what} does not match this model")
    return arrays


def cast_like(value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Back to the dtype of ``ref`` (integer buffers such as BN's num_batches_tracked round)."""
    if np.issubdtype(ref.dtype, np.integer):
        return np.rint(value).astype(ref.dtype)
    return np.asarray(value, dtype=ref.dtype)


def send_with_extras(instructions: list, parameters: Parameters, groups: dict[str, list[np.ndarray]],
                     order: tuple[str, ...], num_state: int) -> list:
    """The fit instructions with the named ``groups`` appended after the model state arrays, in
    the method's declared ``order`` (``protocol.traffic``: a ``Traffic.down``)."""
    if not instructions:
        return instructions
    weights = parameters_to_ndarrays(parameters)
    if len(weights) != num_state:
        raise ValueError(f"global model has {len(weights)} arrays, expected {num_state}")
    sent = ndarrays_to_parameters(append_groups(weights, groups, order))
    return [(client, FitIns(sent, dict(ins.config))) for client, ins in instructions]
