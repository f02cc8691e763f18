"""FedPGVC: a gradient penalty on the last layers, where heterogeneity makes gradient norms vary
most ("Harnessing Heterogeneity: Improving Convergence Through Partial Variance Control in
Federated Learning", TMLR 2026).

Two readings, chosen by `pgvc-variant`: `"text"` (the default) reads the paper's equations;
`"authors"` reproduces the authors' released code (GitHub Pranabiitp/FedPGVC, `FedPGVC.py`).

- Client, `"text"`, per batch, from one forward pass with per-sample losses ℓ_b: every parameter
  gets g = ∇ mean_b ℓ_b (plain SGD outside the mask, Eq. 13); the parameters of the last
  `pgvc-layers` Linear layers (the mask) also get (Eq. 14)

  ```
  r = (1/B) Σ_b ℓ_b ∇ℓ_b  =  ∇ (1/2) mean_b ℓ_b²
  ```

  and step with g + r. The masked layers thus minimise mean(ℓ) + (1/2) mean(ℓ²), which
  up-weights high-loss samples, as the paper's distributionally robust (WDRO) motivation
  intends; the other layers take plain SGD steps.
- Client, `"authors"`: every layer trains on the plain cross-entropy with the run's optimiser
  (the code: Keras `Adam()`, lr 0.001, batch 16, one epoch). After the last local step, in
  eval mode, one pass over the client's whole training set X (n samples, in its stored order;
  the code passes the client's arrays as one batch) gives the per-sample losses ℓ_0 … ℓ_{n−1}
  and, for each trainable tensor t of the model in order, G_t = ∇_t Σ_i ℓ_i (TensorFlow's
  gradient of a vector is that of its sum). The code then forms
  `rho_i = [np.mean(b_loss * b_grad) for b_loss, b_grad in zip(batch_loss, batch_grad)]`,
  which pairs the j-th sample with the j-th tensor: ρ_j = ℓ_j · mean(G_j), and rescales every
  weight of Keras layer j of its mask (layers 4-7 of 8, `tasks/keras_layers.py`) by
  w ← (1 − η ρ_j) w, η = the round's learning rate (the code's `eta_l = 0.001`, equal to its
  Adam rate). For the project's `lenet` those are FC 120 with ρ_5 = ℓ_5 · mean ∇(FC 120 bias),
  FC 84 with ρ_6 = ℓ_6 · mean ∇(FC 84 weight) and the head with ρ_7 = ℓ_7 · mean ∇(FC 84
  bias); layer 4 is the Flatten. The relative change |η ρ_j| is small (measured on MNIST
  Dir(0.5) lenet clients with Adam at 0.001 in rounds 1-2: 1e-5 to 5e-4), so this reading is
  close to FedAvg with the same optimiser. Fit metric `pgvc_rescale`: the largest |η ρ_j| of
  the round.
- Server: w_{t+1} = (1 − η_g) w_t + η_g (1/K) Σ_k w_k over the round's K clients (the plain
  mean of Eq. 16 and of the code's `avg_weights`), η_g = `server-lr`; η_g = 1 is the plain mean
  (`strategies/fedpgvc.py`).
- State: none.
- Keys: `pgvc-variant` (`text` | `authors`, default `text`), `pgvc-layers` (2, ≥ 1: the last two
  Linear layers; read by `"text"` only), `server-lr` η_g (1.0, > 0). Every experiment of the
  paper uses Adam (`optimizer = "adam"`). A model with fewer Linear layers than `pgvc-layers`
  (`"text"`), or whose layers in Keras order are not the eight the code's mask covers
  (`"authors"`: `lenet` qualifies, `lenet-bn` does not), is refused before training.
- Readings: the step g + r is the update the paper's convergence proof analyses (Appendix
  Eq. 20). The main text's update, w ← w − η r ⊙ g (Eq. 15), is not used: since r is roughly
  ℓ g, that step is about η ℓ g² ≥ 0 for every weight, so every masked weight would move the
  same way whatever the sign of its gradient, which is not a descent direction. η_g multiplies
  the mean as written above (Eq. 16 omits it), so that η_g = 1 is the paper's plain averaging.
  Where the code departs from the text: the penalty is applied once after training, not in
  every step (Eqs. 14-15, Algorithm 1); ρ_j is one scalar, not a per-weight vector; it is not a
  mean over a batch of ℓ_b ∇ℓ_b (Eq. 14) but one sample's loss times the mean entry of one
  tensor's summed gradient, and the tensor is picked by the layer's index among all Keras
  layers, not among trainable tensors, so a layer takes its factor from another layer's
  tensor (the head from the FC 84 bias); the step is the weight itself, w − η ρ_j w, not the
  gradient (Eq. 15); the mask covers three weighted layers, not two ("last two layers", as its
  own comment says). The code computes its loss from softmax outputs with Keras's clipping to
  [1e-7, 1 − 1e-7]; here it is the cross-entropy of the logits, which differs only where a
  probability is below 1e-7. Adam's eps is PyTorch's 1e-8 (Keras: 1e-7).

Summary: client gradient penalty on the last layers (or the code's post-training rescale) |
server plain mean, optional server lr | client state - | server state - | traffic -
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from clients.base import DriftClient
from tasks.functional import LocalUpdate
from tasks.functional.pgvc import FEDPGVC
from tasks.keras_layers import pgvc_code_layers


def code_rhos(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, indices: list[int],
              chunk: int) -> dict[int, float]:
    """ρ_j = ℓ_j · mean(G_j) for each j of ``indices``, as FedPGVC's released code pairs them:
    ℓ_j the loss of sample j of (x, y), G_j the gradient of Σ_i ℓ_i (all of x) with respect to
    the model's j-th parameter tensor, at the model's current weights and mode.

    The sum runs over slices of ``chunk`` samples to bound memory; it is the code's single
    pass up to float rounding (tests/test_fedpgvc.py checks two slices against hand arithmetic).
    """
    need = max(indices) + 1
    if len(x) < need:
        raise ValueError(f"the released code's rho_{need - 1} needs the loss of sample {need - 1};"
                         f" this client has {len(x)} samples")
    params = list(model.parameters())
    sums = [torch.zeros_like(p) for p in params]
    losses = []
    for start in range(0, len(x), chunk):
        per_sample = F.cross_entropy(model(x[start:start + chunk]), y[start:start + chunk], reduction="none")
        grads = torch.autograd.grad(per_sample.sum(), params, allow_unused=True)
        for s, g in zip(sums, grads):
            if g is not None:
                s += g
        losses.extend(per_sample.detach()[: max(0, need - len(losses))].tolist())
    return {j: losses[j] * sums[j].mean().item() for j in indices}


class FedPGVCClient(DriftClient):
    """``"text"``: ``tasks.functional.pgvc.FEDPGVC`` (g on the body, g + rho on the last
    ``pgvc-layers`` Linear layers). ``"authors"``: the hook loop's plain local training, then the
    released code's rescale of its masked layers (``end_round``), which is not a ``LocalUpdate``
    (tasks/functional/pgvc.py says why).

    The update depends on the run config, so it is chosen by ``local_update_for``, not named in
    the class's ``LOCAL_UPDATE``: ``"text"`` runs as a cohort too, ``"authors"`` is refused there
    (the server and the cohort node ask ``local_update_for`` the run's config)."""

    # Samples per slice of the "authors" variant's post-training pass (memory bound only).
    CODE_CHUNK = 1024

    @classmethod
    def local_update_for(cls, cfg: dict) -> LocalUpdate | None:
        """FEDPGVC for ``"text"``; None (the hook loop) for ``"authors"``."""
        return None if cfg.get("pgvc-variant") == "authors" else FEDPGVC

    def end_round(self, steps: int) -> dict[str, Any] | None:
        """``"authors"`` only (``"text"`` never runs the hooks): the released code's rescale."""
        layers = pgvc_code_layers(self.model)
        x, y = self.data
        self.model.eval()  # Keras's model(x) outside fit runs in inference mode
        rhos = code_rhos(self.model, x, y, [j for j, _ in layers], self.CODE_CHUNK)
        self.model.train()
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            for j, names in layers:
                for name in names:  # w - (eta rho_j) w, the code's form (no rounded 1 - eta rho_j)
                    named[name].sub_(named[name] * (self.lr * rhos[j]))
        return {"pgvc_rescale": max(abs(self.lr * r) for r in rhos.values())}
