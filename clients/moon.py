"""MOON: model-contrastive learning, pulling the local representation towards the global model's
and away from the client's previous local model's (Li, He, Song, CVPR 2021).

- Client: with z = the local model's representation of x (the output of `model.body`, the
  input of the classifier), z_g that of the frozen global model w_t (positive) and z_p that of
  the client's own model at the end of its previous round (negative), sim the cosine similarity
  and T the temperature,

  ```
  ℓ_con = −log( exp(sim(z, z_g)/T) / (exp(sim(z, z_g)/T) + exp(sim(z, z_p)/T)) )
  loss  = CE + μ ℓ_con                               (both averaged over the batch)
  ```

- Server: the weighted mean (Flower's FedAvg, `DriftFedAvg`): the change is all on the client.
- State: the client's model from the end of its last round, in `context.state`.
- Keys: `moon-mu` μ (1.0, ≥ 0; the MOON paper uses 1 to 5, the FedSOL authors' code 0.1),
  `moon-temperature` T (0.5, > 0).
- Readings: the representation is the body's output; no separate projection head is added.
  The first time a client is sampled it has no previous model and trains with CE alone, as
  Flower's MOON baseline does. The reference codes differ there only for a client that first
  joins after round 1: the official MOON code (Li et al., CVPR 2021) then uses the client's
  untrained local network (its own random initialisation, kept in the pool of all parties'
  networks) as the negative, and the FedSOL code (Lee et al., CVPR 2024) the initial global
  model w_0; both are a real negative with a non-zero gradient, so such a client's first update
  differs from fl-drift's. In round 1 all three agree: the official MOON code has no negative
  yet (the loss is zero) and in the FedSOL code the negative w_0 equals the positive w_t (a
  constant log 2).

Summary: client + μ model-contrastive loss | server - | client state previous local model |
server state - | traffic -
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clients.base import DriftClient
from tasks.datasets import input_shape
from tasks.keys import Key, non_negative, positive
from tasks.models import cached_model, get_weights, set_weights

STATE = "moon-prev"


def moon_contrastive(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """Batch mean of -log softmax([sim(z, z_g), sim(z, z_p)] / T)[0]."""
    pos = F.cosine_similarity(z, z_glob, dim=1)
    neg = F.cosine_similarity(z, z_prev, dim=1)
    logits = torch.stack([pos, neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class MoonClient(DriftClient):
    # A local step's cost relative to one SGD step, three forward passes, one backward; read by the
    # run-time estimate of `run_simulation.py --check` (fl_app/tooling/estimate.py).
    STEP_COST = 1.5
    CONFIG_KEYS = {  # mu: default 1 (the MOON paper's range 1-5); temperature 0.5
        "moon-mu": Key(1.0, non_negative, ">= 0"),
        "moon-temperature": Key(0.5, positive, "> 0"),
    }

    def begin_round(self, server_round: int):
        self.global_model = self.frozen_copy()
        saved = self.load_state(STATE)
        self.prev_model = None
        if saved is not None:
            prev = cached_model(self.cfg["model"], input_shape(self.cfg["dataset"]), self.device, slot="moon-prev")
            set_weights(prev, saved)
            prev.eval()
            for p in prev.parameters():
                p.requires_grad_(False)
            self.prev_model = prev
        return None

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.model.body(x)
        ce = F.cross_entropy(self.model.head(z), y)
        if self.prev_model is None:
            return ce
        with torch.no_grad():
            z_glob = self.global_model.body(x)
            z_prev = self.prev_model.body(x)
        con = moon_contrastive(z, z_glob, z_prev, self.cfg["moon-temperature"])
        return ce + self.cfg["moon-mu"] * con

    def end_round(self, steps: int):
        self.save_state(STATE, get_weights(self.model))
        return None
