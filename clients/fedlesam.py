"""FedLESAM: SAM with a locally estimated global perturbation, one gradient per step (Fan, Hu,
Yao, Niu, Zhang, Sugiyama, Wang, "Locally Estimated Global Perturbations are Better than Local
Perturbations for Federated Sharpness-aware Minimization", ICML 2024).

- Server → client: the model w_t, then Δ_t (`delta`, one array per trainable parameter, zeros
  in round 1): FedCM's global direction, Δ_t = −Δ̄_{t−1} / (η K̄) ∝ w_{t−1} − w_t.
- Client, once per round: the perturbation direction v, then ε = ρ v / (‖v‖ + 1e-12) (the norm
  over all trainable parameters), fixed for the round; every step on batch b:

  ```
  d = ∇f(w + ε; b)                                  (then the run's clip, weight decay, optimiser)
  ```

  one forward and backward pass, at the perturbed copy w + ε (w itself never moves), so the
  BatchNorm statistics are those of the perturbed pass, the only one (as the authors' code).
  `fedlesam-direction = server` (default): v = Δ_t, the last global step reversed,
  w_{t−1} − w_t, the same for every client; zero in round 1, so round 1 is FedAvg's.
  `client`: v = w_old − w_t, w_old the global model this client received when it was last
  sampled (client state, stored as weights); zero the first time a client is sampled.
- Server (`strategies/fedlesam.py`): FedCM's (`strategies.parts.ClientMomentum`): the
  unweighted mean update Δ̄_t = (1/|S_t|) Σ (w_i − w_t), w_{t+1} = w_t + η_g Δ̄_t, and Δ kept and
  sent down; checkpointed as `fedlesam-delta`, metric `fedlesam_delta_norm`.
- State: `client`: the last received global model (`fedlesam-old`); `server`: none. Under
  `client` the server still sends Δ_t (its FedCM server keeps and sends it whatever the
  direction) and the client does not read it: one unused model-sized download a round.
- Keys: `fedlesam-rho` ρ (0.1, > 0; the code's `--rho` default), `fedlesam-direction`
  (`server` | `client`), `fedlesam-server-lr` η_g (1.0, > 0).
- Readings (authors' code: MediaBrain-SJTU/FedLESAM `client/fedlesam.py`, `optimizer/LESAM.py`,
  `server/FedLESAM.py`, which runs by default): the code's server sends its last global update
  η_g Δ̄ (the step w_t − w_{t−1}) to every client and the client perturbs along its negative,
  whereas the paper's w_old is the global model of the client's own previous active round, which
  under partial participation may be several rounds old (`client`). The code's LESAM indexes
  the flat update vector with the index of each parameter tensor (`g_update[idx]`), so each
  tensor is shifted by one scalar and the norm sums |entries| 0..P−1: read here as the intended
  whole-vector direction and L2 norm, not reproduced. Its norm adds 1e-7 (here 1e-12); its clip
  at norm 10 is the run-wide `local-clip-norm = 10` (off by default); its `use_RI` option (the
  relaxed start of FedInit) is not part of FedLESAM here.
- Paper and authors' code. Read: the paper's abstract (arXiv 2405.18890), which defines the
  direction as "the difference between global models received in the previous active and
  current rounds" (`client`), and the code; the paper's algorithm box and its choice of ρ were
  not available to this change. The code's own defaults are ρ = 0.1 (the default here), 200
  clients, 5% active, batch 25, E = 5, η_l = 0.1 decayed 0.998 a round, weight decay 1e-3; its
  README's command runs the -S variant at ρ = 0.5 and says ρ needs tuning. Built on FL-Simulator,
  it moves the parameters alone and samples each client with probability `--active-ratio` (see
  fedcm); here buffers take the plain mean and Flower draws a fixed-size sample.

Summary: client ∇f at w + ρ v/‖v‖, v = w_old − w_t | server mean update step η_g, keeps Δ |
client state last global model (`client`) | server state Δ | traffic Δ down
"""

from __future__ import annotations

from clients.momentum import delta_names, momentum_arrays, momentum_begin
from protocol.keys import Key, positive
from tasks.functional.core import Hyper, Tree, grad_and_loss, perturbed_copy, sam_step
from tasks.functional.update import Arrays, LocalUpdate

SERVER, CLIENT = "server", "client"


def fedlesam_begin(w_t: Tree, state: dict, server: dict, hp: Hyper) -> dict:
    """ε = ρ v / (‖v‖ + NORM_EPS): v = Δ (``server``) or w_old − w_t (``client``; zero without w_old)."""
    if hp.keys["fedlesam-direction"] == SERVER:
        v = momentum_begin(w_t, state, server, hp)["delta"]
    else:
        old = state.get("old")
        v = {n: (old[n] - w if old is not None else w * 0) for n, w in w_t.items()}
    return {"eps": sam_step(v, hp.keys["fedlesam-rho"])}


def fedlesam_direction(model, params, buffers, x, y, w_t, ctx, carry, hp):
    """∇f(w + ε; b), one pass at the perturbed copy; its buffers are kept."""
    grads, new_buffers, loss = grad_and_loss(model, perturbed_copy(params, ctx["eps"]), buffers, x, y, hp)
    return grads, new_buffers, carry, loss


def fedlesam_end(w_t, params, buffers, carry, steps, ctx, state, hp):
    """``client``: the received global model w_t, this client's next w_old; ``server``: nothing."""
    return ({"old": dict(w_t)} if hp.keys["fedlesam-direction"] == CLIENT else {}), {}, {}


UPDATE = LocalUpdate(
    "fedlesam", fedlesam_direction, fedlesam_begin, fedlesam_end,
    keys={"fedlesam-rho": Key(0.1, positive, "> 0 (perturbation radius rho)"),
          "fedlesam-direction": Key(SERVER, choices=(SERVER, CLIENT))},
    state={"old": Arrays(delta_names, record="fedlesam-old", as_weights=True)},
    **momentum_arrays(), step_cost=1.0, module=__name__)
