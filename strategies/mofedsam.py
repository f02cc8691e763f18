"""MoFedSAM server (Qu et al., ICML 2022): FedCM's (``strategies.momentum``), with MoFedSAM's own
key for eta_g and its own checkpoint record (the rules in ``clients/mofedsam.py``)."""

from __future__ import annotations

from strategies.declared import DeclaredStrategy
from strategies.momentum import client_momentum_server


class MoFedSAMStrategy(DeclaredStrategy):
    """The unweighted mean update, stepped by eta_g, kept per local step as Delta and sent down."""

    SERVER = client_momentum_server("MoFedSAM", server_lr="mofedsam-server-lr", record="mofedsam",
                                    metric="mofedsam_delta_norm")
