"""The cohort wire codec: K virtual clients' fit instructions as ONE ``FitIns`` for their cohort
node, and the node's one reply as K ``FitRes`` again (spec: the server routing and the cohort
node share these names; ``fl_app.server`` imports them, this module imports nothing of ours).

Guarantees:

- ``split_instructions(bundle_instructions(items))`` gives every virtual client exactly the arrays
  and config it would have received on its own (the arrays as Flower deserialises them; the
  config's values with their types: ``1``, ``1.0`` and ``True`` are different values here).
- ``split_replies`` gives every virtual client exactly the ``FitRes`` its own node would have
  sent: its arrays are its slice of the bundle's serialised tensors (bytes, never deserialised
  and serialised again), its ``num_examples`` and metrics as the node returned them.
- The arrays travel once when all K ``Parameters`` are byte-identical (the usual case: every
  client gets the same global model); otherwise they are concatenated with per-client counts.
- Config and metric values are Flower Scalars (bool, bytes, float, int, str). The config keeps
  what all K share as plain keys and carries the per-client differences as JSON; a ``bytes``
  value that differs between clients, or a ``bytes`` metric, is refused (one-line ValueError
  naming the key): JSON cannot carry bytes and no method sends them per client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.common import Code, FitIns, FitRes, Parameters, Status

PARTITIONS = "cohort-partitions"  # the bundle's virtual clients (partition ids), comma-separated, in order
COUNTS = "cohort-array-counts"  # per-client array counts, comma-separated (instructions: only when arrays differ)
CONFIGS = "cohort-configs"  # JSON list: per client, the config entries not shared by all K
REPLIES = "cohort-replies"  # JSON list: per client, {"num_examples", "metrics"} or {"failed": reason}
COHORT_KEYS = (PARTITIONS, COUNTS, CONFIGS, REPLIES)
# Not a codec key: in every virtual client's own config (fit and evaluate), N, the partitions of
# the run's data, which the server adds and the cohort node builds the client of partition p of N with.
NUM_PARTITIONS = "num-partitions"

_JSON_TYPES = (bool, int, float, str)


def _scalar(key: str, value, what: str):
    """``value`` as a JSON-able Flower Scalar (a numpy scalar as its Python value), else ValueError."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        raise ValueError(f"cohort bundle: {what} {key!r} is bytes, which a cohort bundle cannot carry per "
                         "client (send it to every client alike, or run per-client)")
    if not isinstance(value, _JSON_TYPES):
        raise ValueError(f"cohort bundle: {what} {key!r} = {value!r} is a {type(value).__name__}, "
                         "not a Flower Scalar (bool, bytes, float, int, str)")
    return value


def _same(a, b) -> bool:
    """Equal values of the same type (``1 == 1.0 == True`` in Python, but not on the wire); NaN
    equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def _partition_list(value) -> list[int]:
    try:
        return [int(p) for p in str(value).split(",")] if str(value) else []
    except ValueError as exc:
        raise ValueError(f"cohort bundle: {PARTITIONS} = {value!r} is not comma-separated partition ids") from exc


def _join(values: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in values)


def bundle_instructions(items: Sequence[tuple[int, FitIns]]) -> FitIns:
    """Server side: K virtual clients' ``FitIns`` as ONE ``FitIns`` for their cohort node.

    The arrays travel once when all K ``Parameters`` are byte-identical, else concatenated with
    per-client counts (``COUNTS``); the config keeps what all K share (same key, same type, same
    value) and carries the rest per client in ``CONFIGS`` (JSON); ``PARTITIONS`` names the
    clients in order."""
    if not items:
        raise ValueError("cohort bundle: no virtual clients to bundle (items is empty)")
    pids = [int(p) for p, _ in items]
    if len(set(pids)) != len(pids):
        raise ValueError(f"cohort bundle: partition ids {pids} repeat; each virtual client comes once")
    types = {ins.parameters.tensor_type for _, ins in items}
    if len(types) != 1:
        raise ValueError(f"cohort bundle: the clients' parameters have tensor types {sorted(types)}; one expected")
    for _, ins in items:
        for key in ins.config:
            if key in COHORT_KEYS:
                raise ValueError(f"cohort bundle: config key {key!r} is reserved for the cohort codec")
    first = items[0][1]
    shared: dict = {}
    for key, value in first.config.items():
        if all(key in ins.config and _same(ins.config[key], value) for _, ins in items[1:]):
            shared[key] = value
    per_client = [{k: _scalar(k, v, "config key") for k, v in ins.config.items() if k not in shared}
                  for _, ins in items]
    config = dict(shared)
    config[PARTITIONS] = _join(pids)
    if any(per_client):
        config[CONFIGS] = json.dumps(per_client)
    tensors = first.parameters.tensors
    if all(ins.parameters.tensors == tensors for _, ins in items[1:]):
        bundled = list(tensors)
    else:
        bundled = [t for _, ins in items for t in ins.parameters.tensors]
        config[COUNTS] = _join(len(ins.parameters.tensors) for _, ins in items)
    return FitIns(parameters=Parameters(tensors=bundled, tensor_type=first.parameters.tensor_type), config=config)


def split_instructions(parameters: list[np.ndarray], config: dict) -> list[tuple[int, list[np.ndarray], dict]]:
    """Node side (``NumPyClient.fit``'s arguments): per virtual client, in bundle order, (partition
    id, its arrays, its config with the cohort keys removed) -- exactly what it would have
    received on its own. Arrays sent once are shared by the clients' lists (not copied): a
    client must not change them in place."""
    if PARTITIONS not in config:
        raise ValueError(f"cohort bundle: the config has no {PARTITIONS!r} key; this is not a cohort bundle")
    pids = _partition_list(config[PARTITIONS])
    if not pids:
        raise ValueError(f"cohort bundle: {PARTITIONS} names no virtual client")
    shared = {k: v for k, v in config.items() if k not in COHORT_KEYS}
    per_client = json.loads(config[CONFIGS]) if CONFIGS in config else [{} for _ in pids]
    if len(per_client) != len(pids):
        raise ValueError(f"cohort bundle: {CONFIGS} has {len(per_client)} entries for {len(pids)} clients")
    if COUNTS in config:
        counts = _partition_list(config[COUNTS])
        if len(counts) != len(pids) or sum(counts) != len(parameters):
            raise ValueError(f"cohort bundle: {COUNTS} = {config[COUNTS]!r} does not cut {len(parameters)} "
                             f"arrays into {len(pids)} clients")
        starts = np.cumsum([0, *counts])
        arrays = [list(parameters[starts[i]:starts[i + 1]]) for i in range(len(pids))]
    else:
        arrays = [list(parameters) for _ in pids]
    return [(p, arrays[i], {**shared, **per_client[i]}) for i, p in enumerate(pids)]


def bundle_replies(replies: Sequence[tuple[int, list[np.ndarray], int, dict]],
                   failed: Mapping[int, str]) -> tuple[list[np.ndarray], int, dict]:
    """Node side: the cohort's ``NumPyClient.fit`` return value.

    Every successful client's arrays concatenated (in ``replies`` order), the total number of
    examples, and metrics carrying ``PARTITIONS`` (the successful clients in order, then the
    failed ones), ``COUNTS`` (per-client array counts, 0 for a failed client) and ``REPLIES``
    (JSON: per client its num_examples and metrics, or the reason it failed)."""
    pids = [int(p) for p, *_ in replies] + [int(p) for p in failed]
    if len(set(pids)) != len(pids):
        raise ValueError(f"cohort reply: partition ids {pids} repeat; each virtual client replies once")
    arrays: list[np.ndarray] = []
    records: list[dict] = []
    counts: list[int] = []
    for _, reply, num_examples, metrics in replies:
        arrays.extend(reply)
        counts.append(len(reply))
        records.append({"num_examples": int(num_examples),
                        "metrics": {k: _scalar(k, v, "metric") for k, v in metrics.items()}})
    for reason in failed.values():
        counts.append(0)
        records.append({"failed": str(reason)})
    total = sum(int(n) for _, _, n, _ in replies)
    return arrays, total, {PARTITIONS: _join(pids), COUNTS: _join(counts), REPLIES: json.dumps(records)}


def split_replies(res: FitRes) -> list[tuple[int, FitRes | str]]:
    """Server side: per virtual client, in the reply's order, its own ``FitRes`` (status OK, its
    slice of ``res.parameters.tensors`` -- bytes sliced, never deserialised --, its num_examples
    and metrics) or the reason it failed. A bundle whose own status is not OK fails every client
    it names with that status's message."""
    metrics = res.metrics
    if PARTITIONS not in metrics:
        raise ValueError(f"cohort reply: the metrics have no {PARTITIONS!r} key; this is not a cohort reply")
    pids = _partition_list(metrics[PARTITIONS])
    if res.status.code != Code.OK:
        return [(p, f"cohort node failed: {res.status.message}") for p in pids]
    counts = _partition_list(metrics.get(COUNTS, ""))
    records = json.loads(metrics.get(REPLIES, "[]"))
    tensors = res.parameters.tensors
    if len(counts) != len(pids) or len(records) != len(pids) or sum(counts) != len(tensors):
        raise ValueError(f"cohort reply: {len(pids)} clients, {COUNTS} = {metrics.get(COUNTS)!r} and "
                         f"{len(records)} records do not cut {len(tensors)} tensors")
    out: list[tuple[int, FitRes | str]] = []
    start = 0
    for p, n, record in zip(pids, counts, records):
        if "failed" in record:
            out.append((p, record["failed"]))
            continue
        out.append((p, FitRes(status=Status(code=Code.OK, message="Success"),
                              parameters=Parameters(tensors=list(tensors[start:start + n]),
                                                    tensor_type=res.parameters.tensor_type),
                              num_examples=int(record["num_examples"]), metrics=dict(record["metrics"]))))
        start += n
    return out
