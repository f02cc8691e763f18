"""FedBN: batch-normalisation layers stay local, everything else is averaged (Li et al., ICLR 2021).

- Client: plain local SGD. Every state entry of a BatchNorm module (weight, bias, running mean,
  running variance, batch counter `num_batches_tracked`) is kept in `context.state` after the
  round; in the next round the client ignores the received BN entries and replaces them with its
  own, so its BN state is its own across rounds. The reply carries the full model (same array
  count and shapes as sent), with the local BN values, which the server discards.
- Server (`strategies/fedbn.py`): the weighted mean of the non-BN entries. The BN entries of the
  model it sends never change (they stay at their initial values), so no client's BN state
  reaches another client; a client sampled for the first time starts from the initial BN.
- Server evaluation needs some BN state: it uses the weighted mean of the round's client BN
  entries, for evaluation only (never sent).
- State: BN entries per client. Keys: none of its own.
- Needs a model with BatchNorm (`cnn-bn`, `lenet-bn`, `resnet18-bn`): a model without BN,
  `cnn` included, is refused before training with a message naming its BN twin, never swapped
  silently, so a comparison that says "the same model" ran the same model. Set the twin for
  FedBN alone, e.g. `model = "cnn-bn"` in an experiment file's `[methods.fedbn]`.

Summary: client own BN entries | server BN entries not averaged | client state BN entries |
server state - | traffic -
"""

from __future__ import annotations

import numpy as np

from clients.base import DriftClient
from protocol.layout import bn_indices
from tasks.functional import RoundResult
from tasks.functional.corrections import FEDBN
from tasks.models import get_weights

STATE = "fedbn-bn"


class FedBNClient(DriftClient):
    """Local SGD with cross-entropy, FedAvg's step (``tasks.functional.corrections.FEDBN``); the
    client's own BN entries replace the received ones before the round (``receive``) and are
    stored after it (``functional_outputs``). Neither is the local update's: its ``begin`` may
    not change the starting weights and its ``end`` does not see the buffers (BN statistics),
    so a cohort path must start each client from ``receive``'s weights and store its BN entries
    as ``functional_outputs`` does."""

    LOCAL_UPDATE = FEDBN

    def receive(self, parameters: list[np.ndarray]) -> list[np.ndarray]:
        local = self.load_state(STATE)
        if local is None:  # first round on this client: start from what was sent
            return parameters
        merged = list(parameters)
        for i, arr in zip(bn_indices(self.model), local):
            merged[i] = arr
        return merged

    def functional_outputs(self, result: RoundResult) -> None:
        """Keep the BN entries of the trained model (``result`` is loaded into it already)."""
        weights = get_weights(self.model)
        self.save_state(STATE, [weights[i] for i in bn_indices(self.model)])
