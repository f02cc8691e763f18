"""What ``inject-faults`` does to a client on a node, the same functions on the per-client node
(``fl_app.node.node_client``) and a cohort node's clients (``fl_app.node.cohort_client``):
``raise_if_injected`` before any work of the client's round (``raise:<partition>``), and
``faulted_reply``, a filter on its reply after its training, once its method has kept its own
state (so that state stays honest): ``nan:<partition>`` and the model-poisoning attacks for
testing defences (``scale``, ``flip``, ``noise``, ``adaptive``, ``gaussian``); and
``attacked_labels``, the data attack ``label-flip``, on the labels a client trains on
(``fl_app.node.drift_client.prepared_round``, the one preparation of both paths). The omniscient
attacks (``alie``, ``ipm``, ``mimic``) need the round's honest replies, which no node sees: the
server applies them (``fl_app/server/omniscient.py``); a node of such a run only names its
partition in its fit metrics (``partition_metric``), so that the server knows whose reply is whose.

Each attack rewrites a client's weight update Delta = w_k - w_t (w_t = the weights the client
received, w_k = its trained weights) before the reply leaves the client:

- ``scale:<partition>:<factor>``  Delta -> factor * Delta (any finite factor);
- ``flip:<partition>[:<factor>]`` Delta -> -factor * Delta (factor > 0, default 1: a plain
  sign flip);
- ``noise:<partition>:<norm>``    Delta -> Gaussian noise rescaled to L2 norm ``norm`` (> 0),
  drawn from a generator seeded by (seed, partition, round), so a run repeats exactly;
- ``adaptive:<partition>[:<margin>]`` Delta -> -(margin * B / ||Delta||) * Delta (margin in
  (0, 1], default 0.9): a sign flip scaled to stay just inside the run's screening bound B,
  which the attacker knows from the run config and estimates with its own honest update norm
  standing for the round's median: B = ``screen-clip-norm`` under ``clip`` when that is > 0,
  else ``screen-clip-multiple`` x ||Delta|| under ``clip``, and ``screen-reject-multiple`` x
  ||Delta|| under every other screening (the bound of ``reject``, the norm filter the
  attacker must pass if the server adds one). With honest updates of similar norms it
  passes ``reject`` and is not cut by ``clip``, while pulling against the honest direction
  with up to that many times an honest client's weight;
- ``gaussian:<partition>[:<sigma>]`` Delta -> noise of independent N(0, sigma^2) coordinates
  (sigma > 0, default 1: ByzFL's ``Gaussian`` attack, which sends such a vector in place of a
  gradient), drawn from a generator seeded by (seed, partition, round), so a run repeats
  exactly. Unlike ``noise`` its norm is not set: about sigma sqrt(d) for d coordinates.

The data attack ``label-flip:<partition>`` trains the client on the labels y -> C - 1 - y (C
= the dataset's classes; ByzFL's ``LabelFlipping`` and Karimireddy et al. 2022's label flip),
its method and reply otherwise untouched: the reply is an honest update of poisoned data.

The items are parsed with the other ``inject-faults`` items in ``fl_app/common/faults.py``.
A suffix ``@R`` (R >= 1) starts the attack at round R (``scale:3:100@5``); without it the
attack acts from round 1. Only floating-point arrays of the model state change (integer
buffers such as BatchNorm's ``num_batches_tracked`` are sent as trained), and the norm of
``noise`` is taken over those arrays. Arrays after the model state (a method's extras, such
as control-variate updates) are sent as computed: the attack is on the model update only.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from fl_app.common.faults import PARTITION_METRIC, Attack, parse_faults, server_attacks

MODEL_ATTACKS = ("scale", "flip", "noise", "adaptive", "gaussian")  # the attacks on a node's reply


@functools.lru_cache(maxsize=16)
def client_faults(text: str) -> dict:
    """{partition: its fault} of an ``inject-faults`` value (the server's own items left out)."""
    return {k: v for k, v in parse_faults(text).items() if isinstance(k, int)}


def targets_clients(cfg: dict) -> bool:
    """Whether the run injects a fault or attack into any client."""
    return bool(client_faults(cfg["inject-faults"]))


def raise_if_injected(cfg: dict, partition: int) -> None:
    """The injected ``raise`` fault of client ``partition``: its round fails before any work."""
    if client_faults(cfg["inject-faults"]).get(partition) == "raise":
        raise RuntimeError(f"injected fault: client of partition {partition} raises")


def faulted_reply(cfg: dict, partition: int, server_round: int, reply: list, received: list,
                  num_weights: int) -> list:
    """Client ``partition``'s reply as its injected ``nan`` fault or attack leaves it (the reply
    itself when it has none): ``received`` is what the server sent it (w_t first),
    ``num_weights`` the model state arrays at the front of both."""
    fault = client_faults(cfg["inject-faults"]).get(partition)
    if fault is None:
        return reply
    if fault == "nan":
        reply = [np.full_like(a, np.nan) if np.issubdtype(a.dtype, np.floating) else a for a in reply]
    return attacked_reply(fault, reply, received, num_weights, cfg["seed"], partition, server_round, cfg)


def attacked_labels(cfg: dict, partition: int, server_round: int, y, classes: int):
    """The labels client ``partition`` trains on in ``server_round``: ``classes - 1 - y`` (a new
    tensor) when it runs ``label-flip`` from this round on, else ``y`` itself."""
    fault = client_faults(cfg["inject-faults"]).get(partition)
    if isinstance(fault, Attack) and fault.kind == "label-flip" and server_round >= fault.from_round:
        return (classes - 1) - y
    return y


@functools.lru_cache(maxsize=16)
def names_partitions(text: str) -> bool:
    """Whether the replies of an ``inject-faults`` value must name their partition: it holds an
    omniscient attack, which the server applies to the replies of the attacking partitions."""
    return bool(server_attacks(text))


def partition_metric(cfg: dict, partition: int) -> dict:
    """{PARTITION_METRIC: partition} in a run with an omniscient attack (``names_partitions``), for
    the client's fit metrics; else {}. The server reads it to tell the attackers' replies from
    the honest ones on either path (a node id says nothing of the partition it holds)."""
    return {PARTITION_METRIC: partition} if names_partitions(cfg["inject-faults"]) else {}


def screening_bound(cfg: dict, own_norm: float) -> float:
    """The update norm the run's screening lets through, as an adaptive attacker estimates it
    from the run config with its own honest update norm standing for the round's median."""
    if cfg.get("screening") == "clip":
        if cfg.get("screen-clip-norm", 0.0) > 0:
            return cfg["screen-clip-norm"]
        return cfg.get("screen-clip-multiple", 1.0) * own_norm
    return cfg.get("screen-reject-multiple", 3.0) * own_norm


def attacked_reply(fault, reply: list[np.ndarray], received: list[np.ndarray], num_weights: int,
                   seed: int, partition: int, server_round: int, cfg: dict | None = None) -> list[np.ndarray]:
    """``reply`` with its weight update poisoned when ``fault`` is an Attack active this round;
    otherwise ``reply`` itself. ``received`` holds what the server sent (w_t first),
    ``num_weights`` is the number of model state arrays at the front of both lists; ``cfg``
    (the run config) gives the screening bound that ``adaptive`` stays inside."""
    if not isinstance(fault, Attack) or server_round < fault.from_round or fault.kind not in MODEL_ATTACKS:
        return reply
    floating = [i for i in range(num_weights) if np.issubdtype(reply[i].dtype, np.floating)]
    deltas = {i: reply[i].astype(np.float64) - received[i].astype(np.float64) for i in floating}
    if fault.kind == "scale":
        new = {i: fault.value * d for i, d in deltas.items()}
    elif fault.kind == "flip":
        new = {i: -fault.value * d for i, d in deltas.items()}
    elif fault.kind == "adaptive":
        norm = math.sqrt(sum(float((d**2).sum()) for d in deltas.values()))
        s = fault.value * screening_bound(cfg or {}, norm) / norm if norm > 0 else 0.0
        new = {i: -s * d for i, d in deltas.items()}
    elif fault.kind == "gaussian":  # N(0, sigma^2) coordinates
        rng = np.random.default_rng([seed, partition, server_round, 0x6A055])
        new = {i: fault.value * rng.standard_normal(d.shape) for i, d in deltas.items()}
    else:  # noise of L2 norm fault.value over all floating arrays
        rng = np.random.default_rng([seed, partition, server_round, 0xA77AC])
        new = {i: rng.standard_normal(d.shape) for i, d in deltas.items()}
        norm = math.sqrt(sum(float((n**2).sum()) for n in new.values()))
        new = {i: n * (fault.value / norm) for i, n in new.items()} if norm > 0 else new
    out = list(reply)
    for i, d in new.items():
        out[i] = (received[i].astype(np.float64) + d).astype(reply[i].dtype)
    return out
