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

from dataclasses import replace

import numpy as np

from clients.base import DriftClient, FunctionalRound
from tasks.functional import LocalUpdate, RoundResult
from tasks.functional.pgvc import FEDPGVC, FEDPGVC_AUTHORS, authors_rescale


class FedPGVCClient(DriftClient):
    """``"text"``: ``tasks.functional.pgvc.FEDPGVC`` (g on the body, g + rho on the last
    ``pgvc-layers`` Linear layers). ``"authors"``: ``FEDPGVC_AUTHORS`` (plain local training),
    then the released code's rescale of its masked layers (``authors_rescale``) applied to the
    round's result in ``finish_functional``, which the per-client fit and a cohort node both run.

    The update depends on the run config, so it is chosen by ``local_update_for``, not named in
    the class's ``LOCAL_UPDATE`` (the server and the cohort node ask ``local_update_for`` the
    run's config); both readings run as a cohort too."""

    # Samples per slice of the "authors" variant's post-training pass (memory bound only).
    CODE_CHUNK = 1024

    @classmethod
    def local_update_for(cls, cfg: dict) -> LocalUpdate | None:
        """FEDPGVC_AUTHORS for ``"authors"``, FEDPGVC for ``"text"`` (the default)."""
        return FEDPGVC_AUTHORS if cfg.get("pgvc-variant") == "authors" else FEDPGVC

    def finish_functional(self, job: FunctionalRound, result: RoundResult) -> tuple[list[np.ndarray], int, dict]:
        """``"authors"``: the trained weights rescaled (``authors_rescale`` over the client's
        whole training set, at the round's learning rate) before they are loaded and sent; fit
        metric ``pgvc_rescale``, the largest |lr rho_j|. ``"text"``: the base class's."""
        if job.update is FEDPGVC_AUTHORS:
            params, rescale = authors_rescale(job.model, result.params, result.buffers, job.x, job.y, job.hp.lr,
                                              self.CODE_CHUNK)
            result = replace(result, params=params, metrics={**result.metrics, "pgvc_rescale": rescale})
        return super().finish_functional(job, result)
