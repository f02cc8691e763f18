"""The cohort wire codec: K virtual clients' fit instructions as ONE ``FitIns`` for their cohort
node, and the node's one reply as K ``FitRes`` again (spec: the server routing and the cohort
node share these names; ``fl_app.server`` imports them; of ours it imports only ``protocol``).

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

Summed replies (``SUM`` in the bundle's config, set by the server for a method whose server
declares ``REPLY_SUMS``): the node replies ONE set of arrays for all its clients instead of K
(``sum_replies`` / ``split_summed_reply``):

- the first ``mean`` arrays: the n_k-weighted mean sum_k n_k w_k / sum_k n_k (float64 sums,
  each array back in its reply dtype, an integer array rounded), ``num_examples`` = sum_k n_k,
  the metric ``SUMMED_CLIENTS`` = K. One exception to "the same model as full replies": an
  integer buffer (BatchNorm's ``num_batches_tracked``, which no computation reads while BN's
  momentum is set). Flower's in-place FedAvg multiplies each reply's integer array by its weight
  cast to an integer, 0 for every reply of several, so several replies give 0 whatever they
  hold; from two or more nodes that holds for sums too, but one node's sum is one reply, whose
  weight 1 keeps its rounded mean, where its clients' own replies would have given 0;
- the arrays after them (the method's ``up`` groups, c's delta c_i say): their plain sums;
- then, for the server's drift columns (``fl_app.server.drift.drift_from_sums``), over the
  entries ``head`` and ``body`` name: sum_k n_k Delta_k and sum_k Delta_k / ||Delta_k||
  (float64, Delta_k = w_k - w_t, clients with Delta_k = 0 left out of the second), and per
  client ||Delta_k||^2 over the head and over the body in its record. In float64 so that the
  columns are those of full replies to float64 rounding (float32 sums moved a one-client
  cohort's diversity from 1 to 1 - 6e-9, below Jensen's bound).

A summed reply carries the mean (one model) and the two drift sums (two float64 copies of the
trainable entries: four float32 models' bytes), so it is smaller than full replies from six
clients a node up: with 30 clients a round on one node (a GPU run), 5 models' bytes instead of 30.

Each client's reply is checked before it is summed (``protocol.layout.reply_problem``, the
server's own rule): a rejected client is named with its reason and left out of every sum, as
the server leaves out a rejected reply. Every client keeps its own record (num_examples,
metrics), so metrics.csv's client columns are those of full replies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.common import Code, FitIns, FitRes, Parameters, Status, bytes_to_ndarray

from protocol.layout import reply_problem, squared_norm
from protocol.traffic import SUMMED_CLIENTS

PARTITIONS = "cohort-partitions"  # the bundle's virtual clients (partition ids), comma-separated, in order
COUNTS = "cohort-array-counts"  # per-client array counts, comma-separated (instructions: only when arrays differ)
CONFIGS = "cohort-configs"  # JSON list: per client, the config entries not shared by all K
REPLIES = "cohort-replies"  # JSON list: per client, {"num_examples", "metrics"} or {"failed": reason}
SUM = "cohort-sum"  # JSON {"mean": arrays averaged, "head": [...], "body": [...]}: reply one sum (module docstring)
COHORT_KEYS = (PARTITIONS, COUNTS, CONFIGS, REPLIES, SUM)
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


# ------------------------------------------------------------------ summed replies
@dataclass(frozen=True)
class SumSpec:
    """What a summed reply holds (``SUM``): the first ``mean`` arrays are averaged, the rest
    summed; ``head`` and ``body`` are the drift columns' entries (``fl_app.server.drift.layout``)."""

    mean: int
    head: tuple[int, ...]
    body: tuple[int, ...]

    @property
    def drift(self) -> tuple[int, ...]:
        return (*self.head, *self.body)

    def encode(self) -> str:
        return json.dumps({"mean": self.mean, "head": list(self.head), "body": list(self.body)})

    @classmethod
    def decode(cls, value) -> SumSpec:
        try:
            spec = json.loads(value)
            return cls(int(spec["mean"]), tuple(int(i) for i in spec["head"]), tuple(int(i) for i in spec["body"]))
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"cohort bundle: {SUM} = {value!r} is not {{\"mean\", \"head\", \"body\"}}") from exc


@dataclass
class ClientSum:
    """One summed client as the server reads it: its partition, num_examples, metrics, and
    ||Delta_k||^2 over the head and over the body."""

    partition: int
    num_examples: int
    metrics: dict
    head_sq: float
    body_sq: float


@dataclass
class NodeSum:
    """A cohort node's summed reply, split (``split_summed_reply``): ``reply`` is what the
    method's strategy aggregates (the mean and the sums, ``SUMMED_CLIENTS`` = its clients, its
    arrays the reply's own bytes); ``clients`` the clients in it, ``rejected`` (partition, reason)
    the clients the node left out, ``failed`` those that failed; ``weighted_step`` sum_k n_k
    Delta_k and ``directions`` sum_k Delta_k / ||Delta_k|| over the spec's drift entries."""

    reply: FitRes
    clients: list[ClientSum]
    rejected: list[tuple[int, str]]
    failed: list[tuple[int, str]]
    weighted_step: list[np.ndarray]
    directions: list[np.ndarray]


@dataclass(frozen=True)
class SumOps:
    """The array operations ``sum_replies`` runs on: numpy's on the host (``NUMPY_SUMS``), or a
    node's own on its training device (``fl_app.node.cohort_client.device_sums``: the replies summed
    where they were trained, and only the sums copied to the host). Each must give what numpy's
    gives: float64 products and sums in the same order (bit for bit), ``dot`` within float64
    rounding (its summation order is the library's)."""

    to64: Callable  # an array as float64
    dot: Callable  # float(d . d) of a float64 array
    zeros64: Callable  # float64 zeros of an array's shape, on its device
    cast: Callable  # a float64 value back to a reference array's dtype (an integer one rounded half to even)
    squares: Callable  # a list's squared norm over its floating arrays, float64 squares (protocol.layout.squared_norm)
    to_numpy: Callable  # an output array on the host


def _numpy_cast(value, ref):
    value = np.asarray(value)
    return np.rint(value).astype(ref.dtype) if np.issubdtype(ref.dtype, np.integer) else value.astype(ref.dtype)


NUMPY_SUMS = SumOps(to64=lambda a: a.astype(np.float64), dot=lambda d: float(np.vdot(d, d)),
                    zeros64=lambda a: np.zeros(a.shape), cast=_numpy_cast, squares=squared_norm,
                    to_numpy=np.asarray)


def sum_replies(replies: Sequence[tuple[int, list, int, dict, list]], failed: Mapping[int, str], spec: SumSpec,
                ops: SumOps = NUMPY_SUMS) -> tuple[list[np.ndarray], int, dict]:
    """Node side: the cohort's ``NumPyClient.fit`` return value as ONE summed reply (module
    docstring). ``replies``: per client (partition, reply arrays, num_examples, metrics, the
    arrays it was sent), arrays of ``ops``' library (numpy's by default)."""
    kept, records, pids = [], [], []
    rejected: list[tuple[int, str]] = []
    for partition, reply, num_examples, metrics, sent in replies:
        problem = reply_problem(reply, [tuple(a.shape) for a in sent], ops.squares)
        if problem:
            rejected.append((int(partition), problem))
        else:
            kept.append((int(partition), reply, int(num_examples), metrics, sent))
    total = sum(n for _, _, n, _, _ in kept)
    arrays: list = []
    weighted_step = [ops.zeros64(kept[0][4][i]) for i in spec.drift] if kept else []
    directions = [ops.zeros64(kept[0][4][i]) for i in spec.drift] if kept else []
    if kept:
        first = kept[0][1]
        for i, ref in enumerate(first):
            if i < spec.mean:
                acc = sum(n * ops.to64(r[i]) for _, r, n, _, _ in kept)
                arrays.append(ops.cast(acc / total if total > 0 else acc, ref))
            else:
                arrays.append(ops.cast(sum(ops.to64(r[i]) for _, r, _, _, _ in kept), ref))
    for partition, reply, n, metrics, sent in kept:
        deltas = [ops.to64(reply[i]) - ops.to64(sent[i]) for i in spec.drift]
        squares = [ops.dot(d) for d in deltas]
        head_sq, body_sq = sum(squares[:len(spec.head)]), sum(squares[len(spec.head):])
        norm = (head_sq + body_sq) ** 0.5
        for j, d in enumerate(deltas):
            weighted_step[j] += n * d
            if norm > 0:
                directions[j] += d / norm
        pids.append(partition)
        records.append({"num_examples": n, "metrics": {k: _scalar(k, v, "metric") for k, v in metrics.items()},
                        "drift": [head_sq, body_sq]})
    for partition, reason in rejected:
        pids.append(partition)
        records.append({"rejected": reason})
    for partition, reason in failed.items():
        pids.append(int(partition))
        records.append({"failed": str(reason)})
    if len(set(pids)) != len(pids):
        raise ValueError(f"cohort reply: partition ids {pids} repeat; each virtual client replies once")
    metrics = {PARTITIONS: _join(pids), REPLIES: json.dumps(records), SUMMED_CLIENTS: len(kept),
               COUNTS: _join([len(arrays), len(weighted_step), len(directions)])}
    return [ops.to_numpy(a) for a in (*arrays, *weighted_step, *directions)], total, metrics


def split_summed_reply(res: FitRes) -> NodeSum:
    """Server side: a node's summed reply (``sum_replies``) as a ``NodeSum``; its arrays are
    slices of the reply's bytes (the mean and the sums never deserialised here), the drift sums
    decoded. A reply whose own status is not OK fails every client it names."""
    metrics = res.metrics
    if PARTITIONS not in metrics or SUMMED_CLIENTS not in metrics:
        raise ValueError(f"cohort reply: the metrics have no {PARTITIONS!r} and {SUMMED_CLIENTS!r}; "
                         "this is not a summed cohort reply")
    pids = _partition_list(metrics[PARTITIONS])
    ok = Status(code=Code.OK, message="Success")
    if res.status.code != Code.OK:
        empty = FitRes(ok, Parameters(tensors=[], tensor_type=res.parameters.tensor_type), 0, {SUMMED_CLIENTS: 0})
        return NodeSum(empty, [], [], [(p, f"cohort node failed: {res.status.message}") for p in pids], [], [])
    records = json.loads(metrics.get(REPLIES, "[]"))
    counts = _partition_list(metrics.get(COUNTS, ""))
    tensors = res.parameters.tensors
    if len(records) != len(pids) or len(counts) != 3 or sum(counts) != len(tensors):
        raise ValueError(f"cohort reply: {len(pids)} clients, {len(records)} records and {COUNTS} = "
                         f"{metrics.get(COUNTS)!r} do not cut {len(tensors)} tensors of a summed reply")
    n_sum, n_step = counts[0], counts[1]
    decoded = [bytes_to_ndarray(t) for t in tensors[n_sum:]]
    node = NodeSum(FitRes(ok, Parameters(tensors=list(tensors[:n_sum]), tensor_type=res.parameters.tensor_type),
                          int(res.num_examples), {SUMMED_CLIENTS: int(metrics[SUMMED_CLIENTS])}),
                   [], [], [], decoded[:n_step], decoded[n_step:])
    for p, record in zip(pids, records):
        if "failed" in record:
            node.failed.append((p, record["failed"]))
        elif "rejected" in record:
            node.rejected.append((p, record["rejected"]))
        else:
            node.clients.append(ClientSum(p, int(record["num_examples"]), dict(record["metrics"]),
                                          float(record["drift"][0]), float(record["drift"][1])))
    if len(node.clients) != node.reply.metrics[SUMMED_CLIENTS]:
        raise ValueError(f"cohort reply: {SUMMED_CLIENTS} = {node.reply.metrics[SUMMED_CLIENTS]} but "
                         f"{len(node.clients)} client records")
    return node
