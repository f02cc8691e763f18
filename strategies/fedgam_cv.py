"""FedGAM-CV (Xu et al., Mathematics 2024, Algorithm 2): FedGAM plus SCAFFOLD control
variates (docs/methods.md, "fedgam-cv").

Server: n_k-weighted mean of the weights and c <- c + (1/|S_t|) sum_{i in S_t} delta c_i
(paper Eq. 22; the paper's code and SCAFFOLD divide by N instead, which is the same under
the paper's full participation). Its trade-off alpha has its own key, ``gam-cv-alpha``
(default 0.4, paper Sec. 5.3.3), since the run config is one flat namespace and FedGAM's
``gam-alpha`` defaults to 0.2; every other gam-* key is shared with FedGAM.
"""

from strategies.control_variates import control_variate_server
from strategies.declared import DeclaredStrategy


class FedGAMCVStrategy(DeclaredStrategy):
    SERVER = control_variate_server("FedGAM-CV", divisor="participants")
