"""RI-FedAvg: a proximal term scaled by the roughness of the client's loss landscape
(Partohaghighi, Marcia, West, Chen, arXiv 2026).

- Client, once per round before training, measures the Roughness Index I_k of its loss around
  w_t on a fixed sample of its data (`tasks.roughness`):
  1. draw M directions d_i ~ N(0, I) over all trainable parameters and scale each to unit
     norm over the whole parameter vector;
  2. evaluate f_i(s_j) = F_k(w_t + s_j d_i) at s_j = −l + j · 2l/m, j = 0..m (m + 1 points);
  3. TV_i = Σ_j |f_i(s_{j+1}) − f_i(s_j)|, A_i = max_j f_i − min_j f_i,
     T_i = TV_i / (2l · max(A_i, 1e-12)), so a flat profile gives T_i = 0;
  4. I_k = std_i(T_i) / mean_i(T_i) (population standard deviation), clipped to [0, I_max]
     (the paper's Assumption 5; I_k = 0 when every T_i is 0).

  Then it trains on F_k(w) + λ I_k ‖w − w_t‖², that is d = g + 2 λ I_k (w − w_t) (Eqs. 10-11),
  with I_k fixed for the round.
- Server: the weighted mean (Algorithm 1; `DriftFedAvg`).
- State: none. What travels: I_k as the fit metric `ri` (`ri_mean/_min/_max` in `metrics.csv`;
  `run_simulation.py` draws `roughness.png`).
- Keys: `ri-lambda` λ (0.1, ≥ 0), `ri-directions` M (10), `ri-interval` l (0.01, > 0),
  `ri-points` m (19), `ri-max` I_max (10.0), `ri-samples` (128: the size of the fixed sample),
  `ri-chunk` (−1: perturbed models per batched `vmap` call; −1 = 1 on CPU, 20 on CUDA; 0 = all
  at once; 1 = one at a time without `vmap`), `ri-float64` (false, the paper's setting).
- Readings: the paper does not say on which data the index is measured. Here it is one fixed,
  seeded sample of `ri-samples` local examples, drawn once per (`seed`, partition) and used for
  every evaluation, so the total variation measures the landscape rather than batch-sampling
  noise and the index's evolution over rounds reflects the model only. The directions are seeded
  per (`seed`, partition, round), so runs are reproducible. The model is in eval mode, without
  gradients, for the evaluations. At l = 0.01 the loss changes along a unit direction of a large
  model are close to float32 rounding, so a float32 index partly measures rounding noise;
  `ri-float64 = true` evaluates the losses in float64 (the index then comes out close to 0, and
  the method close to FedAvg). The cost is M (m + 1) forward passes on the sample per client per
  round.

Summary: client + 2λ I_k (w − w_t) | server - | client state - | server state - | traffic I_k as
a fit metric
"""

from __future__ import annotations

import torch

from clients.base import DriftClient
from protocol.keys import Key, at_least, non_negative, positive
from tasks.functional.corrections import RI_FEDAVG
from tasks.roughness import model_roughness

_DIRECTIONS_STREAM = 0x52  # separates the direction seed from the batch-order seed
_SAMPLE_STREAM = 0x53


def _seed(*parts: int) -> int:
    return hash(tuple(int(p) for p in parts)) & 0x7FFFFFFF


class RIFedAvgClient(DriftClient):
    """Local SGD with the roughness-scaled proximal term 2 * lambda * I_k * (w - w_t):
    ``tasks.functional.corrections.RI_FEDAVG``, with I_k measured here before the round
    (``roughness_index``) and passed in as its ``state["ri"]``."""

    LOCAL_UPDATE = RI_FEDAVG

    # A local step's cost relative to one SGD step, the roughness index's loss evaluations; read by the
    # run-time estimate of `run_simulation.py --check` (runner/estimate.py).
    STEP_COST = 1.3

    CONFIG_KEYS = {  # defaults as in the paper's Sec. V-A
        "ri-lambda": Key(0.1, non_negative, ">= 0 (regularisation strength lambda)"),
        "ri-directions": Key(10, at_least(1), ">= 1 (random directions M)"),
        "ri-interval": Key(0.01, positive, "> 0 (half-width l of the interval [-l, l])"),
        "ri-points": Key(19, at_least(1), ">= 1 (m: the grid has m+1 points)"),
        "ri-max": Key(10.0, non_negative, ">= 0 (clip I_max)"),
        "ri-samples": Key(128, at_least(1), ">= 1 (local examples the index is measured on)"),
        "ri-chunk": Key(-1, lambda v: v >= -1, ">= -1 (perturbed models per vmap call; -1 = auto: 1 on CPU,"
                        " where vmap over convolutions is ~4x slower, 20 on CUDA; 0 = all; 1 = no vmap)"),
        "ri-float64": Key(False),  # evaluate the index's losses in float64 (see above)
    }

    ri: float = 0.0

    def ri_sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed sample the index is measured on: ``ri-samples`` seeded local examples."""
        x, y = self.data
        size = min(self.cfg["ri-samples"], len(x))
        generator = torch.Generator().manual_seed(
            _seed(self.cfg["seed"], self.partition_id, _SAMPLE_STREAM)
        )
        idx = torch.randperm(len(x), generator=generator)[:size].to(x.device)
        return x[idx], y[idx]

    def ri_chunk(self) -> int:
        """``ri-chunk``, with -1 (auto) resolved per device: on CPU vmap turns the convolutions
        into grouped ones (measured ~4x slower than the plain loop, docs/performance.md); on
        CUDA batching the evaluations pays."""
        chunk = self.cfg["ri-chunk"]
        if chunk < 0:
            return 1 if self.device.type == "cpu" else 20
        return chunk

    def roughness_index(self, server_round: int) -> float:
        """I_k of the loss around the model's current weights (w_t), on ``ri_sample`` along the
        round's seeded directions; kept as ``self.ri`` (and the per-direction T_i as ``ri_values``)."""
        x, y = self.ri_sample()
        generator = torch.Generator().manual_seed(
            _seed(self.cfg["seed"], self.partition_id, server_round, _DIRECTIONS_STREAM)
        )
        self.ri_values, self.ri = model_roughness(
            self.model, x, y,
            num_directions=self.cfg["ri-directions"], l=self.cfg["ri-interval"],
            m=self.cfg["ri-points"], i_max=self.cfg["ri-max"], generator=generator,
            chunk=self.ri_chunk(),
            dtype=torch.float64 if self.cfg["ri-float64"] else None,
            # on CPU the forwards run at the training batch size (cache-sized activations)
            batch_size=self.cfg["batch-size"] if self.device.type == "cpu" else 0,
        )
        return self.ri

    def functional_inputs(self) -> tuple[dict, dict]:
        """{"ri": I_k} measured at w_t (the model holds the received weights here); nothing
        from the server besides the weights."""
        return {"ri": self.roughness_index(int(self.fit_config.get("server-round", 1)))}, {}
