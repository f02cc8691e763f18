"""FedInit: each client starts its round at a relaxed point beyond w_t, away from its own last
local model (Sun, Shen, Tao, "Understanding How Consistency Works in Federated Learning via
Stage-wise Relaxed Initialization", NeurIPS 2023).

- Client, before its round: with w_i^last its own model at the end of its previous round,

  ```
  w_i^0 = w_t + β (w_t − w_i^last)                  (every trainable parameter)
  ```

  then plain local SGD from w_i^0 (FedAvg's direction); BatchNorm buffers start at the received
  ones. The first time a client is sampled it has no last model and starts at w_t.
- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`).
- State: the client's final trainable weights (`fedinit-last`). Traffic: none beyond FedAvg's.
- Keys: `fedinit-beta` β (0.1, ≥ 0). β = 0 is FedAvg exactly.
- Readings: the paper's algorithm as read from its abstract ("initializes the local state by
  moving away from the current global state towards the reverse direction of the latest local
  state": the relaxed start above) and, for the rest, as recalled (FedAvg's local steps, and a
  server that averages the local models w_{i,K}); its algorithm box and tables were not
  available to this change.
- Paper and authors' code. No release linked from the paper was found; the first author's
  FL-Simulator (the FedSpeed and FedSMOO code) runs the relaxed start as `--use-RI` on every
  method's server, with `--beta` 0.1 (the default here), and the FedLESAM authors' copy of it
  keeps the option. Where it differs, none offered as a key: (1) its server computes w_i^0 from
  its copy of the client's last model, which starts at w_0 for a client never sampled (here
  such a client starts at w_t); (2) its client returns w_{i,K} − w_i^0 and its server steps
  w_{t+1} = w_t + η_g mean_i (w_{i,K} − w_i^0) (η_g = 1), which is the mean of the w_{i,K} minus
  β mean_i (w_t − w_i^last): the relaxation is taken back at aggregation, where here (and in the
  paper as recalled) the new model is the mean of the local models themselves; (3) its mean is
  unweighted (here n_k-weighted: the same with equal-size partitions), it moves the parameters
  alone (buffers neither averaged nor sent) and it samples each client with probability
  `--active-ratio` (here Flower's fixed-size sample).

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
