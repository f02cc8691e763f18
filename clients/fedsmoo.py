"""FedSMOO: FedDyn's dynamic regulariser plus SAM whose perturbation is pulled towards one
global perturbation s through a per-client dual variable μ_i (Sun, Shen, Chen, Ding, Tao,
ICML 2023).

The paper: "Dynamic Regularized Sharpness Aware Minimization in Federated Learning: Approaching
Global Consistency and Smooth Landscape". α is the FedDyn coefficient (the paper's 1/β), ρ the
SAM radius, f the plain mini-batch cross-entropy; norms are over the whole trainable parameter
vector.

- Client state (in `context.state`, zeros at first, never reset): h_i, the running sum of the
  client's own updates (FedDyn's g_k = −α h_i), and μ_i. Two model-sized arrays per client.
- Server → client: the model, then s (one array per trainable parameter in state_dict order,
  zeros in round 1), as SCAFFOLD's c travels.
- Client, every step on batch b:

  ```
  g  = ∇f(w; b)
  v  = g − μ_i − s;          ŝ = ρ v / (‖v‖ + 1e-12)
  μ_i ← μ_i + (ŝ − s)
  g̃  = ∇f(w + ŝ; b)                       (same batch, weights restored by copy)
  d  = g̃ + α (h_i − w_t)                  (optionally clipped to norm smoo-clip-norm)
  gradient handed to the optimiser:  d + α w  =  g̃ + α (w − w_t + h_i)
  ```

  The run's weight decay is added as usual (α w is not added a second time as decay); momentum,
  if any, acts on this gradient.
- Client, after the K steps: h_i ← h_i + (w_K − w_t); s̃_i = μ_i − ŝ_last (μ_i after its last
  update). Client → server: w_K, then s̃_i (one array per trainable parameter).
- Server (`strategies/fedsmoo.py`), over the clients that replied, with H (zeros at first):

  ```
  H       ← H + (1/N) Σ_{i∈S_t} (w_i − w_t)
  w_{t+1} = (1/|S_t|) Σ_{i∈S_t} w_i + H
  s       = ρ Σ_i s̃_i / ‖Σ_i s̃_i‖          (s = 0 when the sum is 0)
  ```

  This is the FedDyn server (H = −h / α) written without dividing by α, so α = 0 is allowed.
- Keys: `smoo-rho` ρ (0.1, ≥ 0), `smoo-alpha` α (0.1, ≥ 0; the paper uses 0.01 for
  CIFAR-100), `smoo-s` (`paper` | `code` | `none`, default `paper`), `smoo-clip-norm` (0 = off).
- Options: `smoo-s = "paper"` is the algorithm above. `"code"` follows the authors' code
  (FL-Simulator): the client replies μ_i instead of s̃_i and the server sets
  s = ρ · mean_i μ_i / ‖mean_i μ_i‖. `"none"` holds s and μ_i at zero (the client replies zeros):
  plain SAM inside FedDyn. The authors' code also clips d at norm 10 (`smoo-clip-norm = 10`);
  the default leaves it off.
- Reused, not rewritten: SAM's ascent step is `tasks.functional.core.sam_eps`, the dynamic
  regulariser is FedDyn's (its begin and end; h_i is kept as FedDyn's g_k = −α h_i in
  `context.state`: α h_i is all the local step uses), the transport of s is the control-variate
  one; the whole local update is `tasks.functional.sharpness.FEDSMOO`.
- Reductions: ρ = 0 gives exactly the FedDyn client and server (for α > 0); α = 0 with
  `smoo-s = "none"` gives exactly the FedSAM client's local update (the server still adds H, so
  the global model differs from FedSAM's from round 2 on; both reductions are tested in
  `tests/test_fedsmoo.py`).
- Metrics: server `smoo_s_norm` (‖s‖) and `smoo_H_norm` (‖H‖ over the trainable entries); fit
  metrics `smoo_mu_norm` (‖μ_i‖) and `feddyn_grad_norm` (the norm of the FedDyn client's state,
  as for `feddyn`).
- Readings: the means are unweighted, as in FedDyn.

Summary: client SAM towards global s + FedDyn term | server FedDyn server + s | client state
h_i, μ_i | server state H, s | traffic s down, s̃_i up
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from clients.base import FunctionalRound
from clients.control_variates import arrays_to_tensors, split_received
from clients.feddyn import FedDynClient
from clients.fedsam import FedSAMClient
from protocol.keys import Key, non_negative
from protocol.layout import cv_names_in_state_order, trainable_param_names
from tasks.functional import RoundResult
from tasks.functional.sharpness import FEDSMOO, smoo_buffers, smoo_outputs

MU_STATE = "smoo-mu"


class FedSMOOClient(FedDynClient, FedSAMClient):
    """``tasks.functional.sharpness.FEDSMOO``: s arrives after the weights (``receive``), mu_i
    starts the round in the buffers (``prepare_functional``), h_i is kept as FedDyn's g_k and
    mu_i in ``context.state``, stil_i (or mu_i, or zeros) goes back after the weights."""

    LOCAL_UPDATE = FEDSMOO
    # smoo-rho, smoo-alpha and smoo-s, read by the server too, sit on FedSMOOStrategy; this dict
    # hides FedSAM's sam-rho, which FEDSMOO does not read (it reads smoo-rho)
    CONFIG_KEYS = {"smoo-clip-norm": Key(0.0, non_negative, ">= 0 (local gradient clipping norm; 0 = off)")}

    def _setup(self) -> None:
        """The trainable parameters in state_dict order: the order s and the reply travel in,
        which must also be the order of ``model.parameters()`` (true for every module without shared
        or frozen parameters)."""
        self.mode = self.cfg["smoo-s"]
        self.s_names = cv_names_in_state_order(self.model, trainable_param_names(self.model, self.cfg))
        named = dict(self.model.named_parameters())
        self.s_params = [named[n] for n in self.s_names]
        if [id(p) for p in self.s_params] != [id(p) for p in self.model.parameters()]:
            raise ValueError("FedSMOO needs every model parameter trainable and in state_dict order")

    def _zeros(self) -> list[torch.Tensor]:
        return [torch.zeros_like(p, memory_format=torch.contiguous_format).detach() for p in self.s_params]

    # ------------------------------------------------------- s, mu_i and the reply
    def receive(self, parameters: list[np.ndarray]) -> list[np.ndarray]:
        weights, extra = split_received(self.model, super().receive(parameters))
        self._setup()
        self.s = arrays_to_tensors(extra, self.s_names, self.s_params, "s") if extra else self._zeros()
        self.extra_reply: list[torch.Tensor] | None = None
        return weights

    def prepare_functional(self, parameters: list[np.ndarray], config: dict) -> FunctionalRound:
        """``DriftClient``'s round, its buffers carrying mu_i from ``context.state`` (zeros at
        first, and always under ``smoo-s = "none"``) and a zero shat."""
        job = super().prepare_functional(parameters, config)
        stored = self.load_state(MU_STATE) if self.mode != "none" else None
        mu = (arrays_to_tensors(stored, self.s_names, self.s_params, "stored mu_i")
              if stored is not None else self._zeros())
        return dataclasses.replace(job, buffers=smoo_buffers(job.buffers, dict(zip(self.s_names, mu))))

    def functional_inputs(self) -> tuple[dict, dict]:
        return self._stored(), {"s": dict(zip(self.s_names, self.s))}

    def functional_outputs(self, result: RoundResult) -> dict[str, Any]:
        """g_k (FedDyn's), mu_i kept; the reply noted; ``smoo_mu_norm``."""
        super().functional_outputs(result)
        mu, reply, metrics = smoo_outputs(result.buffers, self.mode)
        self.extra_reply = [reply[n] for n in self.s_names]
        if self.mode != "none":
            self.save_state(MU_STATE, [mu[n].cpu().numpy() for n in self.s_names])
        return {k: float(v) for k, v in metrics.items()}

    def reply(self) -> list[np.ndarray]:
        if self.extra_reply is None:
            raise RuntimeError("reply() before the round: the FedSMOO reply is not computed")
        return super().reply() + [a.cpu().numpy() for a in self.extra_reply]
