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

import torch
import torch.nn.functional as F
from torch.func import functional_call

from tasks.functional.core import clone_tree, plain_direction, value_grads
from tasks.functional.update import LocalUpdate, Round
from tasks.keras_layers import pgvc_code_layers
from tasks.models import last_layers_param_names


def pgvc_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """d = g on every parameter, plus r on the last ``pgvc-layers`` Linear layers (module docstring)."""
    masked = last_layers_param_names(model, int(hp.keys["pgvc-layers"]))

    def objective(p):
        new_buffers = clone_tree(buffers)
        losses = F.cross_entropy(functional_call(model, (p, new_buffers), (x,)), y, reduction="none")
        return (0.5 * losses.pow(2).mean(), losses.mean()), new_buffers

    (rho, grads), new_buffers, (_, loss) = value_grads(objective, params, hp, wrt=(masked, list(params)))
    return {n: g.add(rho[n]) if n in rho else g for n, g in grads.items()}, new_buffers, carry, loss


def code_rhos(model, params, buffers, x, y, indices: list[int], chunk: int) -> dict[int, float]:
    """rho_j = l_j * mean(G_j) for each j of ``indices``, as FedPGVC's released code pairs them:
    l_j the loss of sample j of (x, y), G_j the gradient of sum_i l_i (all of x) with respect to
    the j-th parameter tensor of ``model`` (its ``named_parameters`` order), at weights
    ``params`` and buffers ``buffers``, in the model's current mode (``functional_call``; the
    module's own weights are not read).

    The sum runs over slices of ``chunk`` samples to bound memory; it is the code's single pass
    up to float rounding (tests/methods/test_fedpgvc_authors.py checks two slices against hand
    arithmetic). Raises ValueError when x has no sample j for the largest j."""
    need = max(indices) + 1
    if len(x) < need:
        raise ValueError(f"the released code's rho_{need - 1} needs the loss of sample {need - 1};"
                         f" this client has {len(x)} samples")
    names = [n for n, _ in model.named_parameters()]
    leaves = {n: params[n].detach().requires_grad_() for n in names}
    sums = [torch.zeros_like(leaves[n]) for n in names]
    losses: list[float] = []
    for start in range(0, len(x), chunk):
        logits = functional_call(model, (leaves, buffers), (x[start:start + chunk],))
        per_sample = F.cross_entropy(logits, y[start:start + chunk], reduction="none")
        grads = torch.autograd.grad(per_sample.sum(), [leaves[n] for n in names], allow_unused=True)
        for s, g in zip(sums, grads):
            if g is not None:
                s += g
        losses.extend(per_sample.detach()[: max(0, need - len(losses))].tolist())
    return {j: losses[j] * sums[j].mean().item() for j in indices}


def authors_rescale(model, params, buffers, x, y, lr: float, chunk: int) -> tuple[dict, float]:
    """The released code's post-training step: every weight w of each masked Keras layer j
    (``tasks.keras_layers.pgvc_code_layers``) becomes w - (lr rho_j) w, rho_j from ``code_rhos``
    over the client's whole (x, y) in eval mode (Keras's ``model(x)`` outside ``fit`` runs in
    inference mode). Returns (the new weights: ``params`` with the masked entries replaced, the
    others the same tensors; the largest |lr rho_j|, the fit metric ``pgvc_rescale``).

    Pure: ``model`` is a skeleton (its mode is restored, its weights never read or written).
    The operations are those the client ran on its module before the conversion, in the same order
    (w - w * (lr rho_j), not a rounded w * (1 - lr rho_j)), so the numbers are bit-identical
    (tests/training/test_functional_pgvc.py)."""
    layers = pgvc_code_layers(model)
    was_training = model.training
    model.eval()
    try:
        rhos = code_rhos(model, params, buffers, x, y, [j for j, _ in layers], chunk)
    finally:
        model.train(was_training)
    out = dict(params)
    with torch.no_grad():
        for j, names in layers:
            for name in names:
                out[name] = params[name] - params[name] * (lr * rhos[j])
    return out, max(abs(lr * r) for r in rhos.values())


# Samples per slice of the "authors" variant's post-training pass (memory bound only).
CODE_CHUNK = 1024


def fedpgvc_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """``"text"``: g on the body, g + r on the last ``pgvc-layers`` Linear layers
    (``pgvc_direction``); ``"authors"``: the plain cross-entropy step (the released code trains
    the plain loss), its rescale after the round (``fedpgvc_finish``)."""
    if hp.keys["pgvc-variant"] == "authors":
        return plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
    return pgvc_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)


def fedpgvc_finish(job: Round, result):
    """``"authors"``: the trained weights rescaled (``authors_rescale`` over the client's whole
    training set, at the round's learning rate) before they are sent; fit metric
    ``pgvc_rescale``, the largest |lr rho_j|. ``"text"``: the result as it is."""
    if job.hp.keys["pgvc-variant"] != "authors":
        return result
    params, rescale = authors_rescale(job.model, result.params, result.buffers, job.x, job.y, job.hp.lr, CODE_CHUNK)
    return replace(result, params=params, metrics={**result.metrics, "pgvc_rescale": rescale})


# pgvc-variant and pgvc-layers are FedPGVCStrategy's keys (its server step reads them too).
UPDATE = LocalUpdate("fedpgvc", fedpgvc_direction, reads=("pgvc-variant", "pgvc-layers"), finish=fedpgvc_finish,
                     module=__name__)
