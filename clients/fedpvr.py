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

from __future__ import annotations

from clients.control_variates import CORRECTION, control_variate_arrays, control_variate_begin, control_variate_end
from protocol.layout import pvr_param_names
from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate

# SCAFFOLD's update, d = g + (c - c_i), on the last ``pvr-layers`` Linear layers (pvr-layers is
# FedPVRStrategy's key).
UPDATE = LocalUpdate("fedpvr", plain_direction, control_variate_begin, control_variate_end, terms=(CORRECTION,),
                     **control_variate_arrays(pvr_param_names), module=__name__)
