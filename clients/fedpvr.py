"""FedPVR (Li et al. 2023): SCAFFOLD option II restricted to the last ``pvr-layers`` Linear
layers; c and c_i exist (and travel) only for those parameters."""

from torch import nn

from clients.control_variates import ControlVariateClient
from tasks.models import last_layers_param_names


def pvr_param_names(model: nn.Module, cfg: dict) -> list[str]:
    """Weights and biases of the last ``pvr-layers`` Linear layers."""
    return last_layers_param_names(model, int(cfg["pvr-layers"]), nn.Linear)


class FedPVRClient(ControlVariateClient):
    cv_param_names = staticmethod(pvr_param_names)
