"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020), option II control
variates on every trainable parameter.

Client: plain local SGD corrected by c - c_i on
every step; c_i+ = c_i - c + (w_t - w)/(eta K), K = total local steps of the round.
"""

from clients.control_variates import ControlVariateClient


class ScaffoldClient(ControlVariateClient):
    """Cross-entropy gradient from the base client, corrected in ``adjust_gradients``."""
