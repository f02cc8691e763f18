"""FedBN: batch-normalisation layers stay local, everything else is averaged (Li et al., ICLR
2021).

Every entry of the state that belongs to a BatchNorm module (weight, bias, running_mean,
running_var, num_batches_tracked) is kept in ``context.state`` after each round. On the
next round the received BN entries are ignored and replaced by the client's own, so the
client's BN state is its own across rounds. The reply is the full state (same array count
and shapes as sent), carrying the local BN values; the server discards them.
"""

from __future__ import annotations

import numpy as np

from clients.base import DriftClient
from tasks.layout import bn_indices
from tasks.models import get_weights

STATE = "fedbn-bn"


class FedBNClient(DriftClient):
    def receive(self, parameters: list[np.ndarray]) -> list[np.ndarray]:
        local = self.load_state(STATE)
        if local is None:  # first round on this client: start from what was sent
            return parameters
        merged = list(parameters)
        for i, arr in zip(bn_indices(self.model), local):
            merged[i] = arr
        return merged

    def end_round(self, steps: int):
        weights = get_weights(self.model)
        self.save_state(STATE, [weights[i] for i in bn_indices(self.model)])
        return None
