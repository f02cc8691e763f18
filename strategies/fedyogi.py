"""FedYogi (Reddi et al., ICLR 2021): Yogi on the mean update at the server (Flower's FedYogi).

- Client: FedAvg's (plain local SGD); the [server-optimiser rules](#server-optimisers) apply.
- Server: as `fedadam` with v ← v − (1 − β₂) Δ_t² sign(v − Δ_t²) and no bias correction
  (w_{t+1} = w_t + η m/(√v + τ)), Flower's `FedYogi`.
- State and keys: as `fedadam` (`fedopt-eta`, `fedopt-beta-1`, `fedopt-beta-2`, `fedopt-tau`).

Summary: client - | server Yogi step on the mean update | client state - | server state m, v |
traffic -
"""

from flwr.server.strategy import FedYogi

from strategies.base import MEAN_OF_WEIGHTS
from strategies.server_opt import FedOptFromConfig


class FedYogiStrategy(FedOptFromConfig, FedYogi):
    """Flower's FedYogi; m_t and v_t checkpointed."""

    SCREENING = MEAN_OF_WEIGHTS  # the step starts from Flower's weighted mean of the weights
    REPLY_SUMS = ()  # the step starts from Flower's n_k-weighted mean, nothing else per client
