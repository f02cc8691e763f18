"""FedProx: a proximal term keeps the local model near w_t (Li et al., MLSys 2020).

Client: local loss + (mu/2) ||w - w_t||^2; the server is Flower's FedProx
(``strategies/fedprox.py``).
"""

from clients.base import DriftClient


class FedProxClient(DriftClient):
    """Adds mu * (w - w_t) to every gradient; mu is the run config's ``proximal-mu``, read like
    every other method's key (Flower's FedProx strategy also sends it as ``proximal_mu`` in the
    fit config; the client does not need that copy)."""

    def adjust_gradients(self) -> None:
        self.add_proximal_gradient(self.cfg["proximal-mu"])
