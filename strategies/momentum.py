"""The server declaration of the methods whose server is FedCM's, written once (FedCM, MoFedSAM):
the replies' unweighted mean update stepped by eta_g, w_{t+1} = w_t + eta_g mean_i(w_i - w_t),
kept per local step as the global direction Delta and sent down after the weights (``delta``:
``protocol.traffic.CLIENT_MOMENTUM``; the part is ``strategies.parts.ClientMomentum``). The
client side is ``clients.momentum``.
"""

from __future__ import annotations

from protocol.keys import Key, positive
from protocol.traffic import CLIENT_MOMENTUM
from strategies.base import REPLIES_ONLY
from strategies.declared import ServerSide
from strategies.parts import MOMENTUM_WHY, ClientMomentum


def client_momentum_server(name: str, server_lr: str, record: str, metric: str) -> ServerSide:
    """The declaration of a FedCM-style server named ``name``: its key ``server_lr`` (eta_g),
    its checkpoint record ``record`` and round metric ``metric`` (||Delta||). Screening: clip and
    reject only (``MOMENTUM_WHY``); every client's own reply (a plain mean over clients sums
    nothing)."""
    return ServerSide(
        name, screening=REPLIES_ONLY, reply_sums=None,
        keys={server_lr: Key(1.0, positive, "> 0 (global learning rate eta_g on the mean update)")},
        traffic=CLIENT_MOMENTUM,
        parts={"momentum": ClientMomentum(server_lr, record=record, metric=metric)},
        screening_why=MOMENTUM_WHY)
