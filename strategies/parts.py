"""The server-side parts several methods share, each rule written once, composed by each method's
Strategy (never by inheriting another method's Strategy):

- ``DriftMemory``: FedDyn's server state H = −h/α, the mean accumulated client drift over all N
  clients (FedDyn, FedSMOO, FedSpeed, FedDC):

  ```
  H       ← H + (1/N) Σ_{k∈S_t} (w_k − w_t)
  w_{t+1} = (1/|S_t|) Σ_{k∈S_t} w_k + H
  ```

  on the trainable entries (buffers: the plain mean), written without dividing by α, so α = 0
  is allowed. Algorithm 1's mean is the unweighted one.
- ``ServerControlVariates``: SCAFFOLD's c, one array per parameter that carries a control
  variate (state_dict order): c ← c + (1/D) Σ_{i∈S_t} Δc_i, D = N (``total``, SCAFFOLD) or
  |S_t| (``participants``, FedGAM-CV's Eq. 22).

N is the number of partitions the client manager learnt (else the connected nodes), read when
the round's clients are sampled (``total_clients``).
"""

from __future__ import annotations

import numpy as np

from protocol.keys import ConfigError
from strategies.arrays import cast_like, restored_like
from tasks.optim import linear_step_problem

DIVISORS = ("participants", "total")


class DriftMemory:
    """FedDyn's H (module docstring); ``trainable``: which state_dict entries it covers."""

    def __init__(self, trainable: list[bool]):
        self.trainable = trainable
        self.H: list[np.ndarray] | None = None  # float64, one array per state_dict entry

    def aggregate(self, clients: list[list[np.ndarray]], w_t: list[np.ndarray], n_total: int | None) -> list:
        """H ← H + (1/N) Σ_k (w_k − w_t), then the new global model mean_k(w_k) + H (trainable
        entries; buffers: the plain mean), each array in its own dtype."""
        n_total = max(n_total or len(clients), len(clients))
        if self.H is None:
            self.H = [np.zeros(a.shape, dtype=np.float64) for a in w_t]
        new = []
        for i, ref in enumerate(w_t):
            stacked = np.stack([c[i].astype(np.float64) for c in clients])
            mean = stacked.mean(axis=0)
            if self.trainable[i]:
                drift = (stacked - ref.astype(np.float64)).sum(axis=0)
                self.H[i] = self.H[i] + drift / n_total
                new.append(cast_like(mean + self.H[i], ref))
            else:
                new.append(cast_like(mean, ref))
        return new

    def norm(self, arrays: list[np.ndarray] | None = None) -> float:
        """Euclidean norm over the trainable entries of ``arrays`` (H by default; 0 before the
        first round)."""
        arrays = self.H if arrays is None else arrays
        if arrays is None:
            return 0.0
        return float(np.sqrt(sum(float((a**2).sum()) for a, m in zip(arrays, self.trainable) if m)))

    def get_state(self, alpha: float) -> dict[str, list[np.ndarray]]:
        """For checkpoints: H exactly, and the paper's h = −α H (nothing before the first
        aggregation)."""
        if self.H is None:
            return {}
        return {"feddyn-h": [-alpha * a for a in self.H], "feddyn-H": [a.copy() for a in self.H]}

    def set_state(self, state: dict[str, list[np.ndarray]], alpha: float) -> None:
        """H from ``get_state``'s record (or, from an older one, from h = −α H)."""
        if "feddyn-H" in state:
            self.restore(state["feddyn-H"])
        elif "feddyn-h" in state:
            self.restore([-np.asarray(a, dtype=np.float64) / alpha for a in state["feddyn-h"]])

    def restore(self, arrays: list) -> None:
        """H from a checkpoint, refused unless it has one array per state_dict entry."""
        H = [np.asarray(a, dtype=np.float64) for a in arrays]
        if len(H) != len(self.trainable):
            raise ValueError(f"checkpointed H has {len(H)} arrays, expected {len(self.trainable)}")
        self.H = H


class ServerControlVariates:
    """SCAFFOLD's server control variate c (module docstring)."""

    def __init__(self, shapes: list[tuple], divisor: str = "total"):
        if divisor not in DIVISORS:
            raise ValueError(f"cv_divisor {divisor!r} is not one of {DIVISORS}")
        self.divisor = divisor
        self.c = [np.zeros(s, dtype=np.float32) for s in shapes]

    def update(self, deltas: list[list[np.ndarray]], n_total: int | None, participants: int | None = None) -> None:
        """c ← c + (1/D) Σ_i Δc_i over the replies' ``deltas`` (float64 sums, float32 c).
        ``participants`` = |S_t|, the clients the replies stand for (a reply may be a sum of
        several: ``protocol.traffic.clients_in``); by default one per reply."""
        participants = participants or len(deltas)
        d = participants if self.divisor == "participants" else (n_total or participants)
        self.c = [(c.astype(np.float64) + sum(x[i].astype(np.float64) for x in deltas) / d).astype(np.float32)
                  for i, c in enumerate(self.c)]

    def norm(self) -> float:
        return float(np.sqrt(sum(float((c.astype(np.float64) ** 2).sum()) for c in self.c)))

    def get_state(self) -> dict[str, list[np.ndarray]]:
        return {"cv-c": [a.copy() for a in self.c]}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "cv-c" in state:
            self.c = restored_like(state["cv-c"], self.c, np.float32, "c")


def refuse_nonlinear_optimiser(cfg: dict) -> None:
    """Option II control variates need a step linear in the gradient: Adam and AdamW refused,
    in one line, wherever the config is validated."""
    problem = linear_step_problem(cfg["optimizer"], cfg["strategy"])
    if problem:
        raise ConfigError(problem)
