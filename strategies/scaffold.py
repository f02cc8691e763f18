"""SCAFFOLD (Karimireddy et al. 2020), option II control variates.

Server: n_k-weighted mean of the weights (global step size 1) and
c <- c + (1/N) sum_{i in S_t} delta c_i with N the number of clients in the federation.
"""

from strategies.control_variates import ControlVariateStrategy


class ScaffoldStrategy(ControlVariateStrategy):
    CV_DIVISOR = "total"
