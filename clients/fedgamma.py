"""FedGamma: SAM as the local optimiser with SCAFFOLD's control variates correcting every step
(Dai, Chen, Liu, Ding, Tao, "FedGAMMA: Federated Learning with Global Sharpness-Aware
Minimization", IEEE TNNLS 2023).

- Server → client: the model w_t, then c (SCAFFOLD's, `c`); client state c_i (zeros at first).
- Client, every step on batch b (`clients.sharpness.sam_gradient`, `clients.control_variates`):

  ```
  g = ∇f(w; b)
  a = g                       (`fedgamma-perturbation = local`, the authors' code: the default)
  a = g − c_i + c             (`global`, the paper as recalled, unconfirmed: the ascent along the corrected direction)
  ε = ρ a / (‖a‖ + 1e-12)     (the norm over all trainable parameters)
  d = ∇f(w + ε; b) + (c − c_i)              (then the run's clip, weight decay, optimiser)
  ```

  The perturbed model is the client's current local model w (a copy w + ε: w never moves);
  BatchNorm statistics count the unperturbed pass only (the
  [perturbation rules](#sharpness-and-perturbation)). After the round, c_i⁺ and Δc_i as in the
  [control-variate rules](#control-variates) (c_i⁺ = c_i − c + (w_t − w) / (η K_eff)).
- Server (`strategies/fedgamma.py`): SCAFFOLD's, the weighted mean of the weights and
  c ← c + (1/N) Σ_{i∈S_t} Δc_i (`strategies.parts.ControlVariates`, D = N as the code's
  `c += delta_c / total_client`).
- Keys: `fedgamma-rho` ρ (0.1, > 0; the code's `--rho` default), `fedgamma-perturbation`
  (`local` | `global`). ρ → 0 is SCAFFOLD's client; c = c_i = 0 is FedSAM's.
- Readings (authors' code: FL-Simulator `client/fedgamma.py`, `server/FedGamma.py`, which runs
  by default): the code's `ESAM` forms ε from the plain local gradient g, so its perturbation is
  FedSAM's and only the descent step is corrected (`local`); the paper's global sharpness-aware
  step perturbs along the control-variate-corrected gradient (`global`; recalled from the paper,
  not re-read in this change). Other differences from the code, not offered as keys: the code
  keeps every c_i on the server and computes c_i⁺ with K = E n_0 / B (client 0's size, a float)
  and the round's lr, here the client keeps c_i and K_eff counts its own local steps (the same
  for equal partitions, B dividing n_i, and no momentum); the code's server takes the unweighted
  mean update with η_g = 1, here the n_k-weighted mean (the same with equal-size partitions);
  the code's ESAM counts BatchNorm statistics twice per step and adds 1e-7 to the norm; its clip
  at norm 10 is the run-wide `local-clip-norm = 10` (off by default).
- Paper and authors' code. Read: the paper's abstract (TNNLS 2023, its DOI page: "a local
  varieties control technique to better align each client's local updates" towards global
  flatness) and the code, FL-Simulator, which the FedLESAM authors' README names as where the
  FedGamma authors released theirs; the paper's algorithm box and settings were not available,
  so whether its ascent uses the corrected gradient (`global`) is unconfirmed. The code's
  README table, which reported FedGamma's accuracies, ran ρ = 0.01, where its `--rho` default
  (and the default here) is 0.1: set `fedgamma-rho = 0.01` for the table's setting. Its η_l =
  0.1, lr decay 0.998 a round and weight decay 1e-3 are run-wide keys here. As FedCM's code, it
  moves the parameters alone (buffers neither averaged nor sent) and samples each client with
  probability `--active-ratio`; here buffers take the plain mean and Flower draws a fixed-size
  sample.

Summary: client SAM gradient (ascent along g or g − c_i + c) + c − c_i | server c update | client
state c_i | server state c | traffic c down, Δc_i up
"""

from __future__ import annotations

from clients.control_variates import CORRECTION, control_variate_arrays, control_variate_begin, control_variate_end
from clients.sharpness import sam_gradient
from protocol.keys import Key, positive
from protocol.layout import trainable_param_names
from tasks.functional.update import LocalUpdate

LOCAL, GLOBAL = "local", "global"


def fedgamma_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """SAM's gradient at radius ρ, the ascent along g (``local``) or g + (c − c_i) (``global``);
    the correction c − c_i follows as the update's term."""
    offset = ctx["corr"] if hp.keys["fedgamma-perturbation"] == GLOBAL else None
    sharp, new_buffers, loss = sam_gradient(model, params, buffers, x, y, hp, hp.keys["fedgamma-rho"], offset)
    return sharp, new_buffers, carry, loss


# d = grad f(w + eps) + (c - c_i); c, c_i and delta c_i as SCAFFOLD's.
UPDATE = LocalUpdate(
    "fedgamma", fedgamma_direction, control_variate_begin, control_variate_end, terms=(CORRECTION,),
    keys={"fedgamma-rho": Key(0.1, positive, "> 0 (SAM radius rho)"),
          "fedgamma-perturbation": Key(LOCAL, choices=(LOCAL, GLOBAL))},
    **control_variate_arrays(trainable_param_names), step_cost=2.0, module=__name__)
