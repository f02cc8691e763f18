"""What travels after the model's state arrays, named once: each method family's groups of
arrays, server to client (``down``) and client to server (``up``), in the order they follow the
weights. Both sides read them by these names: a server's declaration
(``strategies.declared.ServerSide``) names its family, one of ``FAMILIES``, and what each of its
parts sends and reads, checked when the declaration is made; the client's
``LocalUpdate.receives`` / ``sends`` are keyed by them (``tests/methods/test_traffic.py`` checks
every registered client against its server); the servers pack and split their messages with
``append_groups`` / ``split_groups`` by the same names (no positional slicing of their own).
They are what Flower's Message API would name as the ``ArrayRecord``s of a message, should the
product move there.

| family | down | up |
|---|---|---|
| control variates (SCAFFOLD, FedPVR, FedGAM-CV, FedDC) | ``c`` | ``delta_c`` |
| FedSMOO | ``s`` | ``stil`` |
| client momentum (FedCM, MoFedSAM) | ``delta`` | - |
| class statistics (CCVR) | - | ``class_stats`` |
| every other method | - | - |

A reply carries the weights and the family's ``up`` groups, each the shape of the ``down`` group it
answers; a family with ``down`` groups and no ``up`` (client momentum) replies the weights alone. The
class statistics answer no ``down`` group: ``class_stats`` is each client's per-class feature counts,
means and covariances (``CLASS_STATISTICS``), empty arrays in the rounds that do not collect them.

A reply may stand for several clients: on the cohort path a node can reply, for the round's
clients it hosts, the n_k-weighted mean of their weights and the plain sum of each ``up`` group
a server declares it sums (``strategies.base.FromConfig.REPLY_SUMS``), with ``num_examples`` the
clients' sum n_k and the metric ``SUMMED_CLIENTS`` = how many clients it stands for
(``clients_in``; 1 for any other reply). A server that declares its sums reads a reply through
those alone, so one summed reply and the clients' own replies aggregate to the same model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Traffic:
    """The named groups after the weights: ``down`` (server to client), ``up`` (client to server)."""

    down: tuple[str, ...] = ()
    up: tuple[str, ...] = ()


CONTROL_VARIATES = Traffic(down=("c",), up=("delta_c",))
SMOO = Traffic(down=("s",), up=("stil",))
CLIENT_MOMENTUM = Traffic(down=("delta",))
"""FedCM's and MoFedSAM's global direction, the previous round's mean update per local step."""
CLASS_STATISTICS = Traffic(up=("class_stats",))
"""CCVR's per-class feature statistics, client to server (``protocol.calibration``)."""
WEIGHTS_ONLY = Traffic()
FAMILIES = (WEIGHTS_ONLY, CONTROL_VARIATES, SMOO, CLIENT_MOMENTUM, CLASS_STATISTICS)
"""Every family above: the only traffic a server may declare."""

SUMMED_CLIENTS = "summed-clients"
"""Metric of a reply that stands for several clients: their number (module docstring)."""


def clients_in(metrics: Mapping) -> int:
    """How many clients a reply with these metrics stands for: ``SUMMED_CLIENTS``, else 1."""
    return int(metrics.get(SUMMED_CLIENTS, 1))


def append_groups(weights: Sequence, groups: Mapping[str, Sequence], order: tuple[str, ...]) -> list:
    """``weights`` followed by each group of ``order`` (every one of them, by name)."""
    missing = [name for name in order if name not in groups]
    if missing or set(groups) - set(order):
        raise ValueError(f"groups {sorted(groups)} do not match the declared {list(order)}")
    return [*weights, *(a for name in order for a in groups[name])]


def split_groups(arrays: Sequence, num_state: int, sizes: Mapping[str, int], what: str) -> tuple[list, dict[str, list]]:
    """(the first ``num_state`` arrays, {name: its arrays}) of a message whose weights are
    followed by the groups ``sizes`` names, in that order and with those counts; any other
    count refused in one line naming ``what`` sent it."""
    expected = num_state + sum(sizes.values())
    if len(arrays) != expected:
        parts = " + ".join(f"{n} ({k})" for k, n in sizes.items()) or "nothing"
        raise ValueError(f"{what} carries {len(arrays) - num_state} arrays after the {num_state} weights,"
                         f" expected {parts}")
    groups, start = {}, num_state
    for name, size in sizes.items():
        groups[name] = list(arrays[start:start + size])
        start += size
    return list(arrays[:num_state]), groups
