"""FedPGVC's local update, the paper's text reading (``pgvc-variant = "text"``), as a
``LocalUpdate``; the reading itself, and the authors' code reading, are in clients/fedpgvc.py.

Per batch, from ONE forward pass with per-sample losses l_b: every parameter gets
g = grad mean_b l_b; the parameters of the last ``pgvc-layers`` Linear layers (the mask) get
g + r, r = (1/B) sum_b l_b grad l_b = grad (1/2) mean_b l_b^2. The loss is mean_b l_b. The
mask is found on the model skeleton (``tasks.models.last_layers_param_names``: its structure,
not its weights), so every client of a cohort has the same one. The same tensor operations in
the same order as the hook the client ran before (bit for bit on CPU,
tests/test_functional_pgvc.py; scripts/same_metrics.py).

The authors' reading is not a ``LocalUpdate``: after training it rescales the weights of its
masked layers by factors from a pass over the client's whole training set, and ``end`` can
change neither the weights nor see the model, its buffers or the data. It stays on the client's
hook path (``FedPGVCClient.local_update`` is None for it, which a cohort node refuses).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch.func import functional_call

from tasks.functional.distillation import clone_tree, value_grads
from tasks.functional.methods import LocalUpdate
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
