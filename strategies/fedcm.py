"""FedCM server (Xu, Wang, Wang, Yao, arXiv 2021): w_{t+1} = w_t + η_g Δ̄_t, Δ̄_t the unweighted
mean update of the replies, and the global direction Δ_{t+1} = −Δ̄_t / (η_t K̄_t) sent to the next
round's clients (``strategies.parts.ClientMomentum``; the rules in ``clients/fedcm.py``)."""

from __future__ import annotations

from protocol.keys import Key, positive
from protocol.traffic import CLIENT_MOMENTUM
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import MOMENTUM_WHY, ClientMomentum


class FedCMStrategy(DeclaredStrategy):
    """The unweighted mean update, stepped by eta_g, kept per local step as Delta and sent down."""

    SERVER = ServerSide(
        "FedCM", screening=REPLIES_ONLY, reply_sums=None,  # a plain mean over clients
        keys={"fedcm-server-lr": Key(1.0, positive, "> 0 (global learning rate eta_g on the mean update)")},
        traffic=CLIENT_MOMENTUM,
        parts={"momentum": ClientMomentum("fedcm-server-lr", record="fedcm", metric="fedcm_delta_norm")},
        screening_why=MOMENTUM_WHY)
