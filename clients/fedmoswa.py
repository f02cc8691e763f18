"""FedMoSWA: FedSWA's local rate decay and lookahead server with SCAFFOLD-style control variates
whose server variate m is a momentum over the clients' latest c_i (Liu, Liu, Shang, Liu, Liu,
Feng, "Improving Generalization in Federated Learning with Highly Heterogeneous Data via
Momentum-Based Stochastic Controlled Weight Averaging", ICML 2025).

- Server → client: the model w_t, then m (`c`, one array per trainable parameter; zeros in round
  1; protocol family "control variates").
- Client, every step k = 0, …, K − 1 of its round, with its own c_i (zeros the first time it
  trains) and the rate η_k = η (1 − (1 − ρ) k / K) (`clients.swa`; η the round's rate):

  ```
  d = clip(g) + (m − c_i)                          (the run's clip on g alone; then weight decay)
  w ← w − η_k d
  ```

  then, after its K steps (option II, with Σ_k η_k the rates' sum: K η when ρ = 1),

  ```
  c_i⁺ = c_i − m + (w_t − w_K) / Σ_k η_k,          sent: c_i⁺ − m (`delta_c`)
  ```

  The client keeps c_i⁺ (`cv-ci`, across rounds, never reset); m is constant over the round.
- Server (`strategies/fedmoswa.py`), over the clients S_t that replied: the model as FedSWA's,
  w_{t+1} = w_t + α ((1/|S_t|) Σ w_i − w_t) on the trainable entries (buffers: the plain mean;
  `strategies.parts.Lookahead`), and the momentum (`strategies.parts.ControlVariates`):

  ```
  m ← m + γ (1/|S_t|) Σ_{i∈S_t} (c_i⁺ − m)
  ```

  with γ = 1 at its first update under `fedmoswa-m-init = first-mean` (m = the first round's mean
  c_i⁺). The server keeps m (float32, checkpointed as `cv-c`, with `cv-started`) and sends it
  every round; metric `cv_norm` = ‖m‖, client metric `ci_norm` = ‖c_i⁺‖.
- Keys: `fedmoswa-rho` ρ (1.0, in [0, 1]; 1 = a constant local rate), `fedmoswa-alpha` α (1.0,
  > 0), `fedmoswa-gamma` γ (0.4, in (0, 1]), `fedmoswa-m-init` (`first-mean` or `zero`). Adam and
  AdamW are refused (option II needs a step linear in the gradient); with momentum β, Σ_k η_k
  counts each step's heavy-ball reach, η_k (1 − β^(k+1)) / (1 − β) (`tasks.optim.scheduled_steps`).
- Readings. The defaults are the authors' code (junkangLiu0/FedSWA, `main_FedSWA.py`: its flag
  `MoFedSWA` runs `update_scafplus` on the client and `apply_weights_SCAF` on the server), which
  ran the paper's tables; the paper's reading is `fedmoswa-rho = 0.1`, `fedmoswa-alpha = 1.5`,
  `fedmoswa-gamma = 0.2`, `fedmoswa-m-init = zero` (its Algorithm and Sec. 6.1 settings, read
  through secondary summaries of the paper, whose own text was not readable here). Where they
  differ: (1) the code's client has no rate decay (`update_scafplus` steps at the round's η;
  its `update_FedMoSWA`, which decays with ρ = 0, is never called), so ρ = 1, where the paper
  decays to ρ η and divides by Σ_k η_k; (2) the code's server model step is
  `w_t + mean(w_i − w_t)` (α = 1) where the paper's is FedSWA's α step; (3) the code's momentum
  is γ = 0.4 hard-coded (its `--gamma` unused) and its first update sets m to the first round's
  mean c_i⁺ (`ps_c` empty: γ = 1), where the paper's m starts at 0 and every update takes γ = 0.2.
  Not reproduced: (4) the code loads each client's c_i from a dictionary it never writes
  (`state_ci_loader` reads `ci_dict`, the round writes `c_dict`), so its c_i is whatever its Ray
  worker last computed, for whichever client that was; here every client keeps its own c_i, as
  the paper says; (5) it stops every client after its `--K` (50) steps (the loop breaks, so a
  client with more than K batches in its E epochs trains fewer than E epochs) and divides by K
  even when a client took fewer steps; here every client runs its E epochs and divides by the
  steps taken (the same for its 500-example clients at B = 50, E = 5). Shared by both: the
  reply is c_i⁺ − m (not SCAFFOLD's c_i⁺ − c_i), the means are unweighted, the correction is
  added after the clip (the code's `clip_grad_norm_(10)` then `grad += c − c_i`: the run's
  `local-clip-norm = 10`, off by default) and before its SGD `weight_decay=1e-3` (the run's
  `weight-decay`).

Summary: client + (m − c_i) after the clip, rate decay ρ | server lookahead step α, momentum
m ← m + γ mean(c_i⁺ − m) | client state c_i | server state m | traffic m down, c_i⁺ − m up
"""

from __future__ import annotations

from dataclasses import replace

from clients.control_variates import CORRECTION, control_variate_arrays, control_variate_begin, control_variate_update
from clients.swa import linear_decay
from protocol.keys import Key, between
from protocol.layout import trainable_param_names
from tasks.functional.core import Hyper, plain_direction, tree_norm
from tasks.functional.terms import DECAY
from tasks.functional.update import LR_FACTORS, LocalUpdate

RHO = "fedmoswa-rho"


def fedmoswa_schedule(steps: int, hp: Hyper) -> list[float] | None:
    """The factors 1 − (1 − ρ) k / K of the round's K steps (``clients.swa.linear_decay``)."""
    return linear_decay(steps, hp.keys[RHO])


def fedmoswa_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """state c_i⁺ = c_i − m + (w_t − w) / Σ_k η_k, reply c_i⁺ − m (``delta_c``), metric ``ci_norm``."""
    ci_new = control_variate_update(w_t, params, ctx["c"], ctx["ci"], steps, hp.lr, hp.momentum, ctx.get(LR_FACTORS))
    sent = {n: ci_new[n] - ctx["c"][n] for n in ci_new}
    return {"ci": ci_new}, {"delta_c": sent}, {"ci_norm": tree_norm(ci_new.values())}


# + (m - c_i) after the clip of g, before the optimiser's weight decay: the code's order
AFTER_CLIP = replace(CORRECTION, formula="+ (m - c_i) after the clip", place=DECAY)

UPDATE = LocalUpdate(
    "fedmoswa", plain_direction, control_variate_begin, fedmoswa_end, terms=(AFTER_CLIP,),
    lr_schedule=fedmoswa_schedule,
    keys={RHO: Key(1.0, between(0.0, 1.0), "in [0, 1] (the round's last local rate over its first; 1 = constant)")},
    **control_variate_arrays(trainable_param_names), module=__name__)
