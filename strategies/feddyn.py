"""FedDyn (Acar et al. 2021, Algorithm 1): dynamic regularisation with a server state h.

Server, with S_t the clients of round t and N the total number of clients:
    h <- h - alpha * (1/N) * sum_{k in S_t} (w_k - w_t)
    w_{t+1} = (1/|S_t|) sum_{k in S_t} w_k - (1/alpha) * h
It is computed as H = -h/alpha (the mean accumulated client drift, ``strategies.parts.Drift``,
which FedSMOO, FedSpeed and FedDC declare too):
    H <- H + (1/N) sum_{k in S_t} (w_k - w_t),   w_{t+1} = mean_{S_t}(w_k) + H,
the same update without dividing by alpha.
The mean is the paper's unweighted one (Algorithm 1), not the n_k-weighted mean. H covers
the trainable parameters only; buffers (BN running statistics) get the same plain mean
without correction, since no client gradient state exists for them. N is
``strategies.arrays.total_clients``, read when the round's clients are sampled. Checkpoints
hold H and h; server metric ``feddyn_h_norm`` = ||h||.
"""

from __future__ import annotations

from protocol.keys import Key, positive
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import Drift


class FedDynStrategy(DeclaredStrategy):
    """Unweighted mean of the client weights plus H = -h/alpha; H accumulates client drift."""

    SERVER = ServerSide(
        "FedDyn", keys={"feddyn-alpha": Key(0.01, positive, "> 0")},
        parts={"memory": Drift(alpha="feddyn-alpha", metric="feddyn_h_norm", h_metric=True)},
        reply_sums=None,  # a plain mean over clients
        screening=REPLIES_ONLY,
        screening_why=("w = mean(w_k) - h/alpha with h accumulating the sum of the client drifts: a "
                       "coordinate-wise median of the weights would not match the h it updates"))
