"""FedInit: each client starts its round at a relaxed point beyond w_t, away from its own last
local model (Sun, Shen, Tao, "Understanding How Consistency Works in Federated Learning via
Stage-wise Relaxed Initialization", NeurIPS 2023).

- Client, before its round: with w_i^last its own model at the end of its previous round,

  ```
  w_i^0 = w_t + β (w_t − w_i^last)                  (every trainable parameter)
  ```

  then plain local SGD from w_i^0 (FedAvg's direction); BatchNorm buffers start at the received
  ones. The first time a client is sampled it has no last model and starts at w_t.
- Server: the weighted mean of the replies (Flower's FedAvg, `DriftFedAvg`). What a client
  replies is `fedinit-server`: `updates` (default, the authors' code) w_{i,K} − β (w_t − w_i^last)
  = w_t + (w_{i,K} − w_i^0), so the new model is w_t plus the mean local update from the relaxed
  starts; `models` w_{i,K}, so the new model is the mean of the local models (the paper as
  recalled: its algorithm box could not be read here).
- State: the client's final trainable weights (`fedinit-last`). Traffic: none beyond FedAvg's.
- Keys: `fedinit-beta` β (0.1, ≥ 0), `fedinit-server` (`updates`, `models`). β = 0 is FedAvg
  exactly, under either reading.
- Readings: the paper's algorithm as read from its abstract ("initializes the local state by
  moving away from the current global state towards the reverse direction of the latest local
  state": the relaxed start above) and, for the rest, as recalled (FedAvg's local steps, and a
  server that averages the local models w_{i,K}); its algorithm box and tables were not
  available to this change.
- Paper and authors' code. No release linked from the paper was found; the first author's
  FL-Simulator (the FedSpeed and FedSMOO code) runs the relaxed start as `--use-RI` on every
  method's server, with `--beta` 0.1 (the default here), and the FedLESAM authors' copy of it
  keeps the option. Where it differs: (1) its server computes w_i^0 from its copy of the
  client's last model, which starts at w_0 for a client never sampled (here such a client starts
  at w_t; not offered); (2) its client returns w_{i,K} − w_i^0 and its server steps
  w_{t+1} = w_t + η_g mean_i (w_{i,K} − w_i^0) (η_g = 1), which is the mean of the w_{i,K} minus
  β mean_i (w_t − w_i^last): the relaxation is taken back at aggregation. That is the default
  here (`fedinit-server = updates`), as the code is what the paper's tables came from;
  `models` runs the mean of the local models themselves; (3) its mean is unweighted (here
  n_k-weighted: the same with equal-size partitions), it moves the parameters alone (buffers
  neither averaged nor sent) and it samples each client with probability `--active-ratio` (here
  Flower's fixed-size sample); not offered.

Summary: client starts at w_t + β (w_t − w_i^last), replies w_t + its update (or its model) |
server - | client state last local model | server state - | traffic -
"""

from __future__ import annotations

from dataclasses import replace

from clients.momentum import delta_names
from protocol.keys import Key, non_negative
from tasks.functional.core import keep_layout, plain_direction
from tasks.functional.update import Arrays, LocalUpdate, Round

SERVER_READINGS = ("updates", "models")


def relaxed_start(job: Round) -> Round:
    """The round from w_i^0 = w_t + β (w_t − w_i^last) (w_t itself without a last model); the
    shift β (w_t − w_i^last) goes with the round (``server["fedinit-shift"]``) for ``fedinit_finish``."""
    last, beta = job.state.get("last"), job.hp.keys["fedinit-beta"]
    if last is None or beta == 0:
        return job
    shift = {n: beta * (w - last[n].to(w)) for n, w in job.params.items() if n in last}
    params = {n: keep_layout(w + shift[n], w) if n in shift else w for n, w in job.params.items()}
    return replace(job, params=params, server={**job.server, "fedinit-shift": shift})


def fedinit_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """The next round's w_i^last: this round's final trainable weights."""
    return {"last": dict(params)}, {}, {}


def fedinit_finish(job: Round, result):
    """With ``fedinit-server = updates`` (the authors' code): the reply is w_{i,K} − shift =
    w_t + (w_{i,K} − w_i^0), so the server's mean is w_t plus the mean local update from the
    relaxed starts; with ``models`` the reply is w_{i,K}. The kept w_i^last is w_{i,K} either way
    (``fedinit_end`` ran before this)."""
    shift = job.server.get("fedinit-shift")
    if shift is None or job.hp.keys["fedinit-server"] != "updates":
        return result
    params = {n: keep_layout(w - shift[n], w) if n in shift else w for n, w in result.params.items()}
    return replace(result, params=params)


UPDATE = LocalUpdate("fedinit", plain_direction, end=fedinit_end,
                     keys={"fedinit-beta": Key(0.1, non_negative, ">= 0 (relaxation beta)"),
                           "fedinit-server": Key("updates", choices=SERVER_READINGS)},
                     state={"last": Arrays(delta_names, record="fedinit-last", as_weights=True)},
                     prepare=relaxed_start, finish=fedinit_finish, module=__name__)
