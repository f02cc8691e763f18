"""The in-round learning-rate decay FedSWA and FedMoSWA share (Liu et al., ICML 2025): within each
round the local rate falls linearly from η to ρ η and restarts at η the next round,

    η_k = peak · (η (1 − k/K) + (k/K) ρ η),      k = 0, …, K − 1,

K the client's local steps of the round, η the round's rate (``learning-rate`` · ``lr-decay``^(t−1)),
``peak`` the FedSWA authors' factor on the whole schedule (their SGD runs at 2 × lr). The loop
applies it as an ``lr_schedule`` (``tasks.functional.update.LocalUpdate``): these are the
factors η_k / η on the optimiser's step."""

from __future__ import annotations


def linear_decay(steps: int, rho: float, peak: float = 1.0) -> list[float] | None:
    """peak (1 − (1 − ρ) k / K) for k = 0..K−1 (K = ``steps``); None when every factor is 1 (ρ = 1
    and peak 1, or a round of one step at peak 1) or there is no step: the constant-rate loop."""
    factors = [peak * (1.0 - (1.0 - rho) * k / steps) for k in range(steps)]
    return None if all(f == 1.0 for f in factors) else factors
