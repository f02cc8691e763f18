"""MoFedSAM server (Qu et al., ICML 2022): FedCM's (``strategies.parts.ClientMomentum``), with
MoFedSAM's own key for eta_g and its own checkpoint record (the rules in ``clients/mofedsam.py``)."""

from __future__ import annotations

from protocol.keys import Key, positive
from protocol.traffic import CLIENT_MOMENTUM
from strategies.base import REPLIES_ONLY
from strategies.declared import DeclaredStrategy, ServerSide
from strategies.parts import MOMENTUM_WHY, ClientMomentum


class MoFedSAMStrategy(DeclaredStrategy):
    """The unweighted mean update, stepped by eta_g, kept per local step as Delta and sent down."""

    SERVER = ServerSide(
        "MoFedSAM", screening=REPLIES_ONLY, reply_sums=None,  # a plain mean over clients
        keys={"mofedsam-server-lr": Key(1.0, positive, "> 0 (global learning rate eta_g on the mean update)")},
        traffic=CLIENT_MOMENTUM,
        parts={"momentum": ClientMomentum("mofedsam-server-lr", record="mofedsam", metric="mofedsam_delta_norm")},
        screening_why=MOMENTUM_WHY)
