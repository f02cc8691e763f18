"""DP-FedAvg: central differential privacy with fixed clipping (McMahan et al., ICLR 2018),
built from Flower's strategy wrappers.

Client: plain local SGD. In ``dp-mode = "client"`` Flower's ``fixedclipping_mod``
(added in fl_app/client_app.py for these runs) clips the update; nothing here changes.
"""

from clients.base import DriftClient


class DPFedAvgClient(DriftClient):
    """Local SGD with cross-entropy; clipping and noise are Flower's (mod and strategy wrapper)."""
