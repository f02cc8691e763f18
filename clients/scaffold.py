"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020), option II control
variates on every trainable parameter.

- Client: plain local SGD corrected on every step, d = g − c_i + c; then c_i⁺ and Δc_i as in
  the [control-variate rules](#control-variates) (c_i⁺ = c_i − c + (w_t − w) / (η K_eff), K_eff
  the momentum-corrected count of all local steps of the round).
- Server (`strategies/scaffold.py`): weighted mean of the weights;
  c ← c + (1/N) Σ_{i∈S_t} Δc_i.
- State: c_i per client, c on the server; c travels with the model, Δc_i with the reply.
- Keys: `cv-divisor` (`total`, SCAFFOLD's D = N; `participants`, D = |S_t| as FedGAM-CV's
  Eq. 22, for ablations that separate FedGAM-CV's divisor from its GAM term; the two agree
  under full participation); it reads `momentum` (for K_eff).
- Readings: the weights take the n_k-weighted mean with global step size 1; K counts all local
  steps of the round, not the batches of one epoch.

Summary: client + c − c_i | server c update | client state c_i | server state c | traffic c
down, Δc_i up
"""

from __future__ import annotations

from clients.control_variates import CORRECTION, control_variate_arrays, control_variate_begin, control_variate_end
from protocol.layout import trainable_param_names
from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate

# d = g + (c - c_i): the plain gradient and the control-variate correction, on every trainable parameter
UPDATE = LocalUpdate("scaffold", plain_direction, control_variate_begin, control_variate_end,
                     terms=(CORRECTION,), **control_variate_arrays(trainable_param_names), module=__name__)
