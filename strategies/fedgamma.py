"""FedGamma server (Dai et al., IEEE TNNLS 2023): SCAFFOLD's, the n_k-weighted mean of the weights
and c <- c + (1/N) sum_{i in S_t} delta c_i (``strategies.control_variates.control_variate_server``;
the rules in ``clients/fedgamma.py``)."""

from __future__ import annotations

from strategies.control_variates import control_variate_server
from strategies.declared import DeclaredStrategy


class FedGammaStrategy(DeclaredStrategy):
    SERVER = control_variate_server("FedGamma")
