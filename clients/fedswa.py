"""FedSWA: stochastic weight averaging for federated learning, a local rate that decays linearly
within each round and restarts every round, and a lookahead step of the server towards the clients'
mean (Liu, Liu, Shang, Liu, Liu, Feng, "Improving Generalization in Federated Learning with Highly
Heterogeneous Data via Momentum-Based Stochastic Controlled Weight Averaging", ICML 2025).

- Client, every step k = 0, …, K − 1 of its round (K its local steps; `clients.swa`):

  ```
  η_k = m · η (1 − (1 − ρ) k / K)                 (η the round's learning rate)
  w  ← w − η_k (g + wd · w)                        (g the cross-entropy gradient, after the run's clip)
  ```

  implemented as FedAvg's direction with the loop's `lr_schedule`: each step is the run's
  optimiser step at rate η_k. The rate restarts at m η the next round. No client state.
- Server (`strategies/fedswa.py`, `strategies.parts.Lookahead`), over the clients S_t that
  replied, on the trainable entries (buffers: the plain mean):

  ```
  v_t     = (1/|S_t|) Σ_{i∈S_t} w_i
  w_{t+1} = w_t + α (v_t − w_t)
  ```

  The server keeps nothing besides the model and sends only the weights. α = 1 is the plain
  (unweighted) mean; ρ = 1, m = 1, α = 1 is FedAvg with an unweighted mean.
- Keys: `fedswa-rho` ρ (0.0, in [0, 1]: the round's last rate over its first), `fedswa-lr-multiplier`
  m (2.0, > 0), `fedswa-alpha` α (1.0, > 0). Every optimiser is allowed (each moves linearly in
  its rate, so the schedule scales the whole step, weight decay and momentum's too).
- Readings. The defaults are the authors' code (junkangLiu0/FedSWA, `main_FedSWA.py`,
  `update_FedSWA` and `apply_weights_avg`), which ran the paper's tables; the paper's reading is
  `fedswa-rho = 0.1`, `fedswa-lr-multiplier = 1`, `fedswa-alpha = 1.5` (its Sec. 6.1 settings,
  read through secondary summaries of the paper, whose own text was not readable here). Where they
  differ: (1) the code hard-codes ρ = 0 (its local `rho` is set to 0; `--rho` unused), so the rate falls to 0 at
  the round's end, where the paper's falls to ρ η = 0.1 η; (2) the code's SGD runs at 2 × the
  schedule (built with `2 * lr`: m = 2, mean rate ≈ η), the paper's at η (m = 1); (3) the code's server is
  `w_t + lg · mean(w_i − w_t)` with `--lg` 1.0 (never set by the README's commands), so α = 1, the
  plain mean, where the paper's EMA/lookahead step takes α = 1.5. (4) The code also multiplies
  float buffers (BatchNorm statistics) by its `lg`; here buffers take the plain mean whatever α.
  Shared with the paper: the mean is unweighted (1/|S_t|); K counts every local step of the round
  (the code's `len(loader) · E`). The code's SGD `weight_decay=1e-3` and `clip_grad_norm_(10)` are
  the run's `weight-decay = 0.001` and `local-clip-norm = 10` (off by default); its round rate
  follows a cosine over the rounds where this run's follows `lr-decay`.

Summary: client rate decays linearly in the round, m η → m ρ η | server lookahead step α towards
the plain mean | client state - | server state - | traffic -
"""

from __future__ import annotations

from clients.swa import linear_decay
from protocol.keys import Key, between, positive
from tasks.functional.core import Hyper, plain_direction
from tasks.functional.update import LocalUpdate

RHO = "fedswa-rho"
MULTIPLIER = "fedswa-lr-multiplier"


def fedswa_schedule(steps: int, hp: Hyper) -> list[float] | None:
    """The factors m (1 − (1 − ρ) k / K) of the round's K steps (``clients.swa.linear_decay``)."""
    return linear_decay(steps, hp.keys[RHO], hp.keys[MULTIPLIER])


UPDATE = LocalUpdate(
    "fedswa", plain_direction, lr_schedule=fedswa_schedule,
    keys={RHO: Key(0.0, between(0.0, 1.0), "in [0, 1] (the round's last local rate over its first; 1 = constant)"),
          MULTIPLIER: Key(2.0, positive, "> 0 (factor on the whole local schedule; the authors' code runs 2)")},
    module=__name__)
