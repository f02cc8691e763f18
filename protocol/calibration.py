"""What both sides of CCVR (clients/ccvr.py, strategies/ccvr.py) agree on: which round collects the
clients' class statistics and calibrates the head, and the arrays of a client's statistics.

The last round of the run (``num-server-rounds``) is the calibration round: its clients train no
step, they send the per-class statistics of the global model's features on their training data,
and the server retrains the head on virtual features drawn from them. Every other round trains as
FedAvg and its replies carry the same group with empty arrays.

A client's ``class_stats`` group, in this order (C classes, d the head's input width):
``counts`` (C,) the examples of each class, ``means`` (C, d) and ``covs`` (C, d, d), float64; a class
the client lacks has count 0 and zero mean and covariance.
"""

from __future__ import annotations

STATISTICS = ("counts", "means", "covs")
"""The arrays of a client's ``class_stats`` group, in the order they travel."""


def is_calibration_round(server_round: int, num_rounds: int) -> bool:
    """The round that collects the statistics and calibrates the head: the run's last."""
    return server_round == num_rounds
