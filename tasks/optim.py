"""The local optimiser, chosen by the run config, and what control variates need to know of it.

``optimizer`` = ``sgd`` (``momentum``, ``weight-decay``: PyTorch's heavy-ball SGD, the
optimiser of the FedSOL, RI-FedAvg and FedGAM experiments), ``adam`` (``torch.optim.Adam``,
the optimiser of every FedPGVC experiment; ``weight-decay`` is added to the gradient as L2)
or ``adamw`` (``torch.optim.AdamW``, decoupled weight decay ``weight-decay``). Adam's
betas (0.9, 0.999) and eps 1e-8 are PyTorch's defaults, fixed: no paper of the suite tunes
them. AdamW's weight decay is the run's ``weight-decay`` (default 0), not PyTorch's 0.01.

The clients run these optimisers as pure functions (``tasks.functional.optim``), their state
(momentum buffer, Adam's moments) started afresh each round, as in the papers; this module
checks the keys (the tests hold the functional ones equal to ``torch.optim``'s own).
"""

from __future__ import annotations

OPTIMIZERS = ("sgd", "adam", "adamw")


def optimizer_problem(optimizer: str, momentum: float) -> str | None:
    """Why the optimiser keys contradict each other, or None (checked before training)."""
    if optimizer != "sgd" and momentum != 0:
        return (
            f"run-config key 'momentum' = {momentum} is invalid with optimizer"
            f" {optimizer!r}: Adam's first-moment decay is fixed at PyTorch's beta1 = 0.9;"
            " set momentum = 0, or use optimizer = \"sgd\""
        )
    return None


def effective_steps(steps: int, momentum: float) -> float:
    """K_eff = sum_{s=1..K} (1 - beta^s) / (1 - beta): how many plain lr-sized steps K steps of
    heavy-ball SGD (PyTorch's, no dampening) take along a constant gradient.

    The s-th step moves by lr * g * (1 + beta + ... + beta^(s-1)). K_eff = K at beta = 0.
    Closed form (K - beta (1 - beta^K) / (1 - beta)) / (1 - beta), the "adaptive division"
    of the FedSOL authors' SCAFFOLD code (Lee et al., CVPR 2024) and FedNova's ||a||_1 for
    momentum SGD (Wang et al., NeurIPS 2020).
    """
    if momentum == 0:
        return float(steps)
    b = float(momentum)
    return (steps - b * (1 - b**steps) / (1 - b)) / (1 - b)


def scheduled_steps(factors, momentum: float) -> float:
    """sum_{s=1..K} f_s (1 - beta^s) / (1 - beta): how many plain lr-sized steps K steps of
    heavy-ball SGD take along a constant gradient when step s runs at rate f_s lr (an in-round
    schedule, ``tasks.functional.update.LocalUpdate.lr_schedule``): step s moves by
    f_s lr g (1 + beta + ... + beta^(s-1)). With every f_s = 1 it is ``effective_steps``, and
    without momentum the plain sum of the factors (FedMoSWA's sum_k eta_k / eta)."""
    b = float(momentum)
    if b == 0:
        return float(sum(float(f) for f in factors))
    return float(sum(float(f) * (1 - b**s) / (1 - b) for s, f in enumerate(factors, start=1)))


def linear_step_problem(optimizer: str, method: str) -> str | None:
    """Why option II control variates cannot run with this optimiser, or None.

    c_i+ = c_i - c + (w_t - w) / (lr K_eff) recovers the mean corrected gradient only when the
    weights move linearly in the gradients (SGD, with or without momentum); Adam's step is
    normalised per coordinate, so (w_t - w) says nothing about the gradient's size.
    """
    if optimizer == "sgd":
        return None
    return (
        f"run-config key 'optimizer' = {optimizer!r} is invalid for strategy {method!r}:"
        " its option II control variates c_i+ = c_i - c + (w_t - w)/(lr K_eff) need a local step"
        " that is linear in the gradient, which Adam's per-coordinate normalisation is not;"
        " valid choices: sgd (with any momentum)"
    )
