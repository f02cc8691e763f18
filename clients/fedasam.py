"""FedASAM: adaptive SAM (Kwon et al., ICML 2021) as the local optimiser (Caldarola, Caputo,
Ciccone, ECCV 2022).

eps = rho T^2 g / ||T g|| with T = |w| + eta elementwise for weight tensors and T = 1 for
biases (as the official ASAM code does: it normalises parameters whose name contains
"weight" only); otherwise as FedSAM.

Own keys (the run config is one flat namespace and ASAM's radius is ~10x SAM's): defaults
rho 0.5, eta 0.01 are the ASAM paper's (Kwon et al. 2021) CIFAR values. Server: Flower's
FedAvg (n_k-weighted mean, ``DriftFedAvg``); every ``asam-*`` key is read here.
"""

from __future__ import annotations

from clients.fedsam import FedSAMClient
from clients.perturbation import asam_eps
from tasks.keys import Key, non_negative, positive


class FedASAMClient(FedSAMClient):
    # replaces FedSAM's sam-rho (its perturbation replaces FedSAM's, the only reader)
    CONFIG_KEYS = {
        "asam-rho": Key(0.5, positive, "> 0 (ASAM radius)"),
        "asam-eta": Key(0.01, non_negative, ">= 0 (ASAM T_w = |w| + eta)"),
    }

    def perturbation(self, params: list, grads: list) -> list:
        scaled = [name.rsplit(".", 1)[-1] == "weight" for name, _ in self.model.named_parameters()]
        return asam_eps(params, grads, self.cfg["asam-rho"], self.cfg["asam-eta"], scaled)
