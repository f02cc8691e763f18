"""FedInit: each client starts its round at a relaxed point beyond w_t, away from its own last
local model (Sun, Shen, Chen, Ding, Tao, "Understanding How Consistency Works in Federated
Learning via Stage-wise Relaxed Initialization", NeurIPS 2023).

- Client, before its round: with w_i^last its own model at the end of its previous round,

  ```
  w_i^0 = w_t + β (w_t − w_i^last)                  (every trainable parameter)
  ```

  then plain local SGD from w_i^0 (FedAvg's direction); BatchNorm buffers start at the received
  ones. The first time a client is sampled it has no last model and starts at w_t.
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`).
- State: the client's final trainable weights (`fedinit-last`). Traffic: none beyond FedAvg's.
- Keys: `fedinit-beta` β (0.1, ≥ 0). β = 0 is FedAvg exactly.
- Readings: no authors' release was found in this change, so this is the paper's algorithm as
  recalled (the relaxed start, FedAvg's local steps and server); the default β was not checked
  against the paper's tables. The relaxation option of the FedLESAM authors' code (`use_RI`,
  the same formula, computed on its server) starts a never-sampled client's w_i^last at w_0;
  here such a client starts at w_t.

Summary: client starts at w_t + β (w_t − w_i^last) | server - | client state last local model |
server state - | traffic -
"""

from __future__ import annotations

from dataclasses import replace

from clients.momentum import delta_names
from protocol.keys import Key, non_negative
from tasks.functional.core import keep_layout, plain_direction
from tasks.functional.update import Arrays, LocalUpdate, Round


def relaxed_start(job: Round) -> Round:
    """The round from w_t + β (w_t − w_i^last) (w_t itself without a last model)."""
    last, beta = job.state.get("last"), job.hp.keys["fedinit-beta"]
    if last is None or beta == 0:
        return job
    params = {n: keep_layout(w + beta * (w - last[n].to(w)), w) if n in last else w for n, w in job.params.items()}
    return replace(job, params=params)


def fedinit_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """The next round's w_i^last: this round's final trainable weights."""
    return {"last": dict(params)}, {}, {}


UPDATE = LocalUpdate("fedinit", plain_direction, end=fedinit_end,
                     keys={"fedinit-beta": Key(0.1, non_negative, ">= 0 (relaxation beta)")},
                     state={"last": Arrays(delta_names, record="fedinit-last", as_weights=True)},
                     prepare=relaxed_start, module=__name__)
