"""FedSpeed server (Sun et al., ICLR 2023; the authors' FL-Simulator): FedDyn's server.

Over the clients S_t that replied (N = all clients, H starts at zero):
    H <- H + (1/N) sum_{S_t} (w_i - w_t);   w_{t+1} = mean_{S_t}(w_i) + H
(``strategies.parts.Drift``, FedDyn's server part, written without dividing by the prox
coefficient c, so c = 0 is allowed; unweighted means, buffers the plain mean). Only the weights
travel. Checkpoints hold H (FedDyn's records, h = -c H); server metric ``fedspeed_H_norm``
(||H||, the mean drift over all clients).
"""

from __future__ import annotations

from protocol.keys import Key, non_negative
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import Drift

PROX = Key(0.1, non_negative, ">= 0 (prox coefficient c = 1/lambda; the code's lamb)")


class FedSpeedStrategy(DeclaredStrategy):
    """FedDyn's server part with FedSpeed's key for its coefficient."""

    SERVER = ServerSide("FedSpeed", screening=REPLIES_ONLY, reply_sums=None, keys={"fedspeed-prox": PROX},
                        parts={"memory": Drift(alpha="fedspeed-prox", metric="fedspeed_H_norm")},
                        screening_why="w = mean(w_k) + H with H accumulating the sum of the client drifts:"
                                      " a coordinate-wise median of the weights would not match the H it updates")
