"""FedAdagrad (Reddi et al., ICLR 2021): Adagrad on the mean update at the server (Flower's FedAdagrad).

v_t is the running sum of squared updates; Flower's class fixes beta_1 = 0 (no server momentum,
m_t = Delta_t) and has no beta_2, so only ``fedopt-eta`` and ``fedopt-tau`` apply to it.
"""

from flwr.server.strategy import FedAdagrad

from strategies.server_opt import FEDOPT_KEYS, FedOptFromConfig


class FedAdagradStrategy(FedOptFromConfig, FedAdagrad):
    """Flower's FedAdagrad; m_t and v_t checkpointed."""

    CONFIG_KEYS = {key: FEDOPT_KEYS[key] for key in ("fedopt-eta", "fedopt-tau")}
