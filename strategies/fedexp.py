"""FedExP: FedAvg's clients, and a server that extrapolates past the mean update by a step size
η_g ≥ 1 computed each round from the clients' own update norms (Jhunjhunwala, Wang, Joshi,
"FedExP: Speeding Up Federated Averaging via Extrapolation", ICLR 2023).

- Client: FedAvg's (plain local SGD); nothing extra travels.
- Server (`strategies/fedexp.py`), with w_t the model sent, the M replies w_k of round t,
  Δ_k = w_k − w_t and p_k = n_k / Σ_{S_t} n_j, over the trainable parameters as one vector:

  ```
  Δ̄   = Σ_k p_k Δ_k,     A = Σ_k p_k ‖Δ_k‖²
  ε_t = ε · lr-decay^(2(t−1))
  η_g = max(1, A / (2 (‖Δ̄‖² + M ε_t)))
  w_{t+1} = w_t + η_g Δ̄
  ```

  η_g = 1 is FedAvg; the step only ever extrapolates. BatchNorm buffers take the plain
  n_k-weighted mean and count in neither norm. Server metric `fedexp_eta_g`.
- Evaluation: the model scored (by the server, and by the clients with `client-test-fraction`
  > 0) is the mean of the last two global models, (w_{t+1} + w_t)/2 on the trainable entries
  (buffers: the new ones), as the paper and the code report, because FedExP's iterates oscillate
  around the solution; after round 1 it is w_1 itself. Training continues from w_{t+1}, which
  is also what the checkpoint holds: w_t is the model the round's instructions carried, so a
  resumed run scores the same average.
- State: none on the clients; on the server only w_t, which is the checkpointed model of the
  previous round.
- Keys: `fedexp-epsilon` ε (0.001, > 0; the code's CIFAR value, 0.1 for EMNIST; its scale
  follows ‖Δ‖², so model size and lr: tune it), `fedexp-average-eval` (true: score the
  average of the last two models; false: score w_{t+1}). It reads `lr-decay`.
- Readings (authors' code Divyansh03/FedExP, which made the paper's figures): M ε in the
  denominator (the paper writes ε) and ε decayed by 0.998² per round alongside the client lr,
  here tied to `lr-decay` so that ε_t tracks η_l²; the weights p_k are n_k / Σ n_j (the code's
  and the product's; the paper's 1/M, the same on equal-size partitions such as
  `inner-dirichlet` with `size-sigma = 0`); the norms over the trainable parameters (the code's
  GroupNorm ResNet-18 has no buffers; fluke and the FedDecorr repository's port extrapolate
  the BatchNorm statistics too, which is not done here). The code's gradient clip at norm 10
  on every method is the run-wide `local-clip-norm = 10` (off by default).

Summary: client - | server step η_g ≥ 1 along the mean update, average of the last two models
evaluated | client state - | server state - | traffic -
"""

from __future__ import annotations

import numpy as np
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from protocol.keys import Key, positive
from strategies.arrays import cast_like
from strategies.base import REPLIES_ONLY, DriftFedAvg, trainable_mask


class FedExPStrategy(DriftFedAvg):
    """FedAvg's weighted mean update, extrapolated by eta_g; the average of the last two
    global models evaluated."""

    CONFIG_KEYS = {
        "fedexp-epsilon": Key(1e-3, positive, "> 0 (epsilon of the server step size; scales with ||Delta||^2)"),
        "fedexp-average-eval": Key(True, allowed="true: evaluate the mean of the last two global models"),
    }
    SCREENING = REPLIES_ONLY
    REPLY_SUMS = None  # its step size reads each client's update norm
    SCREENING_WHY = ("eta_g is computed from each reply's own update norm ||w_k - w_t||^2, not from their mean: "
                     "replies replaced by a coordinate-wise median would report no spread")

    def __init__(self, *, epsilon: float, average_eval: bool, lr_decay: float, trainable: list[bool], **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.average_eval = average_eval
        self.lr_decay = lr_decay
        self.trainable = trainable

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        return cls(epsilon=cfg["fedexp-epsilon"], average_eval=cfg["fedexp-average-eval"],
                   lr_decay=cfg["lr-decay"], trainable=trainable_mask(cfg), **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon}, average_eval={self.average_eval})"

    def server_step(self, server_round: int, deltas: list[list[np.ndarray]], p: np.ndarray) -> float:
        """eta_g = max(1, A / (2 (||mean Delta||^2 + M eps_t))) over the trainable entries'
        ``deltas`` (one list per reply, float64) with weights ``p``."""
        mean = [sum(pk * d[i] for pk, d in zip(p, deltas)) for i in range(len(deltas[0]))]
        spread = sum(pk * sum(float((a**2).sum()) for a in d) for pk, d in zip(p, deltas))
        eps_t = self.epsilon * self.lr_decay ** (2 * (server_round - 1))
        denominator = sum(float((a**2).sum()) for a in mean) + len(deltas) * eps_t
        return max(1.0, 0.5 * spread / denominator)

    def aggregate_fit(self, server_round, results, failures):
        clients = self.client_arrays(results, failures)
        if clients is None:
            return None, {}
        n = np.array([res.num_examples for _, res in results], dtype=np.float64)
        p = n / n.sum()
        w_t = self.global_weights
        trained = [i for i, t in enumerate(self.trainable) if t]
        deltas = [[c[i].astype(np.float64) - w_t[i].astype(np.float64) for i in trained] for c in clients]
        eta = self.server_step(server_round, deltas, p)
        new = []
        for i, ref in enumerate(w_t):
            mean = sum(pk * c[i].astype(np.float64) for pk, c in zip(p, clients))
            if self.trainable[i]:
                mean = ref.astype(np.float64) + eta * (mean - ref.astype(np.float64))
            new.append(cast_like(mean, ref))
        return ndarrays_to_parameters(new), {"fedexp_eta_g": eta}

    def evaluated_model(self, server_round: int, parameters):
        """The model round ``server_round`` scores: (w_{t+1} + w_t)/2 on the trainable entries
        (w_t = the model this round's instructions carried), from round 2 on with
        ``fedexp-average-eval``; else ``parameters`` itself."""
        if not self.average_eval or server_round < 2 or self.global_weights is None:
            return parameters
        new = parameters_to_ndarrays(parameters)
        averaged = [cast_like((a.astype(np.float64) + b.astype(np.float64)) / 2, a) if t else a
                    for a, b, t in zip(new, self.global_weights, self.trainable)]
        return ndarrays_to_parameters(averaged)

    def evaluate(self, server_round, parameters):
        return super().evaluate(server_round, self.evaluated_model(server_round, parameters))

    def configure_evaluate(self, server_round, parameters, client_manager):
        return super().configure_evaluate(server_round, self.evaluated_model(server_round, parameters),
                                          client_manager)
