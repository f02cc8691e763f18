"""FedAdam (Reddi et al., ICLR 2021): Adam on the mean update at the server (Flower's FedAdam).

- Client: FedAvg's (plain local SGD); the [server-optimiser rules](#server-optimisers) apply.
- Server: m ← β₁ m + (1 − β₁) Δ_t, v ← β₂ v + (1 − β₂) Δ_t², w_{t+1} = w_t + η_t m/(√v + τ),
  with Flower's bias correction η_t = η √(1 − β₂^{t+1}) / (1 − β₁^{t+1}) (t = the round).
- State: m and v (checkpointed), both zero before round 1.
- Keys: `fedopt-eta` η (0.01, > 0), `fedopt-beta-1` β₁ (0.9), `fedopt-beta-2` β₂ (0.99),
  `fedopt-tau` τ (1e-3, > 0). β₁, β₂ and τ are the paper's settings; η is Flower's FedYogi
  default, as Flower's own defaults differ per class (0.1 for FedAdam and FedAdagrad, τ 1e-9).

Summary: client - | server Adam step on the mean update | client state - | server state m, v |
traffic -
"""

from flwr.server.strategy import FedAdam

from strategies.base import MEAN_OF_WEIGHTS
from strategies.server_opt import FedOptFromConfig


class FedAdamStrategy(FedOptFromConfig, FedAdam):
    """Flower's FedAdam; m_t and v_t checkpointed."""

    SCREENING = MEAN_OF_WEIGHTS  # the step starts from Flower's weighted mean of the weights
    REPLY_SUMS = ()  # the step starts from Flower's n_k-weighted mean, nothing else per client
