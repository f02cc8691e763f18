"""FedPGVC's local update, the paper's text reading (``pgvc-variant = "text"``), as a
``LocalUpdate``; the reading itself, and the authors' code reading, are in clients/fedpgvc.py.

Per batch, from ONE forward pass with per-sample losses l_b: every parameter gets
g = grad mean_b l_b; the parameters of the last ``pgvc-layers`` Linear layers (the mask) get
g + r, r = (1/B) sum_b l_b grad l_b = grad (1/2) mean_b l_b^2. The loss is mean_b l_b. The
mask is found on the model skeleton (``tasks.models.last_layers_param_names``: its structure,
not its weights), so every client of a cohort has the same one. The same tensor operations in
the same order as the module-based step the client ran before its conversion (bit for bit on
CPU, tests/test_functional_pgvc.py; scripts/same_metrics.py).

The authors' reading (``pgvc-variant = "authors"``, clients/fedpgvc.py) is two functions:
its local training is the plain cross-entropy step (``FEDPGVC_AUTHORS``: FedAvg's direction
under its own name), and after the round ``authors_rescale`` rescales the weights of the code's
masked layers by factors from one eval-mode pass over the client's whole training set. The
rescale needs the model, its trained weights and the client's data, which a ``LocalUpdate``'s
``end`` does not see, so the client applies it to the round's result
(``FedPGVCClient.finish_functional``), on the per-client path and on a cohort node alike.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.func import functional_call

from tasks.functional.distillation import clone_tree, value_grads
from tasks.functional.methods import FEDAVG, LocalUpdate
from tasks.keras_layers import pgvc_code_layers
from tasks.models import last_layers_param_names


def pgvc_direction(model, params, buffers, x, y, w_t, ctx, hp):
    """d = g on every parameter, plus r on the last ``pgvc-layers`` Linear layers (module docstring)."""
    masked = last_layers_param_names(model, int(hp.keys["pgvc-layers"]))

    def objective(p):
        new_buffers = clone_tree(buffers)
        losses = F.cross_entropy(functional_call(model, (p, new_buffers), (x,)), y, reduction="none")
        return (0.5 * losses.pow(2).mean(), losses.mean()), new_buffers

    (rho, grads), (_, loss), new_buffers = value_grads(objective, params, hp, wrt=(masked, list(params)))
    return {n: g.add(rho[n]) if n in rho else g for n, g in grads.items()}, new_buffers, loss


FEDPGVC = LocalUpdate("fedpgvc", pgvc_direction, keys=("pgvc-layers",))


# ------------------------------------------------------------------------- the authors' code
FEDPGVC_AUTHORS = replace(FEDAVG, name="fedpgvc-authors")
"""The authors' reading's local training: the plain cross-entropy step with the run's optimiser
(the code trains with Keras ``Adam()`` on the plain loss); ``authors_rescale`` follows the round."""


def code_rhos(model, params, buffers, x, y, indices: list[int], chunk: int) -> dict[int, float]:
    """rho_j = l_j * mean(G_j) for each j of ``indices``, as FedPGVC's released code pairs them:
    l_j the loss of sample j of (x, y), G_j the gradient of sum_i l_i (all of x) with respect to
    the j-th parameter tensor of ``model`` (its ``named_parameters`` order), at weights
    ``params`` and buffers ``buffers``, in the model's current mode (``functional_call``; the
    module's own weights are not read).

    The sum runs over slices of ``chunk`` samples to bound memory; it is the code's single pass
    up to float rounding (tests/test_fedpgvc_authors.py checks two slices against hand
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
    (tests/test_functional_pgvc.py)."""
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
