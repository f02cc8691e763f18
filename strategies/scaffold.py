"""SCAFFOLD (Karimireddy et al. 2020), option II control variates: the server every
SCAFFOLD-style method shares (``strategies.control_variates.control_variate_server``) with
SCAFFOLD's key for the divisor.

Server, over the clients S_t that replied:
    w_{t+1} = sum_{i in S_t} p_i w_i            (p_i = n_i / sum n: Flower's FedAvg, step size 1)
    c      <- c + (1/D) sum_{i in S_t} delta c_i
with D = N, the number of clients in the federation (``cv-divisor = "total"``, the SCAFFOLD
paper), or D = |S_t|, the round's participants (``cv-divisor = "participants"``, FedGAM-CV's
Eq. 22): the option that lets an ablation separate FedGAM-CV's divisor from its GAM term. Both
are the same under full participation. N is ``strategies.arrays.total_clients``.

The server holds c (``strategies.parts.ServerControlVariates``: zeros at the start, one array
per parameter that carries a control variate, state_dict order). ``configure_fit`` sends
weights + c; each reply is weights + delta c_i with the same count and shapes (so the server's
reply check, ``fl_app.server.recording.check_reply``, holds). It reports ``cv_norm`` = ||c||
(after the update) as a round metric. The model weights the server evaluates and stores never
include c.
"""

from __future__ import annotations

from protocol.keys import Key
from strategies.control_variates import control_variate_server
from strategies.declared import DeclaredStrategy
from strategies.parts import DIVISORS


class ScaffoldStrategy(DeclaredStrategy):
    SERVER = control_variate_server("SCAFFOLD", keys={"cv-divisor": Key("total", choices=DIVISORS)},
                                    divisor_key="cv-divisor")
