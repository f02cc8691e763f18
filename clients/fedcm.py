"""FedCM: every local step mixes the client's gradient with the server's global direction, the
previous round's mean update per local step (Xu, Wang, Wang, Yao, "FedCM: Federated Learning
with Client-level Momentum", arXiv 2021).

- Server → client: the model w_t, then Δ_t (`delta`, one array per trainable parameter, zeros
  in round 1; protocol family "client momentum").
- Client, every step on batch b (`clients.momentum`):

  ```
  d = α ∇f(w; b) + (1 − α) Δ_t          (then the run's clip, weight decay, optimiser)
  ```

  The momentum buffer is Δ_t itself: it lives on the server, is the same for every client of
  the round, constant over the round, and is replaced (never accumulated) every round; the
  client keeps nothing. α = 1 is FedAvg's client exactly.
- Server (`strategies/fedcm.py`, `strategies.parts.ClientMomentum`), over the clients S_t that
  replied, on the trainable entries (buffers: the plain mean):

  ```
  Δ̄_t     = (1/|S_t|) Σ_{i∈S_t} (w_i − w_t)
  w_{t+1} = w_t + η_g Δ̄_t
  Δ_{t+1} = −Δ̄_t / (η_t K̄_t),   K̄_t = E · mean_i n_i / B
  ```

  η_t the round's learning rate, E `local-epochs`, B `batch-size`, n_i each reply's size. The
  server keeps Δ (float32, checkpointed as `fedcm-delta`) and sends it; metric `fedcm_delta_norm`.
- Keys: `fedcm-alpha` α (0.1, in (0, 1]; the code's `--alpha` default), `fedcm-server-lr` η_g
  (1.0, > 0). Adam and AdamW are refused (Δ is a per-step SGD gradient).
- Readings (reference code: FL-Simulator `client/fedcm.py`, `server/FedCM.py`, by the FedSpeed
  and FedSMOO authors, not by the paper's; it runs by default): the means are unweighted, as in
  the paper and the code. The code's normaliser is
  `local_iteration` = E n_0 / B (client 0's size, a float: its partitions are equal-sized) and
  the learning rate of the round that produced the update (its `lr / lr_decay`); here K̄ takes
  the round's mean reply size, the same with equal partitions; the paper's K is the number of
  local steps, the same again when B divides n_i. The code also clips every step's direction at
  norm 10: the run-wide `local-clip-norm = 10` (off by default), applied to the whole mixed d as
  there. The code's weight decay (SGD `weight_decay`) is outside the α-mix, as here. The server
  step w_t + η_g Δ̄_t is the code's `global_update`.
- Paper and authors' code. Read: the paper's abstract (arXiv 2106.10874) and the code; the
  paper's Algorithm 1 and experiment settings were not available to this change (only its
  abstract was), so the server step and Δ's normaliser are the code's, and no second reading
  is offered (the paper may write its server step with the normalised Δ and a global rate whose
  scale differs from η_g by η_t K: unconfirmed). The local step w ← w − η (α g + (1 − α) Δ) is
  the one the code's author gives as FedCM's when asked in the FL-Simulator repository why the
  code differs from the paper (answer: the loss α f + (1 − α) ⟨w, Δ⟩ has that gradient). Other
  differences from the code, not offered as keys: it moves the parameters alone (`get_mdl_params`:
  buffers are neither averaged nor sent; its GroupNorm ResNet-18 has none), here buffers take
  the plain mean; it samples each client with probability `--active-ratio` (redrawn until one is
  sampled), here Flower's fixed-size sample (`fraction-fit`). Its README's table ran α = 0.1,
  η_g = 1 (the defaults here), η_l = 0.1 and lr decay 0.998 a round, with the code's default
  weight decay 1e-3 (here the run-wide `learning-rate`, `lr-decay`, `weight-decay`, defaults
  0.01, 1 and 0).

Summary: client α g + (1 − α) Δ | server mean update step η_g, keeps Δ = −Δ̄/(η K) | client
state - | server state Δ | traffic Δ down
"""

from __future__ import annotations

from clients.momentum import momentum_arrays, momentum_begin, momentum_terms, scaled
from protocol.keys import Key
from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate

ALPHA = Key(0.1, lambda v: 0 < v <= 1, "in (0, 1] (share of the local gradient; 1 = FedAvg's client)")


def fedcm_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """α g, g the cross-entropy gradient; (1 − α) Δ follows as the update's term."""
    d, new_buffers, carry, loss = plain_direction(model, params, buffers, x, y, w_t, ctx, carry, hp)
    return scaled(d, hp.keys["fedcm-alpha"]), new_buffers, carry, loss


UPDATE = LocalUpdate("fedcm", fedcm_direction, momentum_begin, terms=momentum_terms("fedcm-alpha"),
                     keys={"fedcm-alpha": ALPHA}, **momentum_arrays(), module=__name__)
