"""The loop every method's local update runs in, written once, as functions with no hidden
module state.

Contract. A method's client side is one ``LocalUpdate`` declaration (``tasks.functional.update``,
whose docstring is the contract; each method's in ``clients/<method>.py``): its step functions
are pure functions of tensors in dicts keyed by parameter name,

- ``begin(w_t, state, server, hp) -> ctx``: the round's constants (SCAFFOLD's c - c_i,
  FedDyn's g_k + alpha w_t) from the received weights w_t, the client's state from earlier
  rounds (``state``) and what the server sent besides the weights (``server``, which always
  holds the received global ``"buffers"``);
- ``direction(model, params, buffers, x, y, w_t, ctx, carry, hp) -> (d, buffers', carry', loss)``:
  the direction the optimiser applies on one batch (the gradient, corrected as the method
  says), the model's buffers after the batch's forward pass (BatchNorm running statistics; the
  first, unperturbed pass only), the per-step carried tree the update declares (``{}`` when
  none) and the batch loss at ``params``. ``model`` is only a skeleton for
  ``torch.func.functional_call``: its own weights and buffers are never read or written;
- ``end(w_t, params, buffers, carry, steps, ctx, state, hp) -> (state', sends, metrics)``: after
  the round's ``steps`` local steps, the client's new state, the arrays that go back to the
  server besides the weights and the method's fit metrics (0-dim tensors).

``hp`` (``Hyper``) holds the learning rate, the optimiser's settings and the keys the update
declares; everything else a function needs is an argument. The model runs through
``torch.func.functional_call`` on the given tensors; gradients come from
``torch.func.grad_and_value`` inside a cohort's vmap and from ``torch.autograd.grad`` on leaf
copies for one client (``core.grad_and_loss``: the same kernels, less overhead per step).
The optimiser is written out too (``tasks.functional.optim``: PyTorch's heavy-ball SGD and
Adam/AdamW, step by step as ``torch.optim`` does them, state in a dict), so one local step,
``direction`` then the optimiser, is a pure function of (params, buffers, carry, optimiser
state, batch, w_t, ctx).

Drivers (``tasks.functional.rounds``): ``local_round`` runs E epochs of one client's batches
in the per-client batch order (``tasks.train.batches`` with the client's generator), the path
of the one generic client, ``fl_app.node.drift_client.DriftClient``; ``cohort_round`` runs the same step for
K clients at once in one ``torch.func.vmap`` over their stacked weights, each client with its
own data, batch order and state, a client whose local steps are over left unchanged (masked).
The helpers the methods' step functions share (gradients of several objectives from one
forward pass, a submodule's forward, SAM's ascent step, tree arithmetic) are in
``tasks.functional.core``.

This package imports torch and ``tasks`` only, never Flower: the cohort bench
(``bench/cohort.py``) runs on a machine with torch and the checkout alone.
"""

from tasks.functional.core import Hyper, grad_and_loss, module_state, tree_norm
from tasks.functional.rounds import CohortResult, RoundResult, cohort_round, local_round
from tasks.functional.update import Arrays, LocalUpdate, Round

__all__ = [
    "Arrays", "CohortResult", "Hyper", "LocalUpdate", "Round", "RoundResult", "cohort_round", "grad_and_loss",
    "local_round", "module_state", "tree_norm",
]
