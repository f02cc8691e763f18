"""FedDC server (Gao et al., CVPR 2022; the authors' code): FedDyn's server and SCAFFOLD's c.

Over the clients S_t that replied (N = all clients; H and c start at zero):
    H <- H + (1/N) sum_{S_t} (w_i - w_t);   w_{t+1} = mean_{S_t}(w_i) + H
(``strategies.parts.Drift``: unweighted means, buffers the plain mean), and
    c <- c + (1/N) sum_{S_t} delta c_i
(``strategies.parts.ControlVariates``, SCAFFOLD's 1/N as the authors' code: c travels after
the weights, delta c_i after the reply's weights; Adam is refused). The two server parts
FedDyn and SCAFFOLD declare, declared together here; checkpoints hold H (FedDyn's records,
h = -alpha H) and c. Server metrics: ``cv_norm`` and ``feddc_H_norm`` (||H||, the mean drift
over all clients).
"""

from __future__ import annotations

from protocol.keys import Key, non_negative
from protocol.traffic import CONTROL_VARIATES
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import ControlVariates, Drift

WHY = ("w = mean(w_k) + H with H accumulating the sum of the client drifts, and c moved by the "
       "clients' delta c_i: a coordinate-wise median of the weights would match neither")


class FedDCStrategy(DeclaredStrategy):
    """The replies' weights aggregated by FedDyn's server part, their delta c_i by SCAFFOLD's."""

    SERVER = ServerSide(
        "FedDC", screening=REPLIES_ONLY, screening_why=WHY,
        reply_sums=None,  # a plain mean over clients
        keys={"feddc-alpha": Key(0.01, non_negative, ">= 0 (drift penalty alpha)")},
        traffic=CONTROL_VARIATES,  # c down, delta_c up
        parts={"cv": ControlVariates(divisor="total"), "memory": Drift(alpha="feddc-alpha", metric="feddc_H_norm")})
