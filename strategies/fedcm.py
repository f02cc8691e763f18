"""FedCM server (Xu, Wang, Wang, Yao, arXiv 2021): w_{t+1} = w_t + η_g Δ̄_t, Δ̄_t the unweighted
mean update of the replies, and the global direction Δ_{t+1} = −Δ̄_t / (η_t K̄_t) sent to the next
round's clients (``strategies.momentum``, the part ``strategies.parts.ClientMomentum``; the rules
in ``clients/fedcm.py``)."""

from __future__ import annotations

from strategies.declared import DeclaredStrategy
from strategies.momentum import client_momentum_server


class FedCMStrategy(DeclaredStrategy):
    """The unweighted mean update, stepped by eta_g, kept per local step as Delta and sent down."""

    SERVER = client_momentum_server("FedCM", server_lr="fedcm-server-lr", record="fedcm",
                                    metric="fedcm_delta_norm")
