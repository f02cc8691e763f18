"""FedAdagrad (Reddi et al., ICLR 2021): Adagrad on the mean update at the server (Flower's FedAdagrad).

- Client: FedAvg's (plain local SGD); the [server-optimiser rules](#server-optimisers) apply.
- Server: v ← v + Δ_t² (the running sum of squared updates), w_{t+1} = w_t + η Δ_t/(√v + τ),
  Flower's `FedAdagrad`.
- Reading: the paper's FedAdagrad keeps a momentum m with β₁; Flower's class fixes β₁ = 0
  (m = Δ_t) and has no β₂, and fl-drift does not rewrite it, so `fedopt-beta-1` and
  `fedopt-beta-2` do not apply.
- State: m and v (checkpointed). Keys: `fedopt-eta` η (0.01), `fedopt-tau` τ (1e-3).

Summary: client - | server Adagrad step on the mean update | client state - | server state m, v
| traffic -
"""

from flwr.server.strategy import FedAdagrad

from strategies.base import MEAN_OF_WEIGHTS
from strategies.server_opt import FEDOPT_KEYS, FedOptFromConfig


class FedAdagradStrategy(FedOptFromConfig, FedAdagrad):
    """Flower's FedAdagrad; m_t and v_t checkpointed."""

    CONFIG_KEYS = {key: FEDOPT_KEYS[key] for key in ("fedopt-eta", "fedopt-tau")}
    SCREENING = MEAN_OF_WEIGHTS  # the step starts from Flower's weighted mean of the weights
    REPLY_SUMS = ()  # the step starts from Flower's n_k-weighted mean, nothing else per client
