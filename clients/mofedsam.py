"""MoFedSAM: FedSAM's local step mixed with FedCM's global direction, the momentum variant of
FedSAM (Qu, Li, Duan, Liu, Tang, Lu, "Generalized Federated Learning via Sharpness Aware
Minimization", ICML 2022).

- Server → client: the model w_t, then Δ_t (`delta`, one array per trainable parameter, zeros
  in round 1), as FedCM's.
- Client, every step on batch b (`clients.sharpness.sam_gradient`, `clients.momentum`):

  ```
  g = ∇f(w; b);   ε = ρ g / (‖g‖ + 1e-12)       (the norm over all trainable parameters)
  d = α ∇f(w + ε; b) + (1 − α) Δ_t              (then the run's clip, weight decay, optimiser)
  ```

  The perturbed model is the client's current local model w (a copy w + ε: w never moves), with
  radius ρ along its own plain gradient; BatchNorm statistics count the unperturbed pass only
  (the [perturbation rules](#sharpness-and-perturbation)). The momentum buffer is Δ_t, on the
  server, replaced every round (FedCM's); the client keeps nothing. α = 1 is FedSAM's client
  exactly.
- Server (`strategies/mofedsam.py`): FedCM's (`strategies.parts.ClientMomentum`):
  Δ̄_t = (1/|S_t|) Σ (w_i − w_t), w_{t+1} = w_t + η_g Δ̄_t, Δ_{t+1} = −Δ̄_t / (η_t K̄_t),
  K̄_t = E · mean_i n_i / B; Δ checkpointed as `mofedsam-delta`, metric `mofedsam_delta_norm`.
- Keys: `mofedsam-alpha` α (0.1, in (0, 1]), `mofedsam-rho` ρ (0.1, > 0; the code's `--rho`
  default), `mofedsam-server-lr` η_g (1.0, > 0). Adam and AdamW are refused.
- Readings (reference code: FL-Simulator `client/mofedsam.py` with its `ESAM` optimiser,
  `server/MoFedSAM.py`, by the FedSpeed and FedSMOO authors, not by the paper's; it runs by
  default): ε is formed from the plain gradient g (not from
  the mixed direction), and α scales the SAM gradient only, as the code's `ESAM.step(alpha)`
  followed by the backward pass of (1 − α)⟨w, Δ⟩. Differences from the code: its ESAM's second
  pass runs the model in training mode again, so BatchNorm statistics count each batch twice
  (here once, the project's rule for every SAM method); its norm adds 1e-7 (here 1e-12); its clip
  at norm 10 is the run-wide `local-clip-norm = 10` (off by default). The normaliser K̄ and the
  server step are FedCM's readings (see fedcm).
- Paper and authors' code. Read: the paper's abstract and opening (ICML 2022, PMLR v162) and
  the code; its MoFedSAM algorithm box and experiment settings were not available to this
  change, so no second reading is offered. The code's README table ran ρ = 0.1 and α = 0.05 or
  0.1 (the defaults here: 0.1 and 0.1), η_g = 1, η_l = 0.1 and lr decay 0.998 a round, with the
  code's default weight decay 1e-3 (run-wide keys here). As FedCM's code, it moves the parameters alone and samples each
  client with probability `--active-ratio`; here buffers take the plain mean and Flower draws a
  fixed-size sample.

Summary: client α SAM gradient + (1 − α) Δ | server mean update step η_g, keeps Δ = −Δ̄/(η K) |
client state - | server state Δ | traffic Δ down
"""

from __future__ import annotations

from clients.momentum import momentum_arrays, momentum_begin, momentum_terms, scaled
from clients.sharpness import sam_gradient
from protocol.keys import Key, positive
from tasks.functional.update import LocalUpdate


def mofedsam_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """α ∇f(w + ε), ε SAM's at radius ρ; (1 − α) Δ follows as the update's term."""
    sharp, new_buffers, loss = sam_gradient(model, params, buffers, x, y, hp, hp.keys["mofedsam-rho"])
    return scaled(sharp, hp.keys["mofedsam-alpha"]), new_buffers, carry, loss


UPDATE = LocalUpdate(
    "mofedsam", mofedsam_direction, momentum_begin, terms=momentum_terms("mofedsam-alpha"),
    keys={"mofedsam-alpha": Key(0.1, lambda v: 0 < v <= 1,
                                "in (0, 1] (share of the SAM gradient; 1 = FedSAM's client)"),
          "mofedsam-rho": Key(0.1, positive, "> 0 (SAM radius rho)")},
    **momentum_arrays(), step_cost=2.0, module=__name__)
