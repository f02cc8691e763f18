"""FedNova: normalised averaging, so clients that take more local steps do not pull the average
towards their own objective (Wang et al., NeurIPS 2020).

Client: plain local SGD; the base client already reports ``num_steps`` (tau_k),
which the server's normalised averaging needs.
"""

from clients.base import DriftClient


class FedNovaClient(DriftClient):
    """Local SGD with cross-entropy; tau_k travels as the ``num_steps`` fit metric."""
