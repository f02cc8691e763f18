"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020), option II control
variates on every trainable parameter.

- Client: plain local SGD corrected on every step, d = g − c_i + c; then c_i⁺ and Δc_i as in
  the [control-variate rules](#control-variates) (c_i⁺ = c_i − c + (w_t − w) / (η K_eff), K_eff
  the momentum-corrected count of all local steps of the round).
- Server (`strategies/scaffold.py`): weighted mean of the weights;
  c ← c + (1/N) Σ_{i∈S_t} Δc_i.
- State: c_i per client, c on the server; c travels with the model, Δc_i with the reply.
- Keys: `cv-divisor` (`total`, SCAFFOLD's D = N; `participants`, D = |S_t| as FedGAM-CV's
  Eq. 22, for ablations that separate FedGAM-CV's divisor from its GAM term; the two agree
  under full participation); it reads `momentum` (for K_eff).
- Readings: the weights take the n_k-weighted mean with global step size 1; K counts all local
  steps of the round, not the batches of one epoch. `scaffold-correction` says where c − c_i
  goes: `direction` (the default; Algorithm 1's corrected gradient, through the clip, weight
  decay and momentum, with K_eff, as the FedSOL authors' code) or `post-step` (NIID-Bench's
  `train_net_scaffold` and Flower's `baselines/niid_bench`: the optimiser steps on g, then
  w ← w − η (c − c_i), outside the momentum buffer; c_i⁺ divides by the plain K). Under
  momentum the two differ: with β = 0.9 `direction` moves the correction about 1/(1 − β) times
  as far per round. Without momentum or a clip they are the same step.

Summary: client + c − c_i | server c update | client state c_i | server state c | traffic c
down, Δc_i up
"""

from __future__ import annotations

from clients.control_variates import (
    CORRECTION_KEY,
    DIRECTION,
    POST,
    control_variate_arrays,
    control_variate_begin,
    control_variate_end,
    correction_terms,
)
from protocol.keys import Key
from protocol.layout import trainable_param_names
from tasks.functional.core import plain_direction
from tasks.functional.update import LocalUpdate

# d = g + (c - c_i) ("direction"), or the optimiser's step on g, then w -= lr (c - c_i) ("post-step")
UPDATE = LocalUpdate(
    "scaffold", plain_direction, control_variate_begin, control_variate_end, terms=correction_terms(),
    keys={CORRECTION_KEY: Key(DIRECTION, choices=(DIRECTION, POST))},
    **control_variate_arrays(trainable_param_names), module=__name__)
