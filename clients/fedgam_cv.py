"""FedGAM-CV: FedGAM's gradient corrected by SCAFFOLD control variates (Xu, Ma, Dai,
Wu, Zhou, Mathematics 2024, Algorithm 2).

Client: step w <- w - eta (G - c_i + c)
with G the FedGAM gradient (``gam-variant`` applies here too), then
c_i+ = c_i - c + (w_t - w)/(eta K) with K the round's total local steps. alpha comes from
``gam-cv-alpha`` (default 0.4). docs/methods.md, "fedgam-cv".
"""

from clients.control_variates import ControlVariateClient
from clients.fedgam import FedGAMClient
from tasks.keys import Key, non_negative


class FedGAMCVClient(ControlVariateClient, FedGAMClient):
    # FedGAM's keys (its gradient is inherited) and FedGAM-CV's own alpha
    CONFIG_KEYS = {**FedGAMClient.CONFIG_KEYS,
                   "gam-cv-alpha": Key(0.4, non_negative, ">= 0 (FedGAM-CV trade-off alpha)")}

    def gam_alpha(self) -> float:
        return self.cfg["gam-cv-alpha"]
