"""FedPVR: partial variance reduction, SCAFFOLD's control variates on the last layers only (Li,
Schmidt, Alstrøm, Stich, CVPR 2023).

Client: SCAFFOLD option II restricted to the last ``pvr-layers`` Linear
layers; c and c_i exist (and travel) only for those parameters.
"""

from clients.control_variates import ControlVariateClient
from tasks.layout import pvr_param_names


class FedPVRClient(ControlVariateClient):
    cv_param_names = staticmethod(pvr_param_names)
