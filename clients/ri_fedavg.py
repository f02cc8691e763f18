"""RI-FedAvg: a proximal term scaled by the roughness of the client's loss landscape
(Partohaghighi, Marcia, West, Chen, arXiv 2026).

Once per round, before local training, the client measures the Roughness Index I_k of its
local loss around the received w_t (``tasks.roughness``), reports it as the fit metric
``ri``, and then trains on F_k(w) + lambda * I_k * ||w - w_t||^2, i.e. every SGD step uses
grad l(w; b) + 2 * lambda * I_k * (w - w_t) (Eqs. 10-11).

Choices where the paper leaves room: the index is measured on one fixed
sample of ``ri-samples`` local examples (a seeded subset, the same for every evaluation,
so the total variation measures the landscape, not sampling noise); the sample is drawn
once per (seed, partition) so the index's evolution over rounds reflects the model only.
The M directions are seeded per (seed, partition, round): runs are reproducible. Model in
eval mode and no grad for the evaluations; I_k is clipped to [0, ri-max] (Assumption 5).
``ri-float64`` (default off, the paper's setting) evaluates the losses in float64: at
l = 0.01 the loss changes along a unit direction of a large model are near float32
rounding, and a float32 index then partly measures rounding noise.

Server: plain FedAvg (n_k-weighted mean, Algorithm 1; ``DriftFedAvg``). The recorder writes
the clients' ``ri`` as ``ri_mean/ri_min/ri_max`` per round.
"""

from __future__ import annotations

import torch

from clients.base import DriftClient
from tasks.keys import Key, at_least, non_negative, positive
from tasks.roughness import model_roughness

_DIRECTIONS_STREAM = 0x52  # separates the direction seed from the batch-order seed
_SAMPLE_STREAM = 0x53


def _seed(*parts: int) -> int:
    return hash(tuple(int(p) for p in parts)) & 0x7FFFFFFF


class RIFedAvgClient(DriftClient):
    """Local SGD with the roughness-scaled proximal term 2 * lambda * I_k * (w - w_t)."""

    # A local step's cost relative to one SGD step, the roughness index's loss evaluations; read by the
    # run-time estimate of `run_simulation.py --check` (fl_app/tooling/estimate.py).
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

    def begin_round(self, server_round: int) -> dict:
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
        return {"ri": self.ri}

    def adjust_gradients(self) -> None:
        self.add_proximal_gradient(2 * self.cfg["ri-lambda"] * self.ri)
