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

from clients.control_variates import ControlVariateClient
from clients.fedgam import FedGAMClient
from protocol.keys import Key, non_negative
from tasks.functional.sharpness import FEDGAM_CV


class FedGAMCVClient(ControlVariateClient, FedGAMClient):
    """``tasks.functional.sharpness.FEDGAM_CV``: the GAM gradient with ``gam-cv-alpha``, corrected by
    c - c_i; c, c_i and the reply are ``ControlVariateClient``'s."""

    LOCAL_UPDATE = FEDGAM_CV
    # FedGAM's keys but its alpha: FEDGAM_CV reads FedGAM-CV's own
    CONFIG_KEYS = {**{k: v for k, v in FedGAMClient.CONFIG_KEYS.items() if k != "gam-alpha"},
                   "gam-cv-alpha": Key(0.4, non_negative, ">= 0 (FedGAM-CV trade-off alpha)")}
