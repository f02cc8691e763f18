"""FedPVR (Li et al. 2023, partial variance reduction): SCAFFOLD control variates on the last
``pvr-layers`` Linear layers only (default 1: the classifier head); the other layers take
plain SGD steps. Server as SCAFFOLD's: weighted mean, c <- c + (1/N) sum delta c_i, c over the
parameters ``protocol.layout.pvr_param_names`` names."""

from protocol.keys import Key, at_least
from protocol.layout import pvr_param_names
from strategies.control_variates import control_variate_server
from strategies.declared import DeclaredStrategy


class FedPVRStrategy(DeclaredStrategy):
    SERVER = control_variate_server(
        "FedPVR", pvr_param_names, "total",
        keys={"pvr-layers": Key(1, at_least(1), ">= 1 (last Linear layers with control variates)")})
