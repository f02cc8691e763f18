"""FedACG: the server sends its model moved ahead along its global momentum, and each client
trains from that look-ahead point with a proximal term anchored at it (Kim, Kim, Han,
"Communication-Efficient Federated Learning with Accelerated Client Gradient", CVPR 2024).

- Server, before round t (`strategies/fedacg.py`), with its model θ^{t−1} and global
  momentum m^{t−1} (zeros at first): it sends the look-ahead model θ̃^t = θ^{t−1} + λ m^{t−1}
  instead of θ^{t−1}.
- Client: starts at the received θ̃^t and minimises f(w) + (β/2) ‖w − θ̃^t‖², so
  d = g + β (w − θ̃^t) on every trainable parameter: FedProx's proximal term
  (`tasks.functional.terms.proximal`) with μ = β, anchored at the received point.
- Server, after the round, over the clients S_t that replied:

  ```
  θ^t = (1/|S_t|) Σ_{i∈S_t} w_i              (the unweighted mean)
  m^t = λ m^{t−1} + (θ^t − θ̃^t)              (= λ m^{t−1} + mean_i Δ_i, Δ_i = w_i − θ̃^t)
  ```

  so θ^t = θ^{t−1} + m^t: a Nesterov-style server momentum whose extrapolated point the clients
  train from (FedAvgM instead measures the updates from θ^{t−1} and steps the server alone). The
  model evaluated, checkpointed and sent to evaluating clients is θ^t, never the look-ahead.
- State: none on the clients; m on the server (trainable parameters, float64, checkpointed).
  Traffic: the weights only, both ways. Server metric `fedacg_m_norm` (‖m^t‖).
- Keys: `fedacg-lambda` λ (0.85, in [0, 1); the code's `server.momentum`), `fedacg-beta` β
  (0.002, ≥ 0; the coefficient of the gradient term β (w − θ̃), which is twice the code's
  `client.prox_loss.weight` 1e-3 on ‖w − θ̃‖², so the same strength). λ = 0 is FedProx with
  μ = β and an unweighted mean; λ = 0 and β = 0 is FedAvg with an unweighted mean.
- Readings (authors' code geehokim/FedACG): the mean is the unweighted one of the paper and
  the code; with equal-size partitions (`inner-dirichlet`, `size-sigma = 0`, their data) it
  equals the n_k-weighted one. m and the look-ahead cover the trainable parameters only:
  BatchNorm buffers take the plain mean of the replies and are sent without look-ahead (the
  code moves every state_dict entry, but its GroupNorm ResNet-18 has no buffers). Not
  reproduced from the code: its per-local-epoch lr decay (0.998 per epoch within a round; the
  product has only `lr-decay` per round) and mixed precision; its gradient clip at norm 10 on
  every method is the run-wide `local-clip-norm = 10` (off by default). A round whose
  aggregate is not finite leaves m unchanged (the server keeps its model). w_t for the drift
  columns and update screening is the look-ahead point the clients started from.

Summary: client + β (w − θ̃) at the look-ahead θ̃ | server unweighted mean + momentum m, sends
θ + λ m | client state - | server state m | traffic -
"""

from __future__ import annotations

from protocol.keys import Key, non_negative
from tasks.functional.core import plain_direction
from tasks.functional.terms import proximal
from tasks.functional.update import LocalUpdate

# d = g + beta (w - w_t), w_t the received look-ahead point
UPDATE = LocalUpdate(
    "fedacg", plain_direction, terms=(proximal("fedacg-beta"),),
    keys={"fedacg-beta": Key(0.002, non_negative, ">= 0 (proximal coefficient beta of beta (w - w_t); "
                                                   "the code's prox weight x 2)")},
    module=__name__)
