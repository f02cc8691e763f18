"""FedASAM: adaptive SAM (Kwon et al., ICML 2021) as the local optimiser (Caldarola, Caputo,
Ciccone, ECCV 2022).

- Client, per batch: with T = |w| + η_A elementwise for weight tensors and T = 1 for biases,

  ```
  ε = ρ T² ⊙ g / ‖T ⊙ g‖,     d = ∇f(w + ε; b), applied at w
  ```

  otherwise as FedSAM.
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`). State: none.
- Keys: `asam-rho` ρ (0.5, > 0), `asam-eta` η_A (0.01, ≥ 0): the ASAM paper's (Kwon et al.)
  CIFAR values. They have their own keys because the run config is one flat namespace and
  ASAM's radius is about ten times SAM's. Every `asam-*` key is read by the client.
- Reading: biases are not rescaled (T = 1), as in the official ASAM code, which rescales only
  parameters named `weight`.

Summary: client adaptive SAM gradient | server - | client state - | server state - | traffic -
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.keys import Key, non_negative, positive
from tasks.functional.core import NORM_EPS, Tree, grad_and_loss, perturbed_copy, tree_norm
from tasks.functional.update import LocalUpdate


def asam_scaled(names: Iterable[str]) -> dict[str, bool]:
    """Which tensors ASAM rescales: those named ``weight`` (the official ASAM code's rule),
    not biases."""
    return {n: n.rsplit(".", 1)[-1] == "weight" for n in names}


def asam_eps(params: Tree, grads: Tree, rho: float, eta: float, scaled: dict[str, bool]) -> Tree:
    """Adaptive SAM's ascent step (Kwon et al. 2021): eps = rho T^2 g / (||T g|| + NORM_EPS),
    T = |w| + eta elementwise where ``scaled[name]``, T = 1 elsewhere; the norm over all of
    ``grads``. Plain tensor ops, so vmap batches it."""
    t = {n: params[n].abs().add(eta) for n in grads if scaled[n]}
    tg = {n: t[n] * g if n in t else g for n, g in grads.items()}
    scale = rho / (tree_norm(tg.values()) + NORM_EPS)
    return {n: (v * t[n] if n in t else v) * scale for n, v in tg.items()}


def asam_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """g = grad f(w); eps = ``asam_eps``; d = grad f(w + eps), applied at w."""
    grads, new_buffers, loss = grad_and_loss(model, params, buffers, x, y, hp)
    eps = asam_eps(params, grads, hp.keys["asam-rho"], hp.keys["asam-eta"], asam_scaled(params))
    sharp, _, _ = grad_and_loss(model, perturbed_copy(params, eps), new_buffers, x, y, hp)
    return sharp, new_buffers, carry, loss


UPDATE = LocalUpdate("fedasam", asam_direction, keys={
    "asam-rho": Key(0.5, positive, "> 0 (ASAM radius)"),
    "asam-eta": Key(0.01, non_negative, ">= 0 (ASAM T_w = |w| + eta)"),
}, step_cost=2.0, module=__name__)
