"""FedSWA server (Liu et al., ICML 2025): w_{t+1} = w_t + α ((1/|S_t|) Σ w_i − w_t), the lookahead
step towards the replies' plain mean on the trainable entries, buffers the plain mean
(``strategies.parts.Lookahead``; the rules in ``clients/fedswa.py``)."""

from __future__ import annotations

from protocol.keys import Key, positive
from strategies.base import MEAN_OF_WEIGHTS
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import Lookahead

ALPHA = Key(1.0, positive, "> 0 (server step towards the clients' plain mean; 1 = the mean)")


class FedSWAStrategy(DeclaredStrategy):
    """The plain mean of the replies, reached by a step of α from w_t; nothing else kept or sent."""

    SERVER = ServerSide("FedSWA", screening=MEAN_OF_WEIGHTS, reply_sums=None, keys={"fedswa-alpha": ALPHA},
                        parts={"lookahead": Lookahead("fedswa-alpha")})
