"""SCAFFOLD (Karimireddy et al. 2020), option II control variates.

Server: n_k-weighted mean of the weights (global step size 1) and
c <- c + (1/D) sum_{i in S_t} delta c_i with D = N, the number of clients in the federation
(``cv-divisor = "total"``, the SCAFFOLD paper), or D = |S_t|, the round's participants
(``cv-divisor = "participants"``, FedGAM-CV's Eq. 22): the option that lets an ablation
separate FedGAM-CV's divisor from its GAM term. Both are the same under full participation.
"""

from protocol.keys import Key
from strategies.base import REPLIES_ONLY
from strategies.control_variates import DIVISORS, ControlVariateStrategy


class ScaffoldStrategy(ControlVariateStrategy):
    CV_DIVISOR = "total"
    SCREENING = REPLIES_ONLY  # c moves by the clients' delta c_i (SCREENING_WHY)
    CONFIG_KEYS = {
        "cv-divisor": Key("total", choices=DIVISORS),
    }

    @classmethod
    def divisor(cls, cfg: dict) -> str:
        return cfg.get("cv-divisor", cls.CV_DIVISOR)
