"""FedSOL: the local gradient is taken at weights perturbed along the gradient of a proximal
loss, which makes local learning orthogonal to what would change the proximal objective
(Lee, Jeong, Kim, Oh, Yun, CVPR 2024).

Per batch (docs/methods.md, "fedsol"):
1. L_p = KL(p_global || p_local), p = softmax(logits / T), reduction batchmean; the global
   logits come from a frozen eval-mode copy of w_g. g_p = grad of L_p w.r.t. the perturbed
   parameters: the classifier head (``fedsol-perturb = "head"``, the paper's default) or all.
   It is back-propagated from d L_p/d logits = (p_local - p_global) / (T B), which is exactly
   zero when both models give the same logits (autograd through kl_div leaves ~1e-9 noise
   there, which the normalisation in 3. would blow up to a rho-sized random perturbation).
2. Lambda_m = |w_m - w_g,m| / (||w_m - w_g,m||_2 + 1e-12) per parameter tensor m (Eq. 7,
   ``fedsol-radius = "layer"``), or per axis, Lambda = F.normalize(|w - w_g|, dim=0), each
   slice along dim 0 of a tensor scaled to unit norm (``"axis"``, the authors' code), or 1
   with ``fedsol-adaptive = false``. Lambda = 0 while w == w_g, so the round's first step is
   plain SGD.
3. eps = rho * Lambda (.) g_p / (||g_p||_2 + 1e-12), the norm over the perturbed set (Eq. 8).
4. w <- w + eps; g = grad CE(w + eps; batch) for every parameter; w restored by copy; the
   optimiser steps with g (Eq. 6).
The paper's text (Lee et al., CVPR 2024) is ``fedsol-perturb = "head"`` + ``fedsol-radius =
"layer"`` (the defaults); the authors' code, which produced the paper's tables, is
``fedsol-perturb = "all"`` + ``fedsol-radius = "axis"``: it perturbs every layer by
F.normalize(|w - w_g|, dim=0) * g_p * rho / (||g_p|| + 1e-12), ||g_p|| over the whole model.
With head perturbation the body's forward is shared between the passes (the body does not
depend on the head, so this is the same gradient at lower cost). Reports the mean L_p over
the round's batches as ``prox_loss``; ``train_loss`` is CE at the unperturbed weights.
Server: Flower's FedAvg (n_k-weighted mean, ``DriftFedAvg``); every ``fedsol-*`` key is read
here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from clients.base import DriftClient
from clients.perturbation import NORM_EPS, global_norm, perturbed
from tasks.keys import Key, positive

RADII = ("layer", "axis")


def fedsol_eps(
    weights: list[torch.Tensor],
    global_weights: list[torch.Tensor],
    prox_grads: list[torch.Tensor],
    rho: float,
    adaptive: bool = True,
    radius: str = "layer",
) -> list[torch.Tensor]:
    """eps = rho * Lambda (.) g_p / ||g_p||, ||g_p|| over all of ``prox_grads``.

    Lambda (``adaptive``; else 1) from d = |w - w_g|: ``radius = "layer"`` d / ||d|| per tensor
    (Eq. 7 of the paper's text); ``"axis"`` F.normalize(d, dim=0), i.e. d / max(||d||, 1e-12)
    with the norm over dim 0 (every column of a Linear weight, every (in, kh, kw) fibre of a
    conv weight; a bias as a whole), as the authors' code computes it.
    """
    if radius not in RADII:
        raise ValueError(f"fedsol radius {radius!r} is not one of {RADII}")
    scale = rho / (global_norm(prox_grads) + NORM_EPS)
    out = []
    for w, wg, g in zip(weights, global_weights, prox_grads):
        e = g.detach() * scale
        if adaptive:
            diff = (w.detach() - wg).abs()
            if radius == "axis":
                e = e * F.normalize(diff, p=2.0, dim=0, eps=NORM_EPS)
            else:
                e = e * (diff / (torch.linalg.vector_norm(diff) + NORM_EPS))
        out.append(e)
    return out


def proximal_kl(local_logits: torch.Tensor, global_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(p_global || p_local) with softened probabilities, averaged over the batch."""
    return F.kl_div(
        F.log_softmax(local_logits / temperature, dim=1),
        F.softmax(global_logits / temperature, dim=1),
        reduction="batchmean",
    )


class FedSOLClient(DriftClient):
    # A local step's cost relative to one SGD step, two passes: proximal, then perturbed; read by the
    # run-time estimate of `run_simulation.py --check` (fl_app/tooling/estimate.py).
    STEP_COST = 2.0
    CONFIG_KEYS = {
        "fedsol-rho": Key(1.0, positive, "> 0 (base perturbation strength rho)"),
        "fedsol-temperature": Key(3.0, positive, "> 0 (softmax temperature of the proximal KL)"),
        "fedsol-perturb": Key("head", choices=("head", "all")),
        "fedsol-adaptive": Key(True),
        # "layer": Lambda per tensor (the paper's text); "axis": F.normalize(|w - w_g|, dim=0)
        # (the authors' code; with fedsol-perturb = "all" it is the code's perturbation)
        "fedsol-radius": Key("layer", choices=RADII),
    }

    def begin_round(self, server_round: int) -> dict[str, Any] | None:
        self.global_model = self.frozen_copy()
        self.head_only = self.cfg["fedsol-perturb"] == "head"
        named = [n for n, _ in self.model.named_parameters()]
        head = {f"head.{n}" for n, _ in self.model.head.named_parameters()}
        self.perturb_index = [i for i, n in enumerate(named) if not self.head_only or n in head]
        self.prox_sum = torch.zeros((), device=self.device)
        return None

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = self.params()
        targets = [params[i] for i in self.perturb_index]
        if self.head_only:
            features = self.model.body(x)
            logits = self.model.head(features)
        else:
            logits = self.model(x)
        ce = F.cross_entropy(logits, y)
        temperature = self.cfg["fedsol-temperature"]
        with torch.no_grad():
            global_logits = self.global_model(x)
            prox = proximal_kl(logits, global_logits, temperature)
            # d L_p / d logits in closed form, (p_local - p_global) / (T B): exactly zero when
            # the two models' logits agree, so no rounding noise gets normalised into a
            # rho-sized perturbation (which autograd through kl_div would give at w == w_g)
            d_logits = (F.softmax(logits / temperature, dim=1) - F.softmax(global_logits / temperature, dim=1))
            d_logits /= temperature * len(x)
        grads = torch.autograd.grad(logits, targets, grad_outputs=d_logits, retain_graph=self.head_only,
                                    allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(targets, grads)]
        eps_targets = fedsol_eps(
            targets, [self.round_start[i] for i in self.perturb_index], grads,
            self.cfg["fedsol-rho"], self.cfg["fedsol-adaptive"], self.cfg["fedsol-radius"],
        )
        eps: list = [None] * len(params)
        for i, e in zip(self.perturb_index, eps_targets):
            eps[i] = e
        with perturbed(params, eps, self.model):
            if self.head_only:
                loss = F.cross_entropy(self.model.head(features), y)
            else:
                loss = F.cross_entropy(self.model(x), y)
            loss.backward()
        self.prox_sum += prox.detach()
        return ce.detach()

    def end_round(self, steps: int) -> dict[str, Any] | None:
        metrics = dict(super().end_round(steps) or {})
        metrics["prox_loss"] = self.prox_sum.item() / max(steps, 1)
        return metrics
