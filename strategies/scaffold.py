"""SCAFFOLD (Karimireddy et al. 2020), option II control variates: the server side every
SCAFFOLD-style method shares (``strategies.control_variates.ControlVariateStrategy``) with
SCAFFOLD's key for the divisor.

Server: n_k-weighted mean of the weights (global step size 1) and
c <- c + (1/D) sum_{i in S_t} delta c_i with D = N, the number of clients in the federation
(``cv-divisor = "total"``, the SCAFFOLD paper), or D = |S_t|, the round's participants
(``cv-divisor = "participants"``, FedGAM-CV's Eq. 22): the option that lets an ablation
separate FedGAM-CV's divisor from its GAM term. Both are the same under full participation.
N is the partition count the client manager learned (``SeededClientManager.num_partitions``),
else the number of connected nodes.

The server holds c (zeros at the start, one array per parameter that carries a control
variate, state_dict order). ``configure_fit`` sends weights + c; each reply is weights +
delta c_i with the same count and shapes (so the server's reply check,
``fl_app.server.recording.check_reply``, holds). It reports ``cv_norm`` = ||c|| (after the
update) as a round metric. The model weights the server evaluates and stores never include c.
"""

from __future__ import annotations

from protocol.keys import Key
from strategies.base import REPLIES_ONLY
from strategies.control_variates import ControlVariateStrategy
from strategies.parts import DIVISORS


class ScaffoldStrategy(ControlVariateStrategy):
    CV_DIVISOR = "total"
    SCREENING = REPLIES_ONLY  # c moves by the clients' delta c_i (SCREENING_WHY)
    REPLY_SUMS = ("delta_c",)  # the weighted mean and c's sum of delta c_i
    CONFIG_KEYS = {
        "cv-divisor": Key("total", choices=DIVISORS),
    }

    @classmethod
    def divisor(cls, cfg: dict) -> str:
        return cfg.get("cv-divisor", cls.CV_DIVISOR)
