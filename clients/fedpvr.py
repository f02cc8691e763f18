"""FedPVR: partial variance reduction, SCAFFOLD's control variates on the last layers only (Li,
Schmidt, Alstrøm, Stich, CVPR 2023).

- Client: SCAFFOLD option II restricted to the last `pvr-layers` Linear layers:
  d = g − c_i + c on their parameters (weights and biases); plain SGD on the others. c_i⁺ and
  Δc_i as in the [control-variate rules](#control-variates), for those parameters.
- Server (`strategies/fedpvr.py`): weighted mean of the weights; c ← c + (1/N) Σ_{i∈S_t} Δc_i.
- State and traffic: c, c_i and Δc_i exist (and travel) only for the selected layers.
- Keys: `pvr-layers` (1, ≥ 1; 1 = the classifier head).

Summary: client + c − c_i on the last layers | server c update | client state c_i (last layers)
| server state c (last layers) | traffic c, Δc_i (last layers)
"""

from clients.control_variates import ControlVariateClient
from protocol.layout import pvr_param_names
from tasks.functional.corrections import FEDPVR


class FedPVRClient(ControlVariateClient):
    """SCAFFOLD's update on the last ``pvr-layers`` Linear layers: ``tasks.functional.corrections.FEDPVR``,
    with c, c_i (those layers only) and the reply handled by ``ControlVariateClient``."""

    LOCAL_UPDATE = FEDPVR
    cv_param_names = staticmethod(pvr_param_names)
