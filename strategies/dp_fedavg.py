"""DP-FedAvg: central DP with fixed clipping, via Flower's strategy wrappers.

``dp-mode = "server"``: ``DifferentialPrivacyServerSideFixedClipping`` clips every client
update w_k - w_t to norm C on the server; ``"client"``: ``DifferentialPrivacyClientSideFixedClipping``
sends C in the fit config and Flower's ``fixedclipping_mod`` (installed in
fl_app/client_app.py for these runs only) clips on the client. Either way Gaussian noise
of std z * C / m is added to the aggregate (z = noise multiplier, m = sampled clients).

Choices: the wrapped FedAvg takes the UNWEIGHTED mean of the clipped updates, since the
wrappers' noise std z*C/m is calibrated to the sensitivity C/m of a uniform mean (an
n_k-weighted mean has sensitivity up to C); m is the number of clients actually sampled
in the round (the wrappers need it, and it is not known before clients connect). The
epsilon reported per round (``dp_epsilon``, at ``dp-delta``) is the RDP bound of the
Poisson-subsampled Gaussian mechanism at q = m / N over the rounds so far (Mironov et
al. 2019, integer orders 2..256), an approximation for fixed-size sampling as in
McMahan et al. 2018; it is omitted when z = 0.

``dp-noise-seeded``: the noise drawn from (seed, round), see ``global_numpy_seeded`` and
clients/dp_fedavg.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from flwr.common import FitRes
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.supercore.differential_privacy import compute_stdv

from protocol.keys import ConfigError, Key, non_negative, positive
from strategies.arrays import total_clients
from strategies.base import DriftFedAvg, FromConfig
from tasks.datasets import input_shape
from tasks.models import MODELS, build_model, probe_shape

DP_MODES = ("client", "server")


def _log_binomial(a: int, k: np.ndarray) -> np.ndarray:
    lg = np.vectorize(math.lgamma)
    return math.lgamma(a + 1) - lg(k + 1) - lg(a - k + 1)


def _logsumexp(values: np.ndarray) -> float:
    top = float(np.max(values))
    return top + math.log(float(np.sum(np.exp(values - top))))


def rdp_epsilon(q: float, noise_multiplier: float, rounds: int, delta: float) -> float:
    """(epsilon, delta)-DP after ``rounds`` Poisson-subsampled Gaussian steps (RDP bound)."""
    if rounds == 0 or q <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    best = math.inf
    for a in range(2, 257):
        if q >= 1:
            rdp = a / (2 * noise_multiplier**2)
        else:
            k = np.arange(a + 1)
            log_terms = (
                _log_binomial(a, k)
                + k * math.log(q) + (a - k) * math.log1p(-q)
                + (k * k - k) / (2 * noise_multiplier**2)
            )
            rdp = _logsumexp(log_terms) / (a - 1)
        best = min(best, rounds * rdp + math.log(1 / delta) / (a - 1))
    return best


@contextmanager
def global_numpy_seeded(seed: int | None, server_round: int) -> Iterator[None]:
    """NumPy's global generator seeded by (seed, round) inside the block and restored after it
    (Flower's DP wrappers draw their noise from it); no change at all when ``seed`` is None."""
    if seed is None:
        yield
        return
    saved = np.random.get_state()
    np.random.seed(int(np.random.SeedSequence([seed, server_round]).generate_state(1)[0]))
    try:
        yield
    finally:
        np.random.set_state(saved)


class UniformFedAvg(DriftFedAvg):
    """FedAvg with equal client weights (the mean the DP noise is calibrated for)."""

    def aggregate_fit(self, server_round, results, failures):
        uniform = [
            (c, FitRes(status=r.status, parameters=r.parameters, num_examples=1, metrics=r.metrics))
            for c, r in results
        ]
        return super().aggregate_fit(server_round, uniform, failures)


class _Accounting:
    """Sets the wrappers' num_sampled_clients from the real sample; reports epsilon."""

    def __init__(self, strategy, noise_multiplier, clipping_norm, num_sampled_clients, delta, noise_seed=None):
        super().__init__(strategy, noise_multiplier, clipping_norm, num_sampled_clients)
        self.delta = delta
        self.noise_seed = noise_seed  # None: Flower's unseeded draw (see dp-noise-seeded)
        self.rounds = 0
        self.sampling_rate = 1.0

    def get_state(self) -> dict[str, list[np.ndarray]]:
        """For checkpoints: the rounds released so far and the sampling rate (epsilon)."""
        return {"dp-accounting": [np.array([self.rounds, self.sampling_rate], dtype=np.float64)]}

    def set_state(self, state: dict[str, list[np.ndarray]]) -> None:
        if "dp-accounting" in state:
            rounds, rate = state["dp-accounting"][0]
            self.rounds, self.sampling_rate = int(rounds), float(rate)

    def configure_fit(self, server_round, parameters, client_manager):
        instructions = super().configure_fit(server_round, parameters, client_manager)
        if instructions:
            self.num_sampled_clients = len(instructions)
            self.sampling_rate = len(instructions) / max(total_clients(client_manager) or 0, len(instructions))
        return instructions

    def aggregate_fit(self, server_round, results, failures):
        with global_numpy_seeded(self.noise_seed, server_round):
            parameters, metrics = super().aggregate_fit(server_round, results, failures)
        if parameters is None:
            return parameters, metrics
        self.rounds += 1
        metrics = dict(metrics or {})
        metrics["dp_noise_std"] = compute_stdv(self.noise_multiplier, self.clipping_norm, self.num_sampled_clients)
        if self.noise_multiplier > 0:
            metrics["dp_epsilon"] = rdp_epsilon(self.sampling_rate, self.noise_multiplier, self.rounds, self.delta)
        return parameters, metrics


class DPServerSideClipping(_Accounting, DifferentialPrivacyServerSideFixedClipping):
    pass


class DPClientSideClipping(_Accounting, DifferentialPrivacyClientSideFixedClipping):
    pass


class DPFedAvgStrategy(FromConfig):
    """Builds the Flower DP wrapper around a uniform-mean FedAvg (``from_config``)."""

    UNIFORM_MEAN = True  # UniformFedAvg: the mean the noise std z*C/m is calibrated for
    SCREENING = ()
    REPLY_SUMS = None  # a plain mean over clients, each update clipped on its own
    SCREENING_WHY = ("it clips every update to dp-clipping-norm already, and screening against the "
                     "round's median would let one client's data change another client's "
                     "contribution, which the reported epsilon does not account for")
    CONFIG_KEYS = {
        "dp-mode": Key("client", choices=DP_MODES),
        "dp-noise-multiplier": Key(0.1, non_negative, ">= 0"),
        "dp-clipping-norm": Key(1.0, positive, "> 0"),
        "dp-delta": Key(1e-5, lambda v: 0 < v < 1, "in (0, 1)"),
        "dp-noise-seeded": Key(False),  # noise from (seed, round): reproducible, not private
    }

    @classmethod
    def from_config(cls, cfg: dict, **kwargs):
        model = build_model(cfg["model"], input_shape(cfg["dataset"]))
        integer = [k for k, v in model.state_dict().items() if not v.is_floating_point()]
        if integer:
            ok = ", ".join(n for n in MODELS if all(
                v.is_floating_point() for v in build_model(n, probe_shape(n)).state_dict().values()))
            raise ConfigError(
                f"run-config key 'model' = {cfg['model']!r} is invalid for strategy 'dp-fedavg':"
                f" its integer buffers ({', '.join(integer)}) cannot be clipped or noised;"
                f" valid choices: {ok}"
            )
        wrapper = DPClientSideClipping if cfg["dp-mode"] == "client" else DPServerSideClipping
        return wrapper(
            UniformFedAvg(**kwargs),
            noise_multiplier=cfg["dp-noise-multiplier"],
            clipping_norm=cfg["dp-clipping-norm"],
            num_sampled_clients=max(1, cfg["min-fit-clients"]),  # replaced by the real sample size
            delta=cfg["dp-delta"],
            noise_seed=cfg["seed"] if cfg["dp-noise-seeded"] else None,
        )
