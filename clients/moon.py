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

import numpy as np
import torch

from clients.base import DriftClient
from protocol.keys import Key, non_negative, positive
from tasks.functional import RoundResult
from tasks.functional.distillation import MOON, moon_contrastive

__all__ = ["STATE", "MoonClient", "moon_contrastive"]

STATE = "moon-prev"


class MoonClient(DriftClient):
    """The round is ``tasks.functional.distillation.MOON``. The previous local model is kept in
    ``context.state`` under ``STATE`` as the model's state arrays (``get_weights`` order)."""

    LOCAL_UPDATE = MOON
    # A local step's cost relative to one SGD step, three forward passes, one backward; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 1.5
    CONFIG_KEYS = {  # mu: default 1 (the MOON paper's range 1-5); temperature 0.5
        "moon-mu": Key(1.0, non_negative, ">= 0"),
        "moon-temperature": Key(0.5, positive, "> 0"),
    }

    def functional_inputs(self) -> tuple[dict, dict]:
        """state: the previous local model (``prev_params``, ``prev_buffers``), none the first time
        this client is sampled; server: the global model's buffers as sent."""
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        saved = self.load_state(STATE)
        if saved is None:
            return {}, {"buffers": buffers}
        state_dict = self.model.state_dict()
        shapes = [tuple(t.shape) for t in state_dict.values()]
        if [tuple(np.shape(a)) for a in saved] != shapes:
            raise ValueError(f"stored {STATE!r} does not fit the model: {len(saved)} arrays for {len(shapes)} state "
                             "entries, or a shape differs")
        # each tensor in the layout of the model's own (a channels-last weight stays so: same kernels)
        prev = {n: torch.empty_like(ref).copy_(torch.as_tensor(np.asarray(a)))
                for (n, ref), a in zip(state_dict.items(), saved)}
        params = {n for n, _ in self.model.named_parameters()}
        return ({"prev_params": {n: t for n, t in prev.items() if n in params},
                 "prev_buffers": {n: t for n, t in prev.items() if n not in params}},
                {"buffers": buffers})

    def functional_outputs(self, result: RoundResult) -> None:
        """Keep the round's final model (weights ``result.state["prev_params"]`` and the final
        buffers) as the next round's previous model."""
        final = {**result.state["prev_params"], **result.buffers}
        self.save_state(STATE, [final[n].detach().to("cpu", copy=True, memory_format=torch.contiguous_format).numpy()
                                for n in self.model.state_dict()])
