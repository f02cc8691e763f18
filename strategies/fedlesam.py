"""FedLESAM server (Fan et al., ICML 2024): FedCM's (``strategies.momentum``), with FedLESAM's own
key for eta_g and its own checkpoint record (the rules in ``clients/fedlesam.py``)."""

from __future__ import annotations

from strategies.declared import DeclaredStrategy
from strategies.momentum import client_momentum_server


class FedLESAMStrategy(DeclaredStrategy):
    """The unweighted mean update, stepped by eta_g, kept per local step as Delta and sent down."""

    SERVER = client_momentum_server("FedLESAM", server_lr="fedlesam-server-lr", record="fedlesam",
                                    metric="fedlesam_delta_norm")
