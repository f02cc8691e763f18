"""FedGAM-CV: FedGAM's gradient corrected by SCAFFOLD control variates (Xu, Ma, Dai, Wu,
Zhou, Mathematics 2024, Algorithm 2).

- Client: d = G − c_i + c, that is w ← w − η (G − c_i + c), with G the FedGAM gradient (either
  `gam-variant`) computed with α = `gam-cv-alpha`; c_i⁺ and Δc_i as in the
  [control-variate rules](#control-variates) (c_i⁺ = c_i − c + (w_t − w) / (η K_eff), K_eff
  the round's momentum-corrected count of all local steps).
- Server (`strategies/fedgam_cv.py`): weighted mean of the weights;
  c ← c + (1/|S_t|) Σ_{i∈S_t} Δc_i.
- State: c_i per client, c on the server, as SCAFFOLD.
- Keys: `gam-cv-alpha` α (0.4, ≥ 0; the paper's value for FedGAM-CV, Sec. 5.3.3) and the
  `gam-*` keys of FedGAM (all but `gam-alpha`).
- Readings: the server divides by the number of clients that replied, as the paper's Eq. 22
  writes; the paper's code and SCAFFOLD divide by N, which is the same under the paper's full
  participation. α has its own key because the run config is one flat namespace and FedGAM's
  default α is 0.2.

Summary: client GAM gradient + c − c_i | server c update | client state c_i | server state c |
traffic c down, Δc_i up
"""

from __future__ import annotations

from clients.control_variates import CORRECTION, control_variate_arrays, control_variate_begin, control_variate_end
from clients.gam import GAM_KEYS, gam_gradient
from protocol.keys import Key, non_negative
from protocol.layout import trainable_param_names
from tasks.functional.update import LocalUpdate


def gam_cv_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """G, FedGAM's gradient with alpha = ``gam-cv-alpha``; the correction c - c_i is its term."""
    grads, new_buffers, loss = gam_gradient(model, params, buffers, x, y, hp, hp.keys["gam-cv-alpha"])
    return grads, new_buffers, carry, loss


# d = G + (c - c_i); c, c_i and delta c_i as SCAFFOLD's.
UPDATE = LocalUpdate("fedgam-cv", gam_cv_direction, control_variate_begin, control_variate_end, terms=(CORRECTION,),
                     keys={**GAM_KEYS, "gam-cv-alpha": Key(0.4, non_negative, ">= 0 (FedGAM-CV trade-off alpha)")},
                     **control_variate_arrays(trainable_param_names), step_cost=2.0, module=__name__)
