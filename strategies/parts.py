"""The server-side parts several methods share, each rule written once and named in a method's
declaration (``strategies.declared.ServerSide``), never by inheriting another method's Strategy:

- ``Drift`` (live: ``DriftMemory``): FedDyn's server state H = −h/α, the mean accumulated client
  drift over all N clients (FedDyn, FedSMOO, FedSpeed, FedDC), which also forms the new model:

  ```
  H       ← H + (1/N) Σ_{k∈S_t} (w_k − w_t)
  w_{t+1} = (1/|S_t|) Σ_{k∈S_t} w_k + H
  ```

  on the trainable entries (buffers: the plain mean), written without dividing by α, so α = 0
  is allowed. Algorithm 1's mean is the unweighted one.
- ``ControlVariates`` (live: ``ServerControlVariates``): SCAFFOLD's c, one array per parameter
  that carries a control variate (state_dict order), sent as ``c`` after the weights, moved by
  the replies' ``delta_c``: c ← c + (γ/D) Σ_{i∈S_t} Δc_i, D = N (``total``, SCAFFOLD) or
  |S_t| (``participants``, FedGAM-CV's Eq. 22), γ = 1 unless a key names it (FedMoSWA's
  momentum m ← m + γ (1/|S_t|) Σ (c_i⁺ − m), whose first update may take γ = 1:
  ``FIRST_MEAN``).
- ``Lookahead`` (live: ``ServerLookahead``): FedSWA's and FedMoSWA's server step, which forms
  the model: w_{t+1} = w_t + α ((1/|S_t|) Σ_{i∈S_t} w_i − w_t) on the trainable entries
  (buffers: the plain mean); α = 1 is the plain mean (``lookahead``, the rule FedCM's
  ``ClientMomentum`` forms its model with too, α = η_g).

- ``ClientMomentum`` (live: ``GlobalDirection``): FedCM's and MoFedSAM's server, which forms
  the model from the replies' mean update and keeps that update, per local step, as the
  direction every client of the next round mixes into its own (``delta`` down):

  ```
  Δ̄_t     = (1/|S_t|) Σ_{i∈S_t} (w_i − w_t)
  w_{t+1} = w_t + η_g Δ̄_t
  Δ_{t+1} = −Δ̄_t / (η_t K̄_t),      K̄_t = E · mean_{i∈S_t} n_i / B
  ```

  on the trainable entries (buffers: the plain mean), Δ_1 = 0, η_t the round's learning rate
  (``learning-rate`` · ``lr-decay``^(t−1)), E ``local-epochs``, B ``batch-size``, n_i each
  reply's ``num_examples``: FL-Simulator's ``Averaged_update / local_iteration / lr``, its
  ``local_iteration`` E n_0 / B (client 0's size; its partitions are equal-sized) taken over
  the mean size of the round's replies. The mean is the unweighted one of the paper and the code.

A part's declaration (a frozen dataclass: what is fixed for the method) says which
``protocol.traffic`` groups it sends (``SENDS``) and reads (``READS``), whether it forms the
new model (``AGGREGATES``), whether it revises the model once formed (``REVISES``, False when
absent: CCVR's calibrated head, ``strategies/ccvr.py``), the run-config keys it reads
(``keys_read``), and builds the live part (its state) from a run config (``build``) or from
explicit values (``part``). A live part
follows ``Part``. N is ``strategies.arrays.total_clients``, read when the round's clients are
sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from torch import nn

from protocol.keys import ConfigError
from protocol.layout import cv_names_in_state_order, trainable_mask, trainable_param_names
from strategies.arrays import cast_like, restored_like
from tasks.optim import linear_step_problem

DIVISORS = ("participants", "total")
Names = Callable[[nn.Module, Mapping], Sequence[str]]


@dataclass(frozen=True)
class Replies:
    """One round's replies as the parts read them (``strategies.declared.DeclaredStrategy``)."""

    weights: list[list[np.ndarray]]
    """Each reply's model arrays (a reply may stand for several clients: their n_k-weighted mean)."""
    up: list[dict[str, list[np.ndarray]]]
    """Each reply's groups after the weights, by their ``protocol.traffic`` names."""
    clients: int
    """|S_t|: the clients the replies stand for (``protocol.traffic.clients_in``)."""
    total: int | None
    """N (``strategies.arrays.total_clients``), None when unknown."""
    w_t: list[np.ndarray]
    """The weights the round's fit instructions carried."""
    examples: Sequence[int] = ()
    """Each reply's ``num_examples`` (n_k; a summed reply's, the sum of its clients')."""
    server_round: int = 0
    """The round the replies answer (1 for the first; 0 when unknown)."""


class Part:
    """What a live part does for the generic Strategy; every method a no-op by default. The
    groups ``down`` and ``up_sizes`` name are its declaration's ``SENDS`` and ``READS``."""

    def down(self) -> dict[str, list[np.ndarray]]:
        """{down group: arrays} appended after the weights of every fit instruction."""
        return {}

    def up_sizes(self) -> dict[str, int]:
        """{up group: how many arrays it has} in every reply."""
        return {}

    def revise(self, weights: list[np.ndarray], replies: Replies) -> list[np.ndarray]:
        """The new model revised from the round's replies (called only for a part whose
        declaration sets ``REVISES``, after the model is formed, before ``update``)."""
        return weights

    def update(self, replies: Replies) -> None:
        """Move the part's state by the round's replies (after the new model is formed)."""

    def metrics(self) -> dict[str, float]:
        """Round metrics, after ``update``."""
        return {}

    def records(self) -> dict[str, list[np.ndarray]]:
        """Checkpoint records (``fl_app/server/checkpoint.py``)."""
        return {}

    def restore(self, state: Mapping[str, list]) -> None:
        """The part's state from ``records``' entries in ``state`` (absent ones: unchanged)."""


def norm(arrays: list[np.ndarray]) -> float:
    """The Euclidean norm of ``arrays`` as one vector (float64 squares)."""
    return float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)))


# ------------------------------------------------------------------ FedDyn's H
@dataclass(frozen=True)
class Drift:
    """Declares FedDyn's H (module docstring): ``alpha`` the run-config key of α, ``metric`` the
    round metric of its norm (of h = −α H with ``h_metric``, else of H), ``record`` the prefix of
    its checkpoint records: ``<record>-H`` always, and ``<record>-h`` (h = −α H, from which an
    older record restores) with ``with_h``."""

    alpha: str
    metric: str
    h_metric: bool = False
    record: str = "feddyn"
    with_h: bool = True
    SENDS: ClassVar[tuple[str, ...]] = ()
    READS: ClassVar[tuple[str, ...]] = ()
    AGGREGATES: ClassVar[bool] = True  # the plain mean plus H: Algorithm 1's (1/|S_t|) sum

    def keys_read(self) -> tuple[str, ...]:
        return (self.alpha,)

    def check(self, cfg: dict) -> None:
        """Nothing refused."""

    def build(self, cfg: dict, model: nn.Module) -> DriftMemory:
        return self.part(trainable_mask(model), cfg[self.alpha])

    def part(self, trainable: list[bool], alpha: float) -> DriftMemory:
        return DriftMemory(self, trainable, alpha)


class DriftMemory(Part):
    """FedDyn's H (module docstring) for the declaration ``spec``; ``trainable``: which
    state_dict entries it covers."""

    def __init__(self, spec: Drift, trainable: list[bool], alpha: float):
        self.spec = spec
        self.trainable = trainable
        self.alpha = alpha
        self.H: list[np.ndarray] | None = None  # float64, one array per state_dict entry

    def __repr__(self) -> str:
        return f"DriftMemory({self.spec.alpha}={self.alpha})"

    @property
    def h(self) -> list[np.ndarray] | None:
        """The paper's server state h = −α H (None before the first aggregation)."""
        return None if self.H is None else [-self.alpha * a for a in self.H]

    def aggregate(self, replies: Replies) -> list[np.ndarray]:
        """H ← H + (1/N) Σ_k (w_k − w_t), then the new global model mean_k(w_k) + H (trainable
        entries; buffers: the plain mean), each array in its own dtype. N is at least the
        replies' count."""
        clients, w_t = replies.weights, replies.w_t
        n_total = max(replies.total or len(clients), len(clients))
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

    def metrics(self) -> dict[str, float]:
        return {self.spec.metric: self.norm(self.h if self.spec.h_metric else None)}

    def records(self) -> dict[str, list[np.ndarray]]:
        """H exactly, and with ``with_h`` the paper's h = −α H (nothing before the first
        aggregation)."""
        if self.H is None:
            return {}
        own = {f"{self.spec.record}-H": [a.copy() for a in self.H]}
        return {f"{self.spec.record}-h": self.h, **own} if self.spec.with_h else own

    def restore(self, state: Mapping[str, list]) -> None:
        """H from ``records``' record (or, with ``with_h``, from an older h = −α H)."""
        H, h = f"{self.spec.record}-H", f"{self.spec.record}-h"
        if H in state:
            self.restore_H(state[H])
        elif self.spec.with_h and h in state:
            self.restore_H([-np.asarray(a, dtype=np.float64) / self.alpha for a in state[h]])

    def restore_H(self, arrays: list) -> None:
        """H from a checkpoint, refused unless it has one array per state_dict entry."""
        H = [np.asarray(a, dtype=np.float64) for a in arrays]
        if len(H) != len(self.trainable):
            raise ValueError(f"checkpointed H has {len(H)} arrays, expected {len(self.trainable)}")
        self.H = H


# ------------------------------------------------------------------ SCAFFOLD's c
def cv_shapes(model: nn.Module, cfg: dict, select: Names) -> list[tuple]:
    """The shapes of c: one per parameter ``select(model, cfg)`` names, in state_dict order."""
    state = model.state_dict()
    return [tuple(state[n].shape) for n in cv_names_in_state_order(model, select(model, cfg))]


FIRST_MEAN, ZERO_START = "first-mean", "zero"
STARTS = (FIRST_MEAN, ZERO_START)
"""How a ``ControlVariates`` part with a gain starts: ``first-mean``, its first update takes
γ = 1 (c becomes the first round's mean Δc: the FedSWA authors' ``apply_weights_SCAF``, whose
empty ``ps_c`` is set to that mean); ``zero``, c = 0 and every update takes γ."""


@dataclass(frozen=True)
class ControlVariates:
    """Declares SCAFFOLD's c (module docstring): ``scope`` names the parameters that carry a
    control variate (the same function as the client's ``LocalUpdate`` arrays), ``divisor`` the
    D of its update, unless ``divisor_key`` names the run-config key that chooses it;
    ``gain_key`` the key of its γ (1 when empty) and ``start_key`` the key of how it starts
    (``STARTS``; ``zero`` when empty). Option II control variates need a step linear in the
    gradient: Adam and AdamW are refused."""

    scope: Names = trainable_param_names
    divisor: str = "total"
    divisor_key: str = ""
    gain_key: str = ""
    start_key: str = ""
    SENDS: ClassVar[tuple[str, ...]] = ("c",)
    READS: ClassVar[tuple[str, ...]] = ("delta_c",)
    AGGREGATES: ClassVar[bool] = False

    def __post_init__(self):
        if self.divisor not in DIVISORS:
            raise ValueError(f"cv_divisor {self.divisor!r} is not one of {DIVISORS}")

    def keys_read(self) -> tuple[str, ...]:
        return tuple(k for k in (self.divisor_key, self.gain_key, self.start_key) if k)

    def check(self, cfg: dict) -> None:
        refuse_nonlinear_optimiser(cfg)

    def build(self, cfg: dict, model: nn.Module) -> ServerControlVariates:
        divisor = cfg.get(self.divisor_key, self.divisor) if self.divisor_key else self.divisor
        gain = float(cfg[self.gain_key]) if self.gain_key else 1.0
        full_first = bool(self.start_key) and cfg[self.start_key] == FIRST_MEAN
        return self.part(cv_shapes(model, cfg, self.scope), divisor, gain, full_first)

    def part(self, shapes: list[tuple], divisor: str | None = None, gain: float = 1.0,
             full_first: bool = False) -> ServerControlVariates:
        return ServerControlVariates(shapes, divisor or self.divisor, gain, full_first)


class TravellingState(Part):
    """A part whose state is one group of float32 arrays, the attribute ``STATE``, sent after the
    weights as the down group ``SENT``; each reply carries as many arrays as the up group
    ``READ``; checkpointed as the record ``RECORD`` (restored only in the same shapes)."""

    STATE: ClassVar[str]
    SENT: ClassVar[str]
    READ: ClassVar[str]
    RECORD: ClassVar[str]

    def down(self) -> dict[str, list[np.ndarray]]:
        return {self.SENT: getattr(self, self.STATE)}

    def up_sizes(self) -> dict[str, int]:
        return {self.READ: len(getattr(self, self.STATE))}

    def records(self) -> dict[str, list[np.ndarray]]:
        return {self.RECORD: [a.copy() for a in getattr(self, self.STATE)]}

    def restore(self, state: Mapping[str, list]) -> None:
        if self.RECORD in state:
            current = getattr(self, self.STATE)
            setattr(self, self.STATE, restored_like(state[self.RECORD], current, np.float32, self.STATE))


class ServerControlVariates(TravellingState):
    """SCAFFOLD's server control variate c (module docstring); round metric ``cv_norm`` = ||c||.
    ``gain`` is γ; with ``full_first`` the first update takes γ = 1 (``FIRST_MEAN``), and whether
    it has happened is checkpointed (``cv-started``), so a resumed run steps as the uninterrupted one."""

    STATE, SENT, READ, RECORD = "c", "c", "delta_c", "cv-c"

    def __init__(self, shapes: list[tuple], divisor: str = "total", gain: float = 1.0, full_first: bool = False):
        if divisor not in DIVISORS:
            raise ValueError(f"cv_divisor {divisor!r} is not one of {DIVISORS}")
        self.divisor, self.gain, self.full_first = divisor, gain, full_first
        self.started = False  # whether c has been updated once (read with full_first only)
        self.c = [np.zeros(s, dtype=np.float32) for s in shapes]

    def __repr__(self) -> str:
        return f"ServerControlVariates(cv_divisor={self.divisor!r})"

    def update(self, replies: Replies) -> None:
        """c ← c + (γ/D) Σ_i Δc_i over the replies' ``delta_c`` (float64 sums, float32 c), D =
        |S_t| (``replies.clients``: a reply may be a sum of several) or N (when known); γ = 1 on the
        first update with ``full_first``."""
        deltas = [groups["delta_c"] for groups in replies.up]
        d = replies.clients if self.divisor == "participants" else (replies.total or replies.clients)
        gain = 1.0 if self.full_first and not self.started else self.gain
        self.c = [(c.astype(np.float64) + gain * sum(x[i].astype(np.float64) for x in deltas) / d).astype(np.float32)
                  for i, c in enumerate(self.c)]
        self.started = True

    def metrics(self) -> dict[str, float]:
        return {"cv_norm": norm(self.c)}

    def records(self) -> dict[str, list[np.ndarray]]:
        own = super().records()
        return {**own, "cv-started": [np.array([int(self.started)])]} if self.full_first else own

    def restore(self, state: Mapping[str, list]) -> None:
        super().restore(state)
        if self.full_first and "cv-started" in state:
            self.started = bool(np.asarray(state["cv-started"][0]).reshape(-1)[0])


def refuse_nonlinear_optimiser(cfg: dict) -> None:
    """Option II control variates need a step linear in the gradient: Adam and AdamW refused,
    in one line, wherever the config is validated."""
    problem = linear_step_problem(cfg["optimizer"], cfg["strategy"])
    if problem:
        raise ConfigError(problem)


# ------------------------------------------------------------------ FedCM's global direction
MOMENTUM_WHY = ("w = w_t + eta_g * mean(w_i - w_t) and Delta formed from that same plain mean: a coordinate-wise "
                "median of the weights would not match the Delta the next round's clients receive")
"""Why a ``ClientMomentum`` server refuses the median screenings (its ``screening_why``)."""


@dataclass(frozen=True)
class ClientMomentum:
    """Declares FedCM's and MoFedSAM's server (module docstring): ``server_lr`` the run-config key
    of η_g, ``record`` the checkpoint record of Δ, ``metric`` the round metric of ‖Δ‖."""

    server_lr: str
    record: str
    metric: str
    SENDS: ClassVar[tuple[str, ...]] = ("delta",)
    READS: ClassVar[tuple[str, ...]] = ()
    AGGREGATES: ClassVar[bool] = True  # w_t + η_g times the unweighted mean update

    def keys_read(self) -> tuple[str, ...]:
        return (self.server_lr,)

    def check(self, cfg: dict) -> None:
        """Δ is a per-step gradient only for a step linear in it: Adam and AdamW refused."""
        refuse_nonlinear_optimiser(cfg)

    def build(self, cfg: dict, model: nn.Module) -> GlobalDirection:
        return self.part(cv_shapes(model, cfg, trainable_param_names), trainable_mask(model), cfg[self.server_lr],
                         cfg["learning-rate"], cfg["lr-decay"], cfg["local-epochs"], cfg["batch-size"])

    def part(self, shapes, trainable, server_lr, lr, lr_decay, epochs, batch_size) -> GlobalDirection:
        return GlobalDirection(self, shapes, trainable, server_lr, lr, lr_decay, epochs, batch_size)


class GlobalDirection(TravellingState):
    """Δ, one float32 array per trainable parameter, sent as ``delta`` (module docstring)."""

    STATE, SENT, READ = "delta", "delta", ""

    def __init__(self, spec: ClientMomentum, shapes: list[tuple], trainable: list[bool], server_lr: float,
                 lr: float, lr_decay: float, epochs: int, batch_size: int):
        if len(shapes) != sum(trainable):
            raise ValueError(f"{spec.record}: {len(shapes)} trainable parameters, {sum(trainable)} trainable entries")
        self.spec, self.RECORD = spec, f"{spec.record}-delta"
        self.trainable, self.server_lr = trainable, server_lr
        self.lr, self.lr_decay, self.epochs, self.batch_size = lr, lr_decay, epochs, batch_size
        self.delta = [np.zeros(s, dtype=np.float32) for s in shapes]
        self.mean_update: list[np.ndarray] | None = None  # Δ̄_t of the round being aggregated

    def __repr__(self) -> str:
        return f"GlobalDirection({self.spec.server_lr}={self.server_lr})"

    def up_sizes(self) -> dict[str, int]:
        return {}  # the replies carry the weights alone

    def aggregate(self, replies: Replies) -> list[np.ndarray]:
        """w_t + η_g Δ̄_t on the trainable entries, the plain mean of the replies on the buffers
        (``lookahead``)."""
        new, self.mean_update = lookahead(replies, self.trainable, self.server_lr)
        return new

    def update(self, replies: Replies) -> None:
        """Δ_{t+1} = −Δ̄_t / (η_t K̄_t); a round whose mean update is not finite keeps Δ."""
        if self.mean_update is None or not all(np.isfinite(a).all() for a in self.mean_update):
            return
        lr = self.lr * self.lr_decay ** (max(replies.server_round, 1) - 1)
        size = float(np.mean(replies.examples)) if len(replies.examples) else float(self.batch_size)
        steps = self.epochs * size / self.batch_size
        self.delta = [(-a / (lr * steps)).astype(np.float32) for a in self.mean_update]
        self.mean_update = None

    def metrics(self) -> dict[str, float]:
        return {self.spec.metric: norm(self.delta)}


# ------------------------------------------------------------------ FedSWA's lookahead step
def lookahead(replies: Replies, trainable: list[bool], rate: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(the new model, the mean update Δ̄ on the trainable entries): w_t + rate Δ̄ with
    Δ̄ = (1/|replies|) Σ_i (w_i − w_t) on the trainable entries, the plain mean of the replies on
    the buffers, each array in its own dtype (float64 sums). The one place of this rule: FedCM's
    server step (rate η_g) and FedSWA's and FedMoSWA's (rate α)."""
    new, mean_update = [], []
    for i, ref in enumerate(replies.w_t):
        mean = np.stack([w[i].astype(np.float64) for w in replies.weights]).mean(axis=0)
        if trainable[i]:
            step = mean - ref.astype(np.float64)
            mean_update.append(step)
            new.append(cast_like(ref.astype(np.float64) + rate * step, ref))
        else:
            new.append(cast_like(mean, ref))
    return new, mean_update


@dataclass(frozen=True)
class Lookahead:
    """Declares FedSWA's server step (module docstring): ``rate`` the run-config key of α, the
    step from w_t towards the plain mean of the replies (1: the mean itself)."""

    rate: str
    SENDS: ClassVar[tuple[str, ...]] = ()
    READS: ClassVar[tuple[str, ...]] = ()
    AGGREGATES: ClassVar[bool] = True  # w_t + α times the unweighted mean update

    def keys_read(self) -> tuple[str, ...]:
        return (self.rate,)

    def check(self, cfg: dict) -> None:
        """Nothing refused."""

    def build(self, cfg: dict, model: nn.Module) -> ServerLookahead:
        return self.part(trainable_mask(model), cfg[self.rate])

    def part(self, trainable: list[bool], rate: float) -> ServerLookahead:
        return ServerLookahead(self, trainable, rate)


class ServerLookahead(Part):
    """The lookahead step w_t + α (mean − w_t) (module docstring); it keeps no state."""

    def __init__(self, spec: Lookahead, trainable: list[bool], rate: float):
        self.spec, self.trainable, self.rate = spec, trainable, rate

    def __repr__(self) -> str:
        return f"ServerLookahead({self.spec.rate}={self.rate})"

    def aggregate(self, replies: Replies) -> list[np.ndarray]:
        return lookahead(replies, self.trainable, self.rate)[0]
